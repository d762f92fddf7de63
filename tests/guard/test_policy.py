"""The guard's decisions (pure): table tests and a state machine checking the invariants under
any sequence of arm, disarm, calls, fd loss and time."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from spotgpu.core.refs import ContainerRef
from spotgpu.guard.policy import ContinueReason, GuardPolicy, OwnerState, ReleaseReason, Verdict

A = ContainerRef("ns", "a", "c")
B = ContainerRef("ns", "b", "c")


def test_disarmed_and_unknown_continue_armed_holds_and_reports_once() -> None:
    policy = GuardPolicy(5.0)
    assert policy.on_notification(None, "k", 1, 0.0).reason is ContinueReason.UNKNOWN_OWNER
    assert policy.on_notification(A, "k", 2, 0.0).reason is ContinueReason.DISARMED
    policy.arm(A)
    first = policy.on_notification(A, "k", 3, 1.0)
    second = policy.on_notification(A, "k2", 4, 1.5)
    assert first.verdict is second.verdict is Verdict.HOLD
    assert first.owner_back and not second.owner_back
    assert policy.state(A) is OwnerState.HOLDING and policy.next_deadline() == 6.0
    assert policy.on_notification(B, "k3", 5, 1.0).verdict is Verdict.CONTINUE
    released = policy.disarm(A)
    assert sorted(r.hold.id for r in released) == [3, 4]
    assert {r.reason for r in released} == {ReleaseReason.EVICTED}
    assert policy.state(A) is OwnerState.DISARMED and not policy.holds()


def test_fail_open_releases_the_owner_and_lets_later_calls_pass_until_rearmed() -> None:
    policy = GuardPolicy(2.0)
    policy.arm(A)
    policy.on_notification(A, "k", 1, 0.0)
    policy.on_notification(A, "k", 2, 1.0)
    assert policy.expire(1.9) == []
    released = policy.expire(2.0)
    assert sorted(r.hold.id for r in released) == [1, 2]  # the later one goes with the first
    assert all(r.reason is ReleaseReason.FAIL_OPEN for r in released)
    assert policy.state(A) is OwnerState.FAILED_OPEN
    assert policy.on_notification(A, "k", 3, 2.5).reason is ContinueReason.FAILED_OPEN
    policy.arm(A)  # idempotent: still failed open
    assert policy.state(A) is OwnerState.FAILED_OPEN
    policy.disarm(A)
    policy.arm(A)
    again = policy.on_notification(A, "k", 4, 3.0)
    assert again.verdict is Verdict.HOLD and again.owner_back


def test_fd_loss_and_vanished_calls() -> None:
    policy = GuardPolicy(2.0)
    policy.arm(A)
    policy.on_notification(A, "k1", 1, 0.0)
    policy.on_notification(A, "k2", 2, 0.0)
    assert [r.hold.id for r in policy.drop_fd("k1")] == [1]
    assert policy.forget("k2", 2) is not None and policy.forget("k2", 2) is None
    assert policy.state(A) is OwnerState.ARMED
    with pytest.raises(ValueError, match="fail_open_timeout"):
        GuardPolicy(0)


class PolicyMachine(RuleBasedStateMachine):
    """Invariants: a hold is released exactly once; nothing is held past its deadline once time
    has been advanced; only armed owners have holds; owner-back fires at most once per arming."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = GuardPolicy(1.0)
        self.now = 0.0
        self.next_id = 0
        self.open: set[tuple[str, int]] = set()
        self.released: set[tuple[str, int]] = set()
        self.backs_this_arming: dict[ContainerRef, int] = {}

    def _released(self, releases: list) -> None:  # type: ignore[type-arg]
        for r in releases:
            key = (r.hold.key, r.hold.id)
            assert key in self.open and key not in self.released
            self.open.discard(key)
            self.released.add(key)

    @rule(owner=st.sampled_from([A, B]))
    def arm(self, owner: ContainerRef) -> None:
        if not self.policy.is_armed(owner):
            self.backs_this_arming[owner] = 0
        self.policy.arm(owner)

    @rule(owner=st.sampled_from([A, B]))
    def disarm(self, owner: ContainerRef) -> None:
        self._released(self.policy.disarm(owner))
        assert not any(h.owner == owner for h in self.policy.holds())

    @rule(owner=st.sampled_from([A, B, None]), fd=st.sampled_from(["k1", "k2"]))
    def call(self, owner: ContainerRef | None, fd: str) -> None:
        self.next_id += 1
        decision = self.policy.on_notification(owner, fd, self.next_id, self.now)
        if decision.verdict is Verdict.HOLD:
            assert owner is not None and self.policy.is_armed(owner)
            self.open.add((fd, self.next_id))
            if decision.owner_back:
                self.backs_this_arming[owner] += 1
                assert self.backs_this_arming[owner] == 1
        else:
            assert not decision.owner_back

    @rule(dt=st.floats(min_value=0.0, max_value=2.0))
    def tick(self, dt: float) -> None:
        self.now += dt
        self._released(self.policy.expire(self.now))
        assert all(h.deadline > self.now for h in self.policy.holds())

    @rule(fd=st.sampled_from(["k1", "k2"]))
    def fd_gone(self, fd: str) -> None:
        self._released(self.policy.drop_fd(fd))

    @precondition(lambda self: bool(self.open))
    @rule()
    def stop(self) -> None:
        self._released(self.policy.release_all())

    @invariant()
    def holds_match_bookkeeping(self) -> None:
        assert {(h.key, h.id) for h in self.policy.holds()} == self.open
        assert all(self.policy.is_armed(h.owner) for h in self.policy.holds())
        assert all(h.deadline - h.since == pytest.approx(1.0) for h in self.policy.holds())


TestPolicyMachine = PolicyMachine.TestCase
