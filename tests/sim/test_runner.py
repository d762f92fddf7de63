"""Several policies on one workload: determinism, the summary's keys, accounting identities,
trimmed snapshots, the report files and the ``spotgpu simulate`` command."""

from __future__ import annotations

import io
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotgpu.cli import main
from spotgpu.core.types import NodeStrategy
from spotgpu.scheduler import CycleResult, SchedulerConfig, Snapshot, VictimScale, demand
from spotgpu.scheduler.state import ClusterState
from spotgpu.sim.page import render_html
from spotgpu.sim.progress import Progress
from spotgpu.sim.report import write_outputs
from spotgpu.sim.runner import simulate
from spotgpu.sim.scenario import build_workload, default_scenario
from spotgpu.sim.simulation import Simulation, run_policy
from spotgpu.sim.state import Hooks, real_scheduler
from spotgpu.sim.table import summary_table

REQUIRED_POLICY_KEYS = {
    "name",
    "reclaimed_gpu_hours",
    "wasted_spot_gpu_hours",
    "evictions",
    "owner_hold_ms_p99",
    "spot_jobs_completed",
}


@pytest.fixture(scope="module")
def small() -> Any:
    """The default scenario on 16 nodes for 12 hours (every source and policy, small)."""
    return default_scenario().resized(nodes=16, duration=12 * 3600.0)


@pytest.fixture(scope="module")
def result(small: Any) -> Any:
    return simulate(small, workers=1)


def test_summary_has_the_documented_keys(result: Any) -> None:
    summary = result.summary()
    assert isinstance(summary["wall_seconds"], float)
    assert [p["name"] for p in summary["policies"]] == [p.name for p in result.scenario.policies]
    for entry in summary["policies"]:
        assert set(entry) >= REQUIRED_POLICY_KEYS
    assert {a["license"].split(",")[0] for a in summary["attribution"]} == {
        "repository MIT",
        "MIT",
    }
    json.dumps(summary)  # serialisable as is


def test_accounting_identities_hold_for_every_policy(result: Any) -> None:
    sc = result.workload
    for entry in result.summary()["policies"]:
        by_cat = entry["gpu_hours_by_category"]
        assert sum(by_cat.values()) == pytest.approx(sc["gpus"] * sc["simulated_hours"], rel=1e-6)
        spot = by_cat["spot_unallocated"] + by_cat["spot_lent"] + by_cat["spot_exposed"]
        assert entry["spot_gpu_hours"] == pytest.approx(spot, abs=1e-4)
        assert entry["useful_spot_gpu_hours"] + entry["wasted_spot_gpu_hours"] == pytest.approx(spot, rel=1e-6)
        assert entry["reclaimed_gpu_hours"] <= entry["lent_gpu_hours"] + 1e-6
        assert entry["evictions_total"] == sum(entry["evictions"].values())
        if not entry["lending"]:
            assert entry["reclaimed_gpu_hours"] == 0 and entry["loans"] == 0 and entry["owner_hold_ms_max"] == 0


def test_lending_reclaims_gpu_hours_the_baseline_cannot(result: Any) -> None:
    by_name = {p["name"]: p for p in result.summary()["policies"]}
    base = by_name["baseline"]
    for name in ("lowpower-2m", "lowpower-10m", "lowpower-30m", "idle-10m"):
        assert by_name[name]["reclaimed_gpu_hours"] > 0
        assert by_name[name]["spot_gpu_hours"] > base["spot_gpu_hours"]
        assert by_name[name]["gpu_busy_rate"] > base["gpu_busy_rate"]
    # a longer maxInactiveTime lends less and evicts on return less often
    assert by_name["lowpower-2m"]["loans"] >= by_name["lowpower-30m"]["loans"]


def test_same_seed_same_summary_also_across_worker_processes(small: Any, result: Any) -> None:
    again = simulate(small, workers=2)
    assert again.workers == 2
    assert again.summary()["policies"] == result.summary()["policies"]
    assert again.workload == result.workload


def test_another_seed_gives_another_run(small: Any, result: Any) -> None:
    other = simulate(small.resized(seed=small.seed + 1), small.policies[1:2], workers=1)
    mine = result.summary()["policies"][1]
    assert other.summary()["policies"][0]["name"] == mine["name"]
    assert other.summary()["policies"][0] != mine


def test_trimmed_snapshots_decide_like_full_ones(small: Any) -> None:
    """Leaving out nodes that cannot take part changes no decision (pending gangs all offered);
    also for the recommended policy, whose ``auto`` rule judges the demand cycle-wide."""
    scenario = small.resized(nodes=12, duration=6 * 3600.0)
    workload = build_workload(scenario)
    for policy in (scenario.policies[0], scenario.policies[2], scenario.policies[-1]):
        trimmed = run_policy(scenario, workload, policy, Hooks(trim_snapshots=True, cap_pending=False))
        full = run_policy(scenario, workload, policy, Hooks(trim_snapshots=False))
        assert trimmed.summary == {**full.summary, "invariant_checks": trimmed.summary["invariant_checks"]}
        assert trimmed.metrics.cycles.snapshot_nodes < full.metrics.cycles.snapshot_nodes


def test_trimmed_snapshots_carry_the_cluster_wide_victim_scale(small: Any) -> None:
    """Victim scores are normalised over every running spot gang; a trimmed snapshot leaves some
    out, so it carries the maxima over the whole model (checked here against the model's pods at
    every cycle; without it the default scenario's trimmed runs chose other victims)."""
    scenario = small
    workload = build_workload(scenario)
    policy = scenario.policies[2]
    checked: list[float] = []
    sim: Simulation | None = None

    def scheduler(snapshot: Snapshot, config: SchedulerConfig, now: float) -> CycleResult:
        assert sim is not None
        facts: dict[int, tuple[int, int, float]] = {}
        for pod in sim.pods.values():
            if pod.job.spot and pod.node is not None and not pod.evicting:
                tasks, milli, start = facts.get(pod.job.index, (0, 0, math.inf))
                assert pod.job.bound_at is not None
                facts[pod.job.index] = (tasks + 1, milli + pod.request.gpus * 1000, min(start, pod.job.bound_at))
        expected = VictimScale(
            tasks=max((f[0] for f in facts.values()), default=0),
            milli=max((f[1] for f in facts.values()), default=0),
            earliest_start=min((f[2] for f in facts.values()), default=None),
        )
        assert snapshot.victim_scale == expected, now
        checked.append(now)
        return real_scheduler(snapshot, config, now)

    sim = Simulation(scenario, workload, policy, Hooks(scheduler=scheduler))
    run = sim.run()
    assert len(checked) == run.summary["scheduler_cycles"] > 50
    assert run.summary["evictions"].get("ReservedPreempt", 0) > 0


def test_trimmed_snapshots_carry_the_demand_and_room_they_leave_out(small: Any) -> None:
    """The ``auto`` rule compares the pending demand with the unallocated room cycle-wide; a
    trimmed snapshot leaves pending gangs (not offered) and nodes out, so it carries their part
    (``Snapshot.spot_outside``). Checked at every cycle against the full snapshot of the same
    moment, as the scheduler reads both; without it the rule would judge otherwise in many cycles."""
    scenario = small
    policy = scenario.policies[-1]
    assert policy.recommended and policy.strategy is NodeStrategy.AUTO
    flips: list[float] = []
    sim: Simulation | None = None

    def scheduler(snapshot: Snapshot, config: SchedulerConfig, now: float) -> CycleResult:
        assert sim is not None
        hooks = sim.hooks
        sim.hooks = replace(hooks, trim_snapshots=False)
        full = sim.snapshots.build()
        sim.hooks = hooks
        assert full is not None and snapshot.spot_outside is not None and full.spot_outside is None
        trimmed_state, full_state = ClusterState.build(snapshot, now), ClusterState.build(full, now)
        assert demand.pending(trimmed_state) == demand.pending(full_state), now
        assert demand.room(trimmed_state) == demand.room(full_state), now
        alone = ClusterState.build(replace(snapshot, spot_outside=None), now)
        judged = demand.fits(demand.pending(full_state), demand.room(full_state), None)
        if demand.fits(demand.pending(alone), demand.room(alone), None) != judged:
            flips.append(now)
        for state in (trimmed_state, full_state, alone):
            state.dispose()
        return real_scheduler(snapshot, config, now)

    sim = Simulation(scenario, build_workload(scenario), policy, Hooks(scheduler=scheduler))
    sim.run()
    assert len(flips) > 10


def test_report_files(result: Any, tmp_path: Path) -> None:
    written = write_outputs(result, tmp_path / "out")
    names = sorted(p.name for p in written)
    assert names == sorted(
        [
            "summary.json",
            "report.html",
            "allocation.png",
            "reclaimed.png",
            "evictions.png",
            "spot_cdf.png",
            "owner_hold.png",
        ]
    )
    for png in (tmp_path / "out").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_size > 5000
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["policies"] == result.summary()["policies"]
    page = (tmp_path / "out" / "report.html").read_text()
    for name in ("GPU allocation", "lowpower-10m", "CC BY 4.0", "Copyright (c) Microsoft Corporation", "Hu et al."):
        assert name in page


def test_html_escapes_scenario_text(result: Any) -> None:
    summary = result.summary()
    summary["scenario"] = {**summary["scenario"], "description": "<script>alert(1)</script>"}
    page = render_html(summary)
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_summary_table_lists_every_policy(result: Any) -> None:
    table = summary_table(result.summary())
    lines = table.splitlines()
    assert lines[0].startswith("scenario default: 16 nodes, 128 GPUs")
    assert lines[1].split()[:4] == ["policy", "useful", "gain", "GPU-h"]
    for policy in result.scenario.policies:
        assert any(line.startswith(policy.name + " ") for line in lines)
    assert lines[-1].startswith("wall time")


def test_progress_draws_on_a_terminal_and_prints_deciles_otherwise() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tick = iter(range(1000))
    tty = Tty()
    bar = Progress(["a", "b"], tty, clock=lambda: float(next(tick)))
    bar("a", 0.5)
    bar("b", 1.0)
    assert "\r" in tty.getvalue() and "75%" in tty.getvalue()
    log = io.StringIO()
    bar = Progress(["a"], log, clock=lambda: 0.0)
    for i in range(101):
        bar("a", i / 100)
    lines = log.getvalue().splitlines()
    assert len(lines) == 11 and lines[-1].startswith("simulate [") and "100%" in lines[-1]


def _small_scenario_file(tmp_path: Path, **extra: Any) -> Path:
    data: dict[str, Any] = {
        "name": "cli",
        "duration": "2h",
        "cluster": {"nodes": 2, "gpusPerNode": 8},
        "owners": [
            {
                "name": "dev",
                "source": "devmachine",
                "nodes": 1,
                "gpusPerOwner": 8,
                "devmachine": {"arrive": "0s", "arriveJitter": 0, "leave": "1h", "leaveJitter": 0},
            }
        ],
        "spotJobs": [
            {"name": "s", "source": "inline", "inline": {"jobs": [{"arrival": "1m", "duration": "30m", "gpus": 4}]}}
        ],
        "policies": [{"name": "baseline", "lending": False}, {"name": "lend", "maxInactiveTime": "5m"}],
    }
    data.update(extra)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _small_scenario_file(tmp_path)
    code = main(["simulate", "--scenario", str(path), "--json", "--no-progress", "--workers", "1"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in summary["policies"]] == ["baseline", "lend"]
    assert summary["policies"][0]["spot_jobs_completed"] == 1


def test_cli_table_policy_selection_and_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _small_scenario_file(tmp_path)
    code = main(
        ["simulate", "--scenario", str(path), "--policies", "lend", "--out", str(tmp_path / "o"), "--days", "0.05"]
    )
    assert code == 0
    captured = capsys.readouterr()
    rows = [line.split()[0] for line in captured.out.splitlines() if line.strip()]
    assert "lend" in rows and "baseline" not in rows
    assert (tmp_path / "o" / "report.html").exists()
    assert "simulate [" in captured.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "nope"], "--policies: ['nope'] not in the scenario"),
        (["--scenario", "/nonexistent.yaml"], "cannot read scenario"),
    ],
)
def test_cli_bad_input_exits_2_and_names_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    path = _small_scenario_file(tmp_path)
    code = main(["simulate", "--scenario", str(path), "--no-progress", *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_bad_scenario_key_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _small_scenario_file(tmp_path, cluster={"nodes": 2, "gpusPerNode": 8, "gpuModel": "H100"})
    assert main(["simulate", "--scenario", str(path), "--no-progress"]) == 2
    assert "s.yaml: cluster.gpuModel: unknown key" in capsys.readouterr().err
