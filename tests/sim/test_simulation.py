"""End-to-end scenarios through the real scheduler and lending code, checked against numbers
computed by hand from the model's rules (docs/simulator.md) and the configured latencies."""

from __future__ import annotations

import math
from typing import Any

import pytest

from spotgpu.sim import defaults
from spotgpu.sim.metrics import percentile
from spotgpu.sim.model import Category
from spotgpu.sim.scenario import Scenario, build_workload, parse_scenario
from spotgpu.sim.simulation import Simulation
from spotgpu.sim.state import Hooks

HOUR = 3600.0
SIGNAL, KILL, RELEASE = 46e-6, 8e-3, 46e-6
LATENCIES: dict[str, Any] = {
    "guardSignal": "46us",
    "killFirstTask": "8ms",
    "killExtraTask": "1ms",
    "guardRelease": "46us",
    "spotStart": 0,
    "reservedStart": 0,
    "gangTeardown": "1s",
    "shadowRelease": "1s",
    "requeueDelay": 0,
}
"""Explicit, round latencies: the figures below are computed by hand from these, whatever the
defaults (which follow the benchmarks, spotgpu.sim.defaults) become."""


def scenario(**data: Any) -> Scenario:
    base: dict[str, Any] = {"name": "t", "seed": 5, "checkpointInterval": "30m"}
    base.update(data)
    base["latencies"] = {**LATENCIES, **data.get("latencies", {})}
    return parse_scenario(base)


def run(s: Scenario, policy: str, hooks: Hooks | None = None) -> tuple[Simulation, dict[str, Any]]:
    sim = Simulation(s, build_workload(s), next(p for p in s.policies if p.name == policy), hooks)
    result = sim.run()
    return sim, result.summary


def gpu_hours(sim: Simulation, category: Category) -> float:
    return sim.metrics.time.gpu_seconds[category] / HOUR


OWNER_BACK = {
    "duration": "5h",
    "cluster": {"nodes": 1, "gpusPerNode": 8},
    "owners": [
        {
            "name": "dev",
            "source": "inline",
            "nodes": 1,
            "gpusPerOwner": 8,
            "inline": {"owners": [{"active": [{"start": "0s", "end": "1h"}, {"start": "3h", "end": "4h"}]}]},
        }
    ],
    "spotJobs": [
        {
            "name": "train",
            "source": "inline",
            "inline": {"jobs": [{"arrival": "0s", "duration": "4h", "gpus": 8, "priority": "spotmid"}]},
        }
    ],
    "policies": [
        {"name": "baseline", "lending": False, "strategy": "idle"},
        {"name": "lend", "maxInactiveTime": "10m", "strategy": "lowpower"},
    ],
}


def test_owner_back_by_hand() -> None:
    """An 8-GPU dev machine, busy 0-1 h and 3-4 h; one 8-GPU spot job of 4 h; 30 min checkpoints.

    With the owner's poll phase p (detectInterval 10 s): the last poll seeing it busy is p+3590,
    so it is lent at p+4190 (10 min later) and the job starts then. The owner comes back at
    3 h: the guard signals after 46 us, the kill takes 8 ms, the call is released 46 us later
    (hold 8.092 ms); the job loses the work since its last checkpoint (3 x 30 min kept). The
    owner stops at 4 h, is lent again at p+14990, and the job runs to the end (5 h).
    """
    s = scenario(**OWNER_BACK)
    sim, summary = run(s, "lend")
    p = sim.owners[0].poll_phase
    assert 0 <= p < 10
    lent1, back, lent2, end = p + 4190, 3 * HOUR, p + 14990, 5 * HOUR
    killed = back + SIGNAL + KILL
    first_run = killed - lent1
    saved = math.floor(first_run / 1800) * 1800
    assert saved == 5400
    job = sim.jobs[0]
    assert job.first_start == pytest.approx(lent1, abs=1e-6)
    assert job.started_at == pytest.approx(lent2, abs=1e-6)
    assert job.remaining == pytest.approx(4 * HOUR - saved)
    assert summary["loans"] == 2
    assert summary["evictions"] == {"OwnerBack": 1}
    assert summary["evicted_pods"] == 1
    assert summary["owner_returns_while_lent"] == 1 and summary["owner_returns_with_eviction"] == 1
    assert (
        summary["owner_hold_ms_p50"] == summary["owner_hold_ms_max"] == pytest.approx((SIGNAL + KILL + RELEASE) * 1000)
    )
    assert summary["spot_jobs_started"] == 1 and summary["spot_jobs_completed"] == 0
    assert summary["spot_wait_s_p50"] == pytest.approx(lent1, abs=1e-3)
    assert summary["reclaimed_gpu_hours"] == pytest.approx(8 * ((back - lent1) + (end - lent2)) / HOUR, abs=1e-5)
    assert gpu_hours(sim, Category.SPOT_EXPOSED) == pytest.approx(8 * (SIGNAL + KILL) / HOUR, rel=1e-6)
    assert summary["useful_spot_gpu_hours"] == pytest.approx(8 * (saved + end - lent2) / HOUR, abs=1e-5)
    assert summary["wasted_spot_gpu_hours"] == pytest.approx(8 * (first_run - saved) / HOUR, abs=1e-5)
    assert summary["checkpointed_spot_gpu_hours"] == pytest.approx(8 * saved / HOUR)
    assert summary["lent_gpu_hours"] == pytest.approx(8 * ((back + SIGNAL - lent1) + (end - lent2)) / HOUR, abs=1e-5)
    owner_busy = gpu_hours(sim, Category.OWNER_ACTIVE) + gpu_hours(sim, Category.SPOT_EXPOSED)
    assert owner_busy == pytest.approx(16.0)
    busy = 16.0 + summary["spot_gpu_hours"]
    assert summary["gpu_busy_rate"] == pytest.approx(busy / 40.0, abs=1e-5)


def test_owner_back_baseline_lends_nothing() -> None:
    sim, summary = run(scenario(**OWNER_BACK), "baseline")
    assert summary["loans"] == 0
    assert summary["spot_gpu_hours"] == 0.0 and summary["reclaimed_gpu_hours"] == 0.0
    assert summary["spot_jobs_started"] == 0 and summary["spot_jobs_pending_at_end"] == 1
    assert summary["owner_hold_ms_max"] == 0.0
    assert gpu_hours(sim, Category.OWNER_IDLE) == pytest.approx(24.0)
    assert summary["gpu_allocation_rate"] == 1.0  # the owner holds every GPU all the time
    assert summary["gpu_busy_rate"] == pytest.approx(16.0 / 40.0)


def test_owner_back_without_the_guard_shares_until_the_next_poll() -> None:
    data = dict(OWNER_BACK)
    data["policies"] = [{"name": "polling", "maxInactiveTime": "10m", "guard": False}]
    sim, summary = run(scenario(**data), "polling")
    p = sim.owners[0].poll_phase
    poll = p + 10800  # the first poll at or after 3 h
    exposed = poll + KILL - 3 * HOUR
    assert summary["owner_hold_ms_max"] == 0.0
    assert summary["owner_exposures"] == 1
    assert summary["owner_exposed_ms_max"] == pytest.approx(exposed * 1000, abs=1e-3)
    assert gpu_hours(sim, Category.SPOT_EXPOSED) == pytest.approx(8 * exposed / HOUR, rel=1e-6)


RESERVED_PREEMPT = {
    "duration": "4h",
    "cluster": {"nodes": 1, "gpusPerNode": 8},
    "spotJobs": [
        {
            "name": "batch",
            "source": "inline",
            "inline": {"jobs": [{"arrival": "0s", "duration": "2h", "gpus": 8, "priority": "spotlow"}]},
        }
    ],
    "reservedJobs": [
        {"name": "prod", "source": "inline", "inline": {"jobs": [{"arrival": "30m", "duration": "1h", "gpus": 8}]}}
    ],
    "policies": [{"name": "baseline", "lending": False, "strategy": "idle"}],
}


def test_reserved_preempts_spot_by_hand() -> None:
    """One unallocated 8-GPU node. A 2 h spot job starts at 0 through a ShadowPod; a 1 h reserved
    job arrives at 30 min and preempts it (the 30 min checkpoint keeps all of its work). The
    victim's pods go away 1 s later (gang teardown); the next cycle (30:01) deletes the now
    unused ShadowPod, which frees the GPUs 1 s later (30:02), when the reserved job binds. The
    spot job, requeued at 30:01, restarts when the reserved job ends (1:30:02) and finishes its
    remaining 1:30 at 3:00:02. Its idle ShadowPod (older than 60 s) is collected at once."""
    sim, summary = run(scenario(**RESERVED_PREEMPT), "baseline")
    spot, reserved = sorted(sim.jobs, key=lambda j: j.spot)[::-1]
    assert summary["evictions"] == {"ReservedPreempt": 1}
    assert reserved.first_start == pytest.approx(1802.0)
    assert reserved.done_at == pytest.approx(5402.0)
    assert summary["reserved_wait_s_p50"] == pytest.approx(2.0)
    assert spot.started_at == pytest.approx(5402.0)
    assert spot.done_at == pytest.approx(10802.0)
    assert summary["spot_jobs_completed"] == 1
    assert summary["spot_jct_s_p50"] == pytest.approx(10802.0)
    assert summary["spot_wait_s_p50"] == 0.0
    assert summary["useful_spot_gpu_hours"] == pytest.approx(16.0)
    assert summary["wasted_spot_gpu_hours"] == 0.0
    assert summary["checkpointed_spot_gpu_hours"] == pytest.approx(4.0)
    assert summary["spot_unallocated_gpu_hours"] == pytest.approx(16.0)
    assert summary["reclaimed_gpu_hours"] == 0.0
    assert gpu_hours(sim, Category.RESERVED) == pytest.approx(8.0)
    assert not sim.shadows, "the ShadowPod was collected"
    assert sum(summary["gpu_hours_by_category"].values()) == pytest.approx(32.0)


def test_reserved_preempt_without_checkpoints_wastes_the_work() -> None:
    data = dict(RESERVED_PREEMPT, checkpointInterval=0)
    sim, summary = run(scenario(**data), "baseline")
    assert summary["wasted_spot_gpu_hours"] == pytest.approx(8 * 0.5)
    spot = next(j for j in sim.jobs if j.spot)
    assert spot.done_at == pytest.approx(5402.0 + 2 * HOUR)
    assert summary["useful_spot_gpu_hours"] == pytest.approx(16.0)


def test_default_latencies_reach_the_model() -> None:
    """Without a ``latencies`` section the benchmark tables apply, drawn per event from the run's
    seeded generator: the spot job starts within the measured start-up range after it is bound,
    and the owner's hold on return (signal + the kill of one task + release; one pod: one task)
    lies within the tables' range and is not simply their medians' sum."""
    data = {k: v for k, v in OWNER_BACK.items() if k != "latencies"}
    s = parse_scenario({"name": "t", "seed": 5, "checkpointInterval": "30m", **data})
    lat = s.latencies
    assert lat.kill_first_task.median + 7 * lat.kill_extra_task.median == pytest.approx(5.24e-3, abs=1e-5)
    assert lat.kill_upper(8) == pytest.approx(11.97e-3, abs=2e-5)  # the fit to node-e2e's 8-container p99
    sim, summary = run(s, "lend")
    p = sim.owners[0].poll_phase
    job = sim.jobs[0]
    lo, hi = lat.spot_start.at(0.0), lat.spot_start.upper
    assert lo == pytest.approx(defaults.SPOT_START.quantiles_ms[0][1] / 1000)
    assert p + 4190 + lo - 1e-9 <= job.first_start <= p + 4190 + hi + 1e-9  # lent, bound, started
    assert p + 14990 + lo - 1e-9 <= job.started_at <= p + 14990 + hi + 1e-9  # again after the return
    low = lat.guard_signal.at(0.0) + lat.kill_first_task.at(0.0) + lat.guard_release.at(0.0)
    high = lat.guard_signal.upper + lat.kill_first_task.upper + lat.guard_release.upper
    assert low * 1000 - 1e-6 <= summary["owner_hold_ms_max"] <= high * 1000 + 1e-6
    again = run(s, "lend")[1]
    assert again == summary  # same seed, same draws


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 99) == 0.0
    assert percentile([5.0], 50) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([float(i) for i in range(101)], 99) == pytest.approx(99.0)


def test_waits_count_unstarted_jobs_censored_at_the_end() -> None:
    """Two 8-GPU spot jobs on one unallocated 8-GPU node: the first runs the whole 5 h, the second
    (arrived at 1 h) never starts. Its wait is censored at the end: 4 h, counted in the wait
    percentiles and in ``spot_wait_censored``; the started-only figures leave it out."""
    jobs = [
        {"arrival": "0s", "duration": "10h", "gpus": 8, "priority": "spotmid"},
        {"arrival": "1h", "duration": "1h", "gpus": 8, "priority": "spotmid"},
    ]
    s = scenario(
        duration="5h",
        cluster={"nodes": 1, "gpusPerNode": 8},
        spotJobs=[{"name": "q", "source": "inline", "inline": {"jobs": jobs}}],
        policies=[{"name": "baseline", "lending": False, "strategy": "idle"}],
    )
    sim, summary = run(s, "baseline")
    first = sim.jobs[0].first_start
    assert first is not None and first < 10 and sim.jobs[1].first_start is None
    assert summary["spot_wait_censored"] == 1
    assert summary["spot_wait_started_s_p50"] == summary["spot_wait_started_s_p99"] == pytest.approx(first, abs=1e-3)
    censored = 4 * HOUR
    assert summary["spot_wait_s_p50"] == pytest.approx((first + censored) / 2, abs=1e-3)
    assert summary["spot_wait_s_p99"] == pytest.approx(first + 0.99 * (censored - first), abs=1e-3)
    assert summary["reserved_wait_censored"] == 0
