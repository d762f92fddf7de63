"""``spotgpu bench scheduler`` through the real CLI at a small size: one JSON object with the named figures.

Speed targets are not asserted here (they belong to the benchmark); this checks the command
works, its figures are consistent, and the synthetic cluster is deterministic and valid.
"""

from __future__ import annotations

import json

import pytest

from spotgpu.bench.scheduler import PREEMPTOR, synthetic_snapshot, with_preemptor
from spotgpu.cli import main
from spotgpu.scheduler import run_cycle, select_victims


def test_bench_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "scheduler", "--nodes", "40", "--gpus-per-node", "8", "--pending-pods", "80"]
    args += ["--running-spot-pods", "120", "--seed", "3", "--victim-repeats", "5", "--json"]
    assert main(args) == 0
    figures = json.loads(capsys.readouterr().out)
    for key in ("pods_placed", "cycle_seconds", "pods_per_second", "victim_selection_ms_p99", "peak_rss_mb"):
        assert key in figures
    assert 0 < figures["pods_placed"] <= 80
    assert figures["pods_placed"] == figures["reserved_pods_placed"] + figures["spot_pods_placed"]
    assert figures["running_spot_pods"] == 120
    assert figures["victim_selection_possible"] is True and figures["victim_gangs"] >= 1
    assert figures["pods_per_second"] == pytest.approx(figures["pods_placed"] / figures["cycle_seconds"], rel=0.02)
    assert figures["targets"]["at_target_shape"] is False


def test_bad_arguments_exit_with_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "scheduler", "--nodes", "0", "--json"]) == 2
    assert "--nodes is out of range" in capsys.readouterr().err


def test_synthetic_cluster_is_deterministic_and_valid() -> None:
    a = synthetic_snapshot(30, 4, 50, 60, seed=7)
    assert a == synthetic_snapshot(30, 4, 50, 60, seed=7)
    assert a != synthetic_snapshot(30, 4, 50, 60, seed=8)
    result = run_cycle(a, now=1_700_000_000.0)  # valid: no SnapshotError
    assert result.binds
    plan = select_victims(with_preemptor(a, 4), PREEMPTOR, now=1_700_000_000.0)
    assert plan.possible


def test_shadow_reuse_shares_shadowpods_between_gangs_and_keeps_other_draws() -> None:
    """``--shadow-reuse 1``: every pool node's ShadowPods are one, shared by several gangs and holding
    an idle GPU; placements, pending pods and the reserved owners are the same as without it."""
    now = 1_700_000_000.0
    plain = synthetic_snapshot(30, 8, 50, 60, seed=7)
    shared = synthetic_snapshot(30, 8, 50, 60, seed=7, shadow_reuse=1.0)
    assert shared.pods == plain.pods and shared.groups == plain.groups
    assert len({s.node for s in shared.shadows}) == len(shared.shadows) < len(plain.shadows)
    users = {d: p.group for p in shared.pods if p.node is not None for d in p.devices}
    multi = [s for s in shared.shadows if len({users[d] for d in s.devices if d in users}) > 1]
    assert multi, "some ShadowPod is shared by several gangs"
    assert all(any(d not in users for d in s.devices) for s in multi), "each holds an idle GPU"
    run_cycle(shared, now=now)  # valid: no SnapshotError
    plan = select_victims(with_preemptor(shared, 8), PREEMPTOR, now=now)
    assert plan.possible
    freed = {d for n in plan.nominations for d in n.devices}
    evicted = {e.pod for e in plan.evictions}
    for s in shared.shadows:  # a nominated GPU's ShadowPod loses every user
        if freed.intersection(s.devices):
            assert all(p.ref in evicted for p in shared.pods if p.node is not None and set(p.devices) & set(s.devices))


def test_shadow_reuse_out_of_range_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "scheduler", "--shadow-reuse", "1.5", "--json"]) == 2
    assert "--shadow-reuse must be between 0 and 1" in capsys.readouterr().err
