"""The solver on in-memory fakes of every port: lending, eviction, races, recovery, failures.

No real GPU, kubelet, containerd or API server here (other test modules cover those wire
protocols); the fakes implement the agent's Protocols and record every call.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

from spotgpu.core import keys
from spotgpu.core.config import LendingConfig, UnguardedPolicy
from spotgpu.core.lending import LendState
from spotgpu.core.refs import PodRef
from spotgpu.core.types import EvictionReason, Health
from spotgpu.testing.fakes import FakeGuard

from .helpers import NODE, OWNER, Rig, cri_labels, gpu_alloc, make_rig, pod


def healthy(rig: Rig) -> set[str]:
    return {d for d, h in rig.agent.solver.state().health.items() if h is Health.HEALTHY}


def lend(rig: Rig) -> None:
    """Owner idle for maxInactiveTime -> lent."""
    rig.cycle(0)
    rig.cycle(61)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.LENT


def test_new_owner_is_active_and_unallocated_gpus_are_lendable(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    assert rig.agent.solver.state().lend_states == {OWNER: LendState.ACTIVE}
    assert healthy(rig) == {rig.d[2], rig.d[3]}
    state = json.loads(rig.kube.node_annotations[NODE][keys.NODE_SPOT_GPU_STATE])
    assert state[rig.d[0]] == {"owner": "dev/devbox/main", "state": "active", "health": "Unhealthy", "users": 0}
    assert state[rig.d[2]]["state"] == "unallocated" and state[rig.d[2]]["health"] == "Healthy"


def test_idle_owner_is_lent_after_max_inactive_time_guard_armed_first(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.backend.util[rig.d[0]] = 35.0
    rig.cycle(0)
    rig.cycle(100)  # active: utilization
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE
    rig.backend.util[rig.d[0]] = 0.0
    rig.cycle(30)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE
    rig.cycle(31)  # 61 s without activity
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.LENT
    assert rig.guard.calls == [("arm", OWNER)]
    assert healthy(rig) == set(rig.d)
    state = json.loads(rig.kube.node_annotations[NODE][keys.NODE_SPOT_GPU_STATE])
    assert state[rig.d[0]]["state"] == "idle" and state[rig.d[0]]["health"] == "Healthy"
    assert rig.agent.metrics.sample("spotgpu_agent_owners", {"state": "lent"}) == 1


def test_owner_process_keeps_it_active(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.backend.run(rig.d[1], 555)
    rig.attributor.owner_of[555] = "owner-cid"
    rig.cycle(0)
    rig.cycle(120)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE


def test_while_lent_utilization_is_ignored_but_owner_process_evicts(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    lend(rig)
    spot = rig.add_spot("job-0", [rig.d[0]], "spot-cid-0")
    rig.backend.util[rig.d[0]] = 99.0  # the spot job's load
    rig.backend.run(rig.d[0], 777)
    rig.attributor.owner_of[777] = "spot-cid-0"
    rig.cycle(10)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.LENT
    assert rig.tasks.running() >= {"spot-cid-0"}
    # the owner starts a process on its GPU: evicted on this poll
    rig.backend.run(rig.d[1], 888)
    rig.attributor.owner_of[888] = "owner-cid"
    rig.cycle(10)
    assert "spot-cid-0" not in rig.tasks.running()
    assert rig.kube.deleted() == [spot]
    assert rig.kube.deletes[0].reason is EvictionReason.OWNER_BACK
    assert rig.guard.calls[-1] == ("disarm", OWNER)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE
    assert healthy(rig) == {rig.d[2], rig.d[3]}
    m = rig.agent.metrics
    assert m.sample("spotgpu_agent_evictions_total", {"reason": "OwnerBack", "namespace": "spot"}) == 1
    assert m.sample("spotgpu_agent_eviction_seconds_count", {"reason": "OwnerBack"}) == 1


def test_guard_signal_evicts_at_once_in_order(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    lend(rig)
    a = rig.add_spot("job-a", [rig.d[0]], "cid-a")
    b = rig.add_spot("job-b", [rig.d[1]], "cid-b", namespace="team2")
    other = rig.add_spot("job-c", [rig.d[2]], "cid-c")  # on an unallocated GPU: untouched
    rig.cycle(1)
    order: list[str] = []
    real_stop, real_delete, real_disarm = rig.tasks.stop_tasks, rig.kube.delete_pod, rig.guard.disarm
    rig.tasks.stop_tasks = lambda ids, **kw: (order.append("stop"), real_stop(ids, **kw))[1]  # type: ignore[method-assign]
    rig.kube.delete_pod = lambda p, **kw: (order.append("delete"), real_delete(p, **kw))[1]  # type: ignore[method-assign]
    rig.guard.disarm = lambda o: (order.append("disarm"), real_disarm(o))[1]  # type: ignore[method-assign]
    rig.guard.owner_back(OWNER)  # no clock advance: no poll involved
    # released as soon as the GPUs are clean; the API bookkeeping follows
    assert order == ["stop", "disarm", "delete", "delete"]
    assert rig.tasks.stop_calls[-1] == ("cid-a", "cid-b")
    assert set(rig.kube.deleted()) == {a, b}
    assert rig.tasks.running() >= {"cid-c"}
    assert rig.agent.solver.mapping.get_device_users(rig.d[2]) == (other,)
    assert rig.agent.solver.mapping.get_owner_users(OWNER) == ()


def test_guard_signal_and_poll_race_evict_once(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    lend(rig)
    rig.add_spot("job-a", [rig.d[0]], "cid-a")
    rig.cycle(1)
    rig.backend.run(rig.d[0], 888)
    rig.attributor.owner_of[888] = "owner-cid"
    barrier = threading.Barrier(2)

    def guard() -> None:
        barrier.wait()
        rig.guard.owner_back(OWNER)

    def poll() -> None:
        barrier.wait()
        rig.agent.detect_once(reconcile=False)

    threads = [threading.Thread(target=guard), threading.Thread(target=poll)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(rig.tasks.stop_calls) == 1
    assert len(rig.kube.deletes) == 1
    assert rig.agent.metrics.sample("spotgpu_agent_evictions_total", {"reason": "OwnerBack", "namespace": "spot"}) == 1


def test_guard_signal_when_not_lent_releases_the_call(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.guard.owner_back(OWNER)
    assert rig.guard.calls == [("disarm", OWNER)]
    assert rig.tasks.stop_calls == []


def test_arm_failure_means_no_lending(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.guard.fail_arm = True
    rig.cycle(0)
    rig.cycle(61)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE
    assert rig.d[0] not in healthy(rig)
    rig.guard.fail_arm = False
    rig.cycle(61)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.LENT


def test_guard_unavailable_still_lends_with_polling(tmp_path: Path) -> None:
    """Only with the explicit poll-only policy (the default refuses: test_unguarded.py)."""
    rig = make_rig(
        tmp_path, guard=FakeGuard(available=False), lending=LendingConfig(unguarded_policy=UnguardedPolicy.POLL_ONLY)
    )
    lend(rig)
    assert rig.guard.calls == []


def test_failed_measurements_never_lend(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.backend.fail_processes = True
    rig.cycle(0)
    rig.cycle(200)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE
    assert rig.agent.metrics.sample("spotgpu_agent_detector_errors_total", {"kind": "processes"}) == 2


def test_pod_delete_temporary_failures_are_retried(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    lend(rig)
    spot = rig.add_spot("job-a", [rig.d[0]], "cid-a")
    rig.cycle(1)
    rig.kube.fail_deletes = 2
    rig.guard.owner_back(OWNER)
    assert rig.kube.deleted() == [spot]
    assert rig.guard.calls[-1] == ("disarm", OWNER)


def test_pod_delete_outage_releases_owner_and_retries_later(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.agent.solver.settings = dataclasses.replace(rig.agent.solver.settings, delete_budget=0.05)
    lend(rig)
    spot = rig.add_spot("job-a", [rig.d[0]], "cid-a")
    rig.cycle(1)
    rig.kube.fail_deletes = 10_000
    outcome = rig.agent.solver.owner_back(OWNER)
    assert outcome is not None and outcome.undeleted_pods == (spot,)
    assert "cid-a" not in rig.tasks.running()
    assert rig.guard.calls[-1] == ("disarm", OWNER)
    rig.kube.fail_deletes = 0
    rig.cycle(10)  # the refresh retries the pending deletion
    assert rig.kube.deleted() == [spot]


def test_reserved_pod_taking_a_lent_unallocated_gpu_evicts_its_spot_users(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    spot = rig.add_spot("job-x", [rig.d[3]], "cid-x")
    rig.cycle(1)
    assert rig.tasks.running() >= {"cid-x"}
    new_owner = PodRef("dev", "trainer")
    rig.add_pod(pod(new_owner, (("main", "trainer-cid"),)))
    rig.allocations.append(gpu_alloc(new_owner.container("main"), [rig.d[3]]))
    rig.podres.set(rig.allocations)
    rig.cycle(1)
    assert "cid-x" not in rig.tasks.running()
    assert rig.kube.deletes[-1].pod == spot and rig.kube.deletes[-1].reason is EvictionReason.RESERVED_PREEMPT


def test_failed_gpu_evicts_with_device_unhealthy(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.add_spot("job-x", [rig.d[3]], "cid-x")
    rig.cycle(1)
    rig.backend.set_healthy(rig.d[3], False)
    rig.cycle(1)
    assert "cid-x" not in rig.tasks.running()
    assert rig.kube.deletes[-1].reason is EvictionReason.DEVICE_UNHEALTHY
    assert rig.d[3] not in healthy(rig)


def test_recovery_takes_owners_with_spot_users_as_lent(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, start=False)
    rig.add_spot("job-a", [rig.d[0]], "cid-a")
    rig.agent.start(serve_metrics=False, loops=False)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.LENT
    assert rig.guard.is_armed(OWNER)
    assert rig.tasks.running() >= {"cid-a"}
    assert rig.kube.deletes == []


def test_recovery_evicts_when_the_owner_came_back_while_the_agent_was_down(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, start=False)
    spot = rig.add_spot("job-a", [rig.d[0]], "cid-a")
    rig.backend.run(rig.d[0], 888)
    rig.attributor.owner_of[888] = "owner-cid"
    rig.agent.start(serve_metrics=False, loops=False)
    assert "cid-a" not in rig.tasks.running()
    assert rig.kube.deleted() == [spot]
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE
    assert not rig.guard.is_armed(OWNER)


def test_recovery_finishes_deletions_under_way(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, start=False)
    ref = PodRef("spot", "half-evicted")
    rig.kube.add_pod(pod(ref, (("worker", "cid-h"),), deleting=True))
    rig.tasks.add("cid-h", cri_labels(ref, "worker"))
    rig.agent.start(serve_metrics=False, loops=False)
    assert "cid-h" not in rig.tasks.running()


def test_recovery_with_guard_arm_failure_evicts_with_reason_recovery(tmp_path: Path) -> None:
    guard = FakeGuard()
    guard.fail_arm = True
    rig = make_rig(tmp_path, start=False, guard=guard)
    spot = rig.add_spot("job-a", [rig.d[0]], "cid-a")
    rig.agent.start(serve_metrics=False, loops=False)
    assert rig.kube.deleted() == [spot]
    assert rig.kube.deletes[0].reason is EvictionReason.RECOVERY


def test_owner_pod_gone_returns_its_gpus_to_idle_space(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    lend(rig)
    rig.remove_pod(OWNER.pod_ref)
    rig.cycle(1)
    assert OWNER not in rig.agent.solver.state().lend_states
    assert rig.guard.calls[-1] == ("disarm", OWNER)
    assert healthy(rig) == set(rig.d)


def test_lent_gpu_seconds_are_counted(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    lend(rig)
    rig.add_spot("job-a", [rig.d[0]], "cid-a")
    rig.cycle(10)
    rig.cycle(10)
    m = rig.agent.metrics
    lent = m.sample("spotgpu_agent_lent_gpu_seconds_total")
    assert lent is not None and lent >= 2 * 20  # two GPUs lent for at least 20 s
    used = m.sample("spotgpu_agent_spot_gpu_seconds_total")
    assert used is not None and used >= 10
