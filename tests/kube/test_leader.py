"""Leader election over a coordination.k8s.io/v1 Lease on the HTTP API double.

The decision is tested as a pure function (a table and a property); the elector is tested
with two replicas against the double: exactly one leads, a released Lease hands over at once,
a crashed leader's Lease only after ``lease_duration`` (measured on the candidate's own
clock), and a write race is lost with 409 Conflict by exactly one of them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubehelpers import wait_for

from spotgpu.core.clock import ManualClock
from spotgpu.core.errors import ValidationError
from spotgpu.kube.client import Connection
from spotgpu.kube.leader import Action, ElectionConfig, LeaderElector, LeaseRecord, decide
from spotgpu.testing.kubeapi import KubeApiServer

CFG = ElectionConfig(lease_duration=15.0, renew_deadline=10.0, retry_period=2.0)


def record(holder: str, duration: float = 15.0) -> LeaseRecord:
    return LeaseRecord(holder=holder, duration=duration, transitions=0, resource_version="1")


@pytest.mark.parametrize(
    ("rec", "now", "observed", "want"),
    [
        pytest.param(None, 0.0, 0.0, Action.ACQUIRE, id="no-lease"),
        pytest.param(record(""), 0.0, 0.0, Action.ACQUIRE, id="released"),
        pytest.param(record("me"), 100.0, 0.0, Action.RENEW, id="mine-even-if-old"),
        pytest.param(record("other"), 10.0, 0.0, Action.WAIT, id="other-live"),
        pytest.param(record("other"), 15.0, 0.0, Action.WAIT, id="other-exactly-at-duration"),
        pytest.param(record("other"), 15.1, 0.0, Action.ACQUIRE, id="other-expired"),
    ],
)
def test_decide(rec: LeaseRecord | None, now: float, observed: float, want: Action) -> None:
    assert decide(rec, "me", now, observed) is want


@given(st.floats(0, 1e6), st.floats(0, 1e6), st.floats(1, 100))
def test_a_live_foreign_lease_is_never_taken(observed: float, elapsed: float, duration: float) -> None:
    now = observed + elapsed
    action = decide(record("other", duration), "me", now, observed)
    assert (action is Action.ACQUIRE) == (now - observed > duration)


def test_config_refuses_unsafe_timings() -> None:
    with pytest.raises(ValidationError):
        ElectionConfig(lease_duration=10, renew_deadline=10, retry_period=2)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1000.0)


@pytest.fixture
def pair(conn: Connection, clock: ManualClock) -> Iterator[tuple[LeaderElector, LeaderElector]]:
    a = LeaderElector(conn, name="spotgpu-scheduler", namespace="spotgpu", identity="a", config=CFG, clock=clock)
    b = LeaderElector(conn, name="spotgpu-scheduler", namespace="spotgpu", identity="b", config=CFG, clock=clock)
    yield a, b


def lease(api: KubeApiServer) -> dict:
    obj = api.get("coordination.k8s.io", "leases", "spotgpu-scheduler", "spotgpu")
    assert obj is not None
    return obj


def test_only_one_replica_leads_and_a_release_hands_over_at_once(
    api: KubeApiServer, pair: tuple[LeaderElector, LeaderElector], clock: ManualClock
) -> None:
    a, b = pair
    assert a.try_once() is True
    assert b.try_once() is False
    for _ in range(20):  # many rounds: never both
        clock.advance(CFG.retry_period)
        assert (a.try_once(), b.try_once()) == (True, False)
    assert lease(api)["spec"]["holderIdentity"] == "a"
    a.release()
    assert a.is_leader() is False
    assert b.try_once() is True
    spec = lease(api)["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 0  # the release left no holder


def test_a_crashed_leader_is_replaced_only_after_the_lease_duration(
    api: KubeApiServer, pair: tuple[LeaderElector, LeaderElector], clock: ManualClock
) -> None:
    a, b = pair
    assert a.try_once()
    assert not b.try_once()
    # a crashes: no more renewals, no release
    clock.advance(CFG.lease_duration - 1)
    assert not b.try_once()
    assert not a.is_leader()  # a itself would have stopped acting after renew_deadline
    clock.advance(2)
    assert b.try_once()
    spec = lease(api)["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1


def test_a_leader_that_cannot_renew_steps_down_before_anyone_can_take_over(
    api: KubeApiServer, pair: tuple[LeaderElector, LeaderElector], clock: ManualClock
) -> None:
    a, b = pair
    assert a.try_once()
    api.inject_fault("*", r"/leases", 503, times=-1)
    clock.advance(CFG.renew_deadline - 1)
    assert a.try_once() is True  # the last good renewal is still young
    clock.advance(2)
    assert a.try_once() is False  # renew deadline passed: stop acting
    assert b.try_once() is False  # and b cannot take over yet (nor can it reach the API)


def test_two_candidates_racing_for_an_expired_lease_get_one_winner(
    api: KubeApiServer, pair: tuple[LeaderElector, LeaderElector], clock: ManualClock, conn: Connection
) -> None:
    a, b = pair
    c = LeaderElector(conn, name="spotgpu-scheduler", namespace="spotgpu", identity="c", config=CFG, clock=clock)
    assert c.try_once()
    assert not a.try_once() and not b.try_once()
    clock.advance(CFG.lease_duration + 1)  # c is gone; a and b both see the lease expired
    # a reads the expired Lease; b reads and writes first; a's write then carries a stale version
    lease_seen_by_a = a._read()
    assert b.try_once()
    a._read = lambda: lease_seen_by_a  # type: ignore[method-assign]
    assert a.try_once() is False  # 409 Conflict: a lost the race
    assert lease(api)["spec"]["holderIdentity"] == "b"
    assert a.transitions_seen == 1 and b.transitions_seen == 1  # both tried to take over; one won


def test_background_threads_hand_over_on_stop(conn: Connection, api: KubeApiServer) -> None:
    fast = ElectionConfig(lease_duration=3.0, renew_deadline=2.0, retry_period=0.05)
    started: list[str] = []
    a = LeaderElector(
        conn, name="l", namespace="ns", identity="a", config=fast, on_started=lambda: started.append("a")
    ).start()
    wait_for(a.is_leader)
    b = LeaderElector(
        conn, name="l", namespace="ns", identity="b", config=fast, on_started=lambda: started.append("b")
    ).start()
    try:
        wait_for(lambda: b.holder == "a")
        assert not b.is_leader()
        a.stop(release=True)
        wait_for(b.is_leader, timeout=2.0)  # well before the 3 s lease duration
        assert started == ["a", "b"]
    finally:
        a.stop(release=False)
        b.stop()
