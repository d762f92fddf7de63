"""Invariants of the lending state machine over generated event traces (hypothesis): an owner
the guard does not cover is never lent unless the policy says pollOnly, one owner never has two
evictions in flight, a loan always arms the guard before its twins are published, and the
learned state stays bounded."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from spotgpu.core.config import LendingConfig, LendPolicyKind, PredictiveConfig, UnguardedPolicy
from spotgpu.core.configfile import Seconds
from spotgpu.core.idle_forecast import BINS, Refusal
from spotgpu.core.ids import DeviceID
from spotgpu.core.lending import (
    ActivitySample,
    Arm,
    ArmFailed,
    Event,
    Evict,
    EvictionDone,
    GuardSignal,
    LendRules,
    LendState,
    Lent,
    NotLent,
    OwnerLending,
    Publish,
    Recovered,
    Sample,
    Violation,
    new_owner,
    transition,
)
from spotgpu.core.refs import ContainerRef
from spotgpu.core.types import EvictionReason

OWNER = ContainerRef("team", "dev", "main")
DEVICES = (DeviceID("GPU-0"),)


@dataclass(frozen=True)
class Restart:
    """An agent restart: a fresh state with the learned history, recovered as lent or not."""

    lent: bool
    covered: bool


samples = st.builds(
    lambda u, p, c: Sample(ActivitySample(0.0, u, p), c),
    st.sampled_from([False, False, True, None]),
    st.sampled_from([False, False, False, True, None]),
    st.sampled_from([True, True, False]),
)
events = st.one_of(
    samples,
    samples,
    samples,
    st.just(GuardSignal()),
    st.just(EvictionDone()),
    st.just(ArmFailed()),
    st.sampled_from([EvictionReason.DEVICE_UNHEALTHY, EvictionReason.RECOVERY]).map(Violation),
    st.builds(Restart, st.booleans(), st.booleans()),
)
steps = st.lists(st.tuples(st.floats(min_value=0, max_value=4000, allow_nan=False), events), max_size=80)
rules = st.builds(
    lambda policy, unguarded, gate: LendRules(
        gate,
        LendingConfig(policy, unguarded, PredictiveConfig(min_likely_idle=Seconds(600), quick_return=Seconds(900))),
    ),
    st.sampled_from(list(LendPolicyKind)),
    st.sampled_from(list(UnguardedPolicy)),
    st.sampled_from([60.0, 120.0, 600.0]),
)


def run(trace: list[tuple[float, object]], r: LendRules) -> None:
    """Drive one owner through ``trace`` and check every invariant on the way."""
    state: OwnerLending = new_owner(OWNER, DEVICES, 0.0)
    now, in_flight = 0.0, False
    for dt, raw in trace:
        now += dt
        before = state.state
        if isinstance(raw, Restart):
            state = new_owner(OWNER, DEVICES, now, state.history, state.backoff)
            in_flight = False  # the evictor died with the agent; recovery starts afresh
            event: Event = Recovered(raw.lent, raw.covered, None)
            covered = raw.covered
            before = state.state
        else:
            event = raw  # type: ignore[assignment]
            covered = event.covered if isinstance(event, Sample) else True
            if isinstance(event, Sample):
                event = Sample(
                    ActivitySample(now, event.activity.utilization_active, event.activity.owner_process_active), covered
                )
        state, actions = transition(state, event, now, r)
        refuse = r.lending.unguarded_policy is UnguardedPolicy.REFUSE
        if isinstance(event, Sample | Recovered) and not covered and refuse:
            assert state.state is not LendState.LENT, f"lent without the guard's coverage after {event}"
        if state.state is LendState.LENT and before is not LendState.LENT:
            assert covered or not refuse, "a loan began without coverage under refuse"
            assert any(isinstance(a, Arm) for a in actions), "a loan without arming the guard"
        if any(isinstance(a, Lent) for a in actions):
            kinds = [type(a) for a in actions]
            assert kinds.index(Arm) < kinds.index(Publish), "twins published before the guard was armed"
        evicts = [a for a in actions if isinstance(a, Evict)]
        assert len(evicts) <= 1
        if evicts:
            assert not in_flight, "a second eviction while one is in flight"
            assert state.state is LendState.EVICTING
            kinds = [type(a) for a in actions]
            assert kinds.index(Publish) < kinds.index(Evict), "evicting before the twins turn Unhealthy"
            in_flight = True
        if isinstance(event, EvictionDone) and before is LendState.EVICTING:
            in_flight = False
        assert in_flight == (state.state is LendState.EVICTING)
        for a in actions:
            if isinstance(a, NotLent) and a.reason is Refusal.UNGUARDED:
                assert not covered
        assert len(state.history.counts) == BINS and sum(state.history.counts) <= r.lending.predictive.memory + 1e-9


@settings(max_examples=300, deadline=None)
@given(steps, rules)
def test_lending_invariants_hold_on_any_trace(trace: list[tuple[float, object]], r: LendRules) -> None:
    run(trace, r)


def test_coverage_lost_while_lent_ends_the_loan_under_refuse_and_not_under_poll_only() -> None:
    for policy, ends in ((UnguardedPolicy.REFUSE, True), (UnguardedPolicy.POLL_ONLY, False)):
        r = LendRules(60, LendingConfig(LendPolicyKind.TIMER, unguarded_policy=policy))
        s = new_owner(OWNER, DEVICES, 0.0)
        s, _ = transition(s, Sample(ActivitySample(60, False, False), True), 60, r)
        assert s.state is LendState.LENT
        s, actions = transition(s, Sample(ActivitySample(70, False, False), False), 70, r)
        evicts = [a for a in actions if isinstance(a, Evict)]
        if ends:
            assert s.state is LendState.EVICTING
            assert evicts and evicts[0].reason is EvictionReason.UNGUARDED
            assert NotLent(OWNER, Refusal.UNGUARDED) in actions
        else:
            assert s.state is LendState.LENT and s.poll_only and not evicts


def test_an_unguarded_idle_owner_is_reported_once_per_idle_period() -> None:
    r = LendRules(60, LendingConfig(LendPolicyKind.TIMER))
    s = new_owner(OWNER, DEVICES, 0.0)
    reports = []
    for t in (60, 70, 80):
        s, actions = transition(s, Sample(ActivitySample(t, False, False), False), t, r)
        reports += [a for a in actions if isinstance(a, NotLent)]
        assert s.state is LendState.ACTIVE
    assert reports == [NotLent(OWNER, Refusal.UNGUARDED)]
    s, _ = transition(s, Sample(ActivitySample(90, True, False), False), 90, r)  # back, then idle again
    s, actions = transition(s, Sample(ActivitySample(150, False, False), False), 150, r)
    assert NotLent(OWNER, Refusal.UNGUARDED) in actions
    s, actions = transition(s, Sample(ActivitySample(160, False, False), True), 160, r)  # covered now: lent
    assert s.state is LendState.LENT
