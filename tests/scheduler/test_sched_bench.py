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
