"""The lending state machine's activity rules (the former lowpower detector's): idle once after
maxInactiveTime, busy at once, and while lent only the owner's own processes (or the guard)
count, never utilization."""

from __future__ import annotations

import pytest

from spotgpu.core.config import LendingConfig, LendPolicyKind
from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import DeviceID
from spotgpu.core.lending import (
    Actions,
    ActivitySample,
    ActivitySource,
    Arm,
    Event,
    Evict,
    GuardSignal,
    LendRules,
    LendState,
    Lent,
    Persist,
    Publish,
    Sample,
    new_owner,
    transition,
)
from spotgpu.core.refs import ContainerRef
from spotgpu.core.types import EvictionReason

OWNER = ContainerRef("team", "dev-0", "main")
DEVICES = (DeviceID("GPU-0"), DeviceID("GPU-1"))
TIMER = LendingConfig(LendPolicyKind.TIMER)


class Owner:
    """One owner's state, fed like the agent feeds it (always covered by the guard)."""

    def __init__(self, max_inactive_time: float, now: float) -> None:
        self.rules = LendRules(max_inactive_time, TIMER)  # the timer's rules (the default is predictive)
        self.state = new_owner(OWNER, DEVICES, now)

    def feed(self, event: Event, at: float) -> Actions:
        self.state, actions = transition(self.state, event, at, self.rules)
        return actions

    def observe(self, at: float, util: bool | None = False, proc: bool | None = False) -> Lent | Evict | None:
        """The loan or eviction this sample starts, if any."""
        found = [a for a in self.feed(Sample(ActivitySample(at, util, proc), True), at) if isinstance(a, Lent | Evict)]
        return found[0] if found else None

    @property
    def idle(self) -> bool:
        return self.state.state is LendState.LENT


def test_idle_is_reported_once_after_max_inactive_time() -> None:
    d = Owner(max_inactive_time=60, now=0)
    assert d.observe(30) is None
    assert d.observe(59.9) is None
    event = d.observe(60)
    assert event == Lent(OWNER, DEVICES, 60)
    assert d.observe(120) is None
    assert d.idle


def test_a_loan_arms_the_guard_then_records_then_publishes() -> None:
    d = Owner(max_inactive_time=60, now=0)
    actions = d.feed(Sample(ActivitySample(60, False, False), True), 60)
    assert actions == (Lent(OWNER, DEVICES, 60), Arm(OWNER), Persist(), Publish())


def test_activity_resets_the_timer() -> None:
    d = Owner(max_inactive_time=60, now=0)
    assert d.observe(50, util=True) is None
    assert d.observe(100) is None
    assert isinstance(d.observe(110), Lent)


def test_busy_is_reported_at_once_by_an_owner_process() -> None:
    d = Owner(max_inactive_time=10, now=0)
    d.observe(10)
    event = d.observe(11, proc=True)
    assert event == Evict(OWNER, DEVICES, EvictionReason.OWNER_BACK, 11, ActivitySource.PROCESS)
    assert not d.idle
    assert d.observe(12, proc=True) is None


def test_while_lent_utilization_belongs_to_the_spot_job() -> None:
    d = Owner(max_inactive_time=10, now=0)
    d.observe(10)
    for t in range(11, 30):
        assert d.observe(t, util=True, proc=False) is None
    assert d.idle


def test_guard_signal() -> None:
    d = Owner(max_inactive_time=10, now=0)
    assert not [a for a in d.feed(GuardSignal(), 5) if isinstance(a, Evict)]  # not lent: nothing to evict
    d.observe(15)
    event = [a for a in d.feed(GuardSignal(), 16) if isinstance(a, Evict)]
    assert event and event[0].source is ActivitySource.GUARD
    assert d.feed(GuardSignal(), 17) == ()


@pytest.mark.parametrize(("util", "proc"), [(None, False), (False, None), (None, None)])
def test_unknown_measurements_never_make_an_owner_idle(util: bool | None, proc: bool | None) -> None:
    d = Owner(max_inactive_time=10, now=0)
    for t in range(0, 100, 5):
        assert d.observe(t, util, proc) is None
    assert not d.idle


def test_unknown_owner_processes_while_lent_end_the_loan() -> None:
    d = Owner(max_inactive_time=10, now=0)
    d.observe(10)
    event = d.observe(11, util=True, proc=None)
    assert event is not None and isinstance(event, Evict) and event.source is ActivitySource.UNKNOWN


def test_bad_arguments() -> None:
    with pytest.raises(ValidationError, match="must not be negative"):
        LendRules(-1)
    with pytest.raises(ValidationError, match="must name its namespace"):
        new_owner(ContainerRef(None, "p", "c"), DEVICES, 0)
