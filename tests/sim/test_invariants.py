"""The invariant checker catches broken promises when faults are injected, and fails the run loudly.

Faults come in through the simulation's hooks, as they would from a buggy scheduler or agent:
a scheduler that returns an illegal decision, an agent that forgets a victim. The real decision
code runs underneath; only the faulty layer is ours.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from spotgpu.agent.model import EvictionPlan
from spotgpu.core.ids import SPOT_GPU_RESOURCE, DeviceID
from spotgpu.core.mapping_cache import MappingSnapshot
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import EvictionReason
from spotgpu.scheduler.config import SchedulerConfig
from spotgpu.scheduler.decisions import Bind, CycleResult, DeviceOwner, Evict
from spotgpu.scheduler.model import Snapshot
from spotgpu.sim.invariants import InvariantViolation
from spotgpu.sim.runner import simulate
from spotgpu.sim.scenario import Scenario, build_workload, parse_scenario
from spotgpu.sim.simulation import Simulation
from spotgpu.sim.state import Hooks, agent_eviction_plan, real_scheduler


def scenario(
    owners: list[dict[str, Any]],
    spot: list[dict[str, Any]],
    reserved: list[dict[str, Any]] | None = None,
    nodes: int = 2,
) -> Scenario:
    return parse_scenario(
        {
            "name": "inj",
            "duration": "3h",
            "cluster": {"nodes": nodes, "gpusPerNode": 8},
            "owners": owners,
            "spotJobs": [{"name": "s", "source": "inline", "inline": {"jobs": spot}}],
            "reservedJobs": [{"name": "r", "source": "inline", "inline": {"jobs": reserved or []}}],
            "policies": [{"name": "lend", "maxInactiveTime": "5m"}],
        }
    )


DEV_BUSY_FIRST_HOUR = [
    {
        "name": "dev",
        "source": "inline",
        "nodes": 1,
        "gpusPerOwner": 8,
        "inline": {"owners": [{"active": [{"start": "0s", "end": "1h"}, {"start": "2h", "end": "3h"}]}]},
    }
]


def run(s: Scenario, **hooks: Any) -> Simulation:
    sim = Simulation(s, build_workload(s), s.policies[0], Hooks(**hooks))
    sim.run()
    return sim


def _pending_spot_pods(snapshot: Snapshot) -> list[Any]:
    return [p for p in snapshot.pods if p.node is None and p.request.is_spot]


def _inject(
    fault: Callable[[Snapshot, CycleResult], CycleResult],
) -> Callable[[Snapshot, SchedulerConfig, float], CycleResult]:
    done = []

    def scheduler(snapshot: Snapshot, config: SchedulerConfig, now: float) -> CycleResult:
        result = real_scheduler(snapshot, config, now)
        if not done:
            changed = fault(snapshot, result)
            if changed is not result:
                done.append(True)
            return changed
        return result

    return scheduler


def test_a_spot_bind_on_an_active_owners_gpu_fails_the_run() -> None:
    s = scenario(DEV_BUSY_FIRST_HOUR, [{"arrival": "0s", "duration": "1h", "gpus": 1}])

    def bind_on_owner(snapshot: Snapshot, result: CycleResult) -> CycleResult:
        pending = _pending_spot_pods(snapshot)
        owned = [
            (n, g) for n in snapshot.nodes for g in n.gpus if g.owner is not None and g.owner.namespace == "owners"
        ]
        if not pending or not owned:
            return result
        node, gpu = owned[0]
        assert gpu.owner is not None
        pod = pending[0]
        bind = Bind(
            pod.ref, pod.group_ref, node.name, SPOT_GPU_RESOURCE, (gpu.id,), owners=(DeviceOwner(gpu.id, gpu.owner),)
        )
        return dataclasses.replace(result, binds=(bind,))

    with pytest.raises(
        InvariantViolation,
        match=r"policy lend, t=0\.000000s\): spot pod spot/s-00000-0-0 on GPU GPU-00000-0 .*"
        r"twin is Unhealthy, owner owners/dev-00000/main is active",
    ):
        run(s, scheduler=_inject(bind_on_owner), trim_snapshots=False)


def test_a_double_booked_gpu_fails_the_run() -> None:
    s = scenario([], [{"arrival": "0s", "duration": "1h", "gpus": 1}, {"arrival": "0s", "duration": "1h", "gpus": 1}])

    def double_book(snapshot: Snapshot, result: CycleResult) -> CycleResult:
        if len(result.binds) < 2:
            return result
        first, second = result.binds[0], result.binds[1]
        twin = dataclasses.replace(second, node=first.node, devices=first.devices, owners=first.owners)
        return dataclasses.replace(result, binds=(first, twin))

    with pytest.raises(InvariantViolation, match=r"exclusive spot on a GPU already used by \['spot/s-0000[01]-0-0'\]"):
        run(s, scheduler=_inject(double_book))


def test_a_reserved_pod_given_a_spot_users_gpu_fails_the_run() -> None:
    s = scenario(
        [],
        [{"arrival": "0s", "duration": "2h", "gpus": 16}],
        reserved=[{"arrival": "30m", "duration": "1h", "gpus": 8}],
    )

    def bind_reserved_over_spot(snapshot: Snapshot, result: CycleResult) -> CycleResult:
        pending = [p for p in snapshot.pods if p.node is None and not p.request.is_spot]
        placed = [p for p in snapshot.pods if p.node is not None and p.request.is_spot]
        if not pending or not placed:
            return result
        pod, victim = pending[0], placed[0]
        assert victim.node is not None
        bind = Bind(pod.ref, pod.group_ref, victim.node, pod.request.resource, victim.devices)
        return CycleResult(binds=(bind,))

    with pytest.raises(
        InvariantViolation,
        match=r"is double-booked: held by spotgpu-system/s-00000-shadow-.*, now reserved pod reserved/r-00000-0-0",
    ):
        run(s, scheduler=_inject(bind_reserved_over_spot))


def test_evicting_reserved_work_fails_the_run() -> None:
    s = scenario(
        [], [{"arrival": "10m", "duration": "1h", "gpus": 1}], reserved=[{"arrival": "0s", "duration": "2h", "gpus": 8}]
    )

    def evict_reserved(snapshot: Snapshot, result: CycleResult) -> CycleResult:
        placed = [p for p in snapshot.pods if p.node is not None and not p.request.is_spot]
        if not placed:
            return result
        pod = placed[0]
        evict = Evict(pod.ref, pod.group_ref, pod.node, pod.devices, EvictionReason.RESERVED_PREEMPT, "injected")
        return dataclasses.replace(result, evictions=(evict,))

    with pytest.raises(
        InvariantViolation, match=r"reserved pod reserved/r-00000-0-0 was evicted; only spot work may be"
    ):
        run(s, scheduler=_inject(evict_reserved), trim_snapshots=False)


def test_an_agent_that_forgets_a_victim_breaks_the_owners_hold_bound() -> None:
    s = scenario(DEV_BUSY_FIRST_HOUR, [{"arrival": "0s", "duration": "3h", "gpus": 8}], nodes=1)

    def forgetful(
        snapshot: MappingSnapshot, owner: ContainerRef, devices: Sequence[DeviceID], at: float
    ) -> EvictionPlan:
        plan = agent_eviction_plan(snapshot, owner, devices, at)
        assert plan.victims, "the scenario must have a spot user on the owner's GPUs when it returns"
        return dataclasses.replace(plan, victims=())

    with pytest.raises(
        InvariantViolation,
        match=r"policy lend, t=7200\.0\d+s\): owner owners/dev-00000/main has been back for \d+\.\d+ ms "
        r"and still shares "
        r"its GPUs with spot pods \['spot/s-00000-0-0'\], beyond the modelled hold",
    ):
        run(s, plan_eviction=forgetful)


def test_the_same_run_without_faults_passes_every_check() -> None:
    s = scenario(DEV_BUSY_FIRST_HOUR, [{"arrival": "0s", "duration": "3h", "gpus": 8}], nodes=1)
    sim = run(s)
    assert sim.checker.checks > 5
    assert sim.metrics.returns.evictions == {"OwnerBack": 1}


def test_the_audit_catches_a_model_that_contradicts_itself() -> None:
    s = scenario(DEV_BUSY_FIRST_HOUR, [{"arrival": "0s", "duration": "3h", "gpus": 8}], nodes=1)
    sim = Simulation(s, build_workload(s), s.policies[0])

    def corrupt(snapshot: Snapshot, config: SchedulerConfig, now: float) -> CycleResult:
        result = real_scheduler(snapshot, config, now)
        if result.binds:
            # A stray pod appears on a GPU behind the scheduler's back.
            gpu = sim.nodes[0].gpus[3]
            stray = next(iter(sim.pods.values()))
            gpu.users.append(stray)
        return result

    sim.hooks = Hooks(scheduler=corrupt)
    with pytest.raises(
        InvariantViolation, match=r"GPU GPU-00000-3 lists spot pod spot/s-00000-0-0, which no longer exists"
    ):
        sim.run()


def test_an_unknown_pod_in_a_decision_fails_the_run() -> None:
    s = scenario([], [{"arrival": "0s", "duration": "1h", "gpus": 1}])

    def ghost(snapshot: Snapshot, result: CycleResult) -> CycleResult:
        if not result.binds:
            return result
        bind = dataclasses.replace(result.binds[0], pod=PodRef("spot", "ghost"))
        return dataclasses.replace(result, binds=(bind,))

    with pytest.raises(InvariantViolation, match=r"bind of spot/ghost, which is not a pending pod"):
        run(s, scheduler=_inject(ghost))


def test_a_violation_in_a_worker_process_reaches_the_caller() -> None:
    s = scenario(DEV_BUSY_FIRST_HOUR, [{"arrival": "0s", "duration": "3h", "gpus": 8}], nodes=1)
    s = dataclasses.replace(s, policies=(dataclasses.replace(s.policies[0], name="other"), *s.policies))

    def forgetful(
        snapshot: MappingSnapshot, owner: ContainerRef, devices: Sequence[DeviceID], at: float
    ) -> EvictionPlan:
        return dataclasses.replace(agent_eviction_plan(snapshot, owner, devices, at), victims=())

    with pytest.raises(InvariantViolation, match="beyond the modelled hold"):
        simulate(s, workers=2, hooks=Hooks(plan_eviction=forgetful))
