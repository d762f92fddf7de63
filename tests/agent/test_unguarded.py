"""Owners the return guard does not cover are not lent (``agent.lending.unguardedPolicy:
refuse``, the default): a metric and a node event say why; a loan whose coverage is lost ends;
``pollOnly`` lends them anyway. In-memory fakes of every port (the guard fake reports coverage
per owner, as the real guard's ``covers`` does from the notify fds it holds)."""

from __future__ import annotations

from pathlib import Path

from spotgpu.core import keys
from spotgpu.core.config import LendingConfig, UnguardedPolicy
from spotgpu.core.lending import LendState
from spotgpu.core.types import EvictionReason, Health
from spotgpu.testing.fakes import FakeGuard, FakeLendStore

from .helpers import NODE, OWNER, Rig, make_rig, pod

POLL_ONLY = LendingConfig(unguarded_policy=UnguardedPolicy.POLL_ONLY)


def uncovered() -> FakeGuard:
    guard = FakeGuard()
    guard.uncovered.add(OWNER)
    return guard


def state(rig: Rig) -> LendState:
    return rig.agent.solver.state().lend_states[OWNER]


def idle_for_long(rig: Rig) -> None:
    rig.cycle(0)
    rig.cycle(61)
    rig.cycle(10)
    rig.cycle(10)


def test_an_uncovered_owner_is_not_lent_and_the_node_says_why_once(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, guard=uncovered())
    idle_for_long(rig)
    assert state(rig) is LendState.ACTIVE
    assert rig.agent.solver.state().health[rig.d[0]] is Health.UNHEALTHY
    assert rig.guard.calls == []  # nothing armed
    m = rig.agent.metrics
    assert m.sample("spotgpu_agent_not_lent_total", {"reason": "unguarded"}) == 1  # once per idle period
    assert m.sample("spotgpu_agent_owners_unguarded") == 1
    ((node, reason, message),) = rig.kube.node_events
    assert (node, reason) == (NODE, "OwnerUnguarded")
    assert OWNER.format() in message and "holds no notify fd" in message and keys.GUARD_SKIPPED in message


def test_coverage_arriving_later_lends_the_owner(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, guard=uncovered())
    idle_for_long(rig)
    rig.guard.uncovered.clear()  # the guard got the owner's notify fd
    rig.cycle(10)
    assert state(rig) is LendState.LENT
    assert rig.guard.calls == [("arm", OWNER)]
    assert rig.agent.metrics.sample("spotgpu_agent_owners_unguarded") == 0


def test_no_guard_on_the_node_and_an_opted_out_owner_are_named_as_such(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, guard=FakeGuard(available=False))
    idle_for_long(rig)
    assert state(rig) is LendState.ACTIVE
    assert "is not available on this node" in rig.kube.node_events[0][2]
    other = make_rig(tmp_path / "b", start=False, guard=uncovered())
    opted = pod(OWNER.pod_ref, (("main", "owner-cid"),), annotations={keys.GUARD: "disabled"})
    other.kube.add_pod(opted)
    other.agent.start(serve_metrics=False, loops=False)
    idle_for_long(other)
    assert state(other) is LendState.ACTIVE
    assert "opted out" in other.kube.node_events[0][2]


def test_poll_only_lends_an_uncovered_owner_and_polling_takes_it_back(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, guard=uncovered(), lending=POLL_ONLY)
    rig.cycle(0)
    rig.cycle(61)
    assert state(rig) is LendState.LENT
    assert rig.agent.metrics.sample("spotgpu_agent_owners_unguarded") == 1
    assert rig.kube.node_events == []
    spot = rig.add_spot("job-a", [rig.d[0]], "cid-a")
    rig.cycle(1)
    rig.backend.run(rig.d[1], 888)
    rig.attributor.owner_of[888] = "owner-cid"
    rig.cycle(10)  # the next poll sees the owner's process
    assert rig.kube.deleted() == [spot] and rig.kube.deletes[0].reason is EvictionReason.OWNER_BACK
    assert state(rig) is LendState.ACTIVE


def test_a_loan_that_loses_its_coverage_ends(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.cycle(0)
    rig.cycle(61)
    assert state(rig) is LendState.LENT
    spot = rig.add_spot("job-a", [rig.d[0]], "cid-a")
    rig.cycle(1)
    rig.guard.uncovered.add(OWNER)  # the fd was lost (holder and guard died together)
    rig.cycle(10)
    assert "cid-a" not in rig.tasks.running()
    assert rig.kube.deleted() == [spot] and rig.kube.deletes[0].reason is EvictionReason.UNGUARDED
    assert rig.guard.calls[-1] == ("disarm", OWNER)
    assert state(rig) is LendState.ACTIVE
    assert "its loan ends" in rig.kube.node_events[0][2]
    m = rig.agent.metrics
    assert m.sample("spotgpu_agent_evictions_total", {"reason": "Unguarded", "namespace": "spot"}) == 1
    rig.cycle(100)
    assert state(rig) is LendState.ACTIVE  # and it is not lent again while uncovered


def test_a_recorded_loan_is_not_resumed_without_coverage(tmp_path: Path) -> None:
    store = FakeLendStore()
    rig = make_rig(tmp_path, store=store)
    rig.cycle(0)
    rig.cycle(61)
    rig.add_spot("job-a", [rig.d[0]], "cid-a")
    rig.cycle(1)
    rig.agent.stop()
    again = make_rig(tmp_path, store=store, start=False, guard=uncovered())
    again.podres.set(rig.allocations)
    for info in rig.kube.list_node_pods(rig.agent.node):
        again.kube.add_pod(info)
    again.tasks.add("cid-a", rig.tasks.containers["cid-a"].labels)
    again.agent.start(serve_metrics=False, loops=False)
    assert state(again) is LendState.ACTIVE
    assert not again.guard.is_armed(OWNER)
    assert again.kube.deletes and again.kube.deletes[0].reason is EvictionReason.RECOVERY
