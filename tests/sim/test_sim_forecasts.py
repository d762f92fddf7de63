"""Idle forecasts in the simulated snapshot, and spot jobs that declare a minimum lease.

The simulated scheduler sees what the agents would publish in ``spotgpu.io/idle-forecast`` (the
state machine's forecast as of each lent owner's last poll); trimmed snapshots decide exactly as
full ones with forecasts and ``minLease`` jobs (the node kinds carry the lent GPUs' forecast
buckets, computed per cycle); no ``minLease`` job lands on a lent GPU whose forecast does not
cover its lease; job streams declare ``minLease`` by rule.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from spotgpu.core.configfile import ConfigError
from spotgpu.core.lending import LendState, node_forecasts
from spotgpu.scheduler import CycleResult, SchedulerConfig, Snapshot
from spotgpu.scheduler.model import IdleForecast
from spotgpu.sim.scenario import build_workload, parse_scenario
from spotgpu.sim.simulation import Simulation, run_policy
from spotgpu.sim.state import Hooks, real_scheduler
from spotgpu.sim.workloads import LeaseRule
from spotgpu.sim.workloads.base import TraceJob

HOUR = 3600.0


def scenario(**extra: Any) -> Any:
    """20 of 24 two-GPU nodes held by owners for 12 hours: developers with short sessions, breaks
    and long breaks, and desk machines with one owner per GPU on a work-day pattern. A light spot
    load of one-GPU pods (few pending pods, so trimming leaves out most nodes of a kind), half of
    the jobs declaring a lease of half their duration; every policy learns forecasts (both lending
    policies, three strategies)."""
    data: dict[str, Any] = {
        "name": "fc",
        "seed": 5,
        "duration": "12h",
        "cluster": {"nodes": 24, "gpusPerNode": 2},
        "checkpointInterval": "20m",
        "owners": [
            {
                "name": "dev",
                "source": "bursty",
                "nodes": 10,
                "gpusPerOwner": 2,
                "bursty": {"kind": "developer", "arrive": "1h", "leave": "10h", "longBreakProbability": 0.5},
            },
            {
                "name": "desk",
                "source": "devmachine",
                "nodes": 10,
                "gpusPerOwner": 1,
                "devmachine": {"arrive": "2h", "leave": "9h"},
            },
        ],
        "spotJobs": [
            {
                "name": "itp",
                "source": "elasticflow",
                "load": 0.15,
                "maxGpus": 2,
                "gpusPerPod": 1,
                "elasticflow": {"clusters": ["cluster04", "cluster07"], "start": "336h"},
                "minLease": {"rule": "duration", "fraction": 0.5, "maximum": "2h", "share": 0.5},
            }
        ],
        "reservedJobs": [
            {"name": "batch", "source": "elasticflow", "load": 0.05, "maxGpus": 2, "elasticflow": {"start": "720h"}}
        ],
        "policies": [
            {"name": "low", "maxInactiveTime": "2m"},
            {
                "name": "auto-pred",
                "maxInactiveTime": "2m",
                "strategy": "auto",
                "lendPolicy": "predictive",
                "predictive": {"minExpectedIdle": "10m", "minLikelyIdle": "0s"},
            },
            {"name": "idle", "maxInactiveTime": "5m", "strategy": "idle"},
        ],
    }
    data.update(extra)
    return parse_scenario(data)


class ForecastCheck:
    """A scheduler hook that checks each snapshot's forecasts against the agents' state, and each
    bind of a lease job onto a lent GPU against the forecast it was placed by."""

    def __init__(self, s: Any, policy: Any) -> None:
        self.sim = Simulation(s, build_workload(s), policy, Hooks(scheduler=self.cycle))
        self.forecasts = self.lease_binds = self.lease_binds_lent = 0

    def published(self, node: str, now: float) -> dict[Any, IdleForecast]:
        """What the node's agents publish: each lent owner's forecast as of its last poll."""
        sim = self.sim
        out: dict[Any, IdleForecast] = {}
        for gpu in sim.world.nodes_by_name[node].gpus:
            owner = gpu.owner_sim
            if owner is None or owner.agent is None or owner.agent.state.state is not LendState.LENT:
                continue
            state = owner.agent.state
            assert state.lent_at is not None
            d = sim.lat.detect_interval
            last = owner.poll_phase + math.floor((now - owner.poll_phase) / d + 1e-9) * d
            f = node_forecasts([state], max(state.lent_at, last), sim.rules)[gpu.id]
            out[gpu.id] = IdleForecast(f.expected, f.p20)
        return out

    def cycle(self, snapshot: Snapshot, config: SchedulerConfig, now: float) -> CycleResult:
        for node in snapshot.nodes:
            assert dict(node.idle_forecast) == self.published(node.name, now), (node.name, now)
            self.forecasts += len(node.idle_forecast)
        result = real_scheduler(snapshot, config, now)
        groups = {g.ref.name: g for g in snapshot.groups}
        pods = {p.ref: p for p in snapshot.pods}
        gpus = {g.id: g for n in self.sim.world.nodes for g in n.gpus}
        forecast = {d: f for n in snapshot.nodes for d, f in n.idle_forecast.items()}
        for bind in result.binds:
            group = groups[pods[bind.pod].group]
            if not bind.spot or not group.min_lease:
                continue
            self.lease_binds += 1
            for device in bind.devices:
                if gpus[device].owner_sim is not None:  # a lent owner's GPU
                    assert forecast[device].p20 >= group.min_lease, (bind, forecast.get(device))
                    self.lease_binds_lent += 1
        return result


def test_the_scheduler_sees_the_published_forecasts_and_min_leases_are_covered() -> None:
    s = scenario()
    lent_binds = 0
    for policy in s.policies:
        check = ForecastCheck(s, policy)
        check.sim.run()
        assert check.forecasts > 0 and check.lease_binds > 0, policy.name
        lent_binds += check.lease_binds_lent
    assert lent_binds > 0  # lease jobs did run on lent GPUs, where the forecast covered them


@pytest.mark.parametrize(("seed", "checkpoint"), [(2, "20m"), (5, "20m"), (2, "45m")])
def test_trimmed_snapshots_decide_like_full_ones_with_forecasts_and_min_leases(seed: int, checkpoint: str) -> None:
    """Without the forecast buckets in the node kinds, or without the leases each lent GPU
    covers, trimmed runs of this scenario decide otherwise (checked when this test was written);
    with a checkpoint interval between two bucket bounds (45 min), also without the wants each
    lent GPU covers (the ``auto`` policy's covering try compares them with the exact ``p20``)."""
    s = scenario(seed=seed, checkpointInterval=checkpoint)
    workload = build_workload(s)
    assert any(j.min_lease > 0 for j in workload.jobs) and any(j.spot and not j.min_lease for j in workload.jobs)
    for policy in s.policies:
        trimmed = run_policy(s, workload, policy, Hooks(trim_snapshots=True, cap_pending=False))
        full = run_policy(s, workload, policy, Hooks(trim_snapshots=False))
        assert trimmed.summary == {**full.summary, "invariant_checks": trimmed.summary["invariant_checks"]}, policy
        assert trimmed.metrics.cycles.snapshot_nodes < full.metrics.cycles.snapshot_nodes
        assert full.summary["loans"] > 0


def test_job_streams_declare_min_leases_by_rule() -> None:
    job = TraceJob("x:1", 0.0, 4 * HOUR, 1)
    assert LeaseRule().assign(job) == 0
    assert LeaseRule(rule="fixed", fixed=1800.0).assign(job) == 1800  # type: ignore[arg-type]
    assert LeaseRule(rule="duration", fraction=0.25).assign(job) == HOUR
    assert LeaseRule(rule="duration", fraction=1, maximum=2 * HOUR).assign(job) == 2 * HOUR  # type: ignore[arg-type]
    assert LeaseRule(rule="duration", fraction=0.01, minimum=600.0).assign(job) == 600  # type: ignore[arg-type]
    assert LeaseRule(rule="fixed", fixed=60.0).assign(TraceJob("x:2", 0.0, 1.0, 1, min_lease=5.0)) == 5  # type: ignore[arg-type]
    half = LeaseRule(rule="fixed", fixed=60.0, share=0.5)  # type: ignore[arg-type]
    declared = [half.assign(TraceJob(f"x:{i}", 0.0, 10.0, 1)) for i in range(400)]
    assert 150 < sum(1 for d in declared if d) < 250
    assert declared == [half.assign(TraceJob(f"x:{i}", 0.0, 10.0, 1)) for i in range(400)]  # stable
    s = scenario()
    specs = build_workload(s).jobs
    leased = [j for j in specs if j.min_lease]
    assert leased and all(j.spot for j in leased)
    assert all(j.min_lease == min(2 * HOUR, 0.5 * j.duration) for j in leased)
    assert len(leased) < len([j for j in specs if j.spot])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"minLease": {"rule": "sometimes"}}, r"spotJobs\[0\]\.minLease\.rule"),
        ({"minLease": {"rule": "duration", "fraction": 0}}, r"spotJobs\[0\]\.minLease.*fraction"),
        ({"minLease": {"minimum": "2h", "maximum": "1h"}}, r"spotJobs\[0\]\.minLease.*maximum"),
        ({"minLease": {"share": 2}}, r"spotJobs\[0\]\.minLease.*share"),
    ],
)
def test_bad_min_lease_rules_name_their_key(change: dict[str, Any], message: str) -> None:
    data = {"name": "s", "source": "inline", "inline": {"jobs": [{"arrival": 0, "duration": 60, "gpus": 1}]}}
    with pytest.raises(ConfigError, match=message):
        parse_scenario({"spotJobs": [{**data, **change}]})


def test_reserved_streams_declare_no_min_lease_and_inline_jobs_may() -> None:
    jobs = {"jobs": [{"arrival": 0, "duration": 60, "gpus": 1, "minLease": "5m"}]}
    with pytest.raises(ConfigError, match=r"reservedJobs\[0\]\.minLease: reserved jobs declare no minimum lease"):
        parse_scenario({"reservedJobs": [{"name": "r", "source": "inline", "inline": jobs, "minLease": {}}]})
    s = parse_scenario({"spotJobs": [{"name": "s", "source": "inline", "inline": jobs}]})
    assert [j.min_lease for j in build_workload(s).jobs] == [300.0]
