"""The holder's life-cycle decisions (pure): who answers, when a handover is refused, when a
holder asked to stop may leave. Property-tested for the invariants docs/guard.md promises."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core.config import ConfigError, GuardConfig, from_mapping
from spotgpu.guard.succession import (
    ExitReason,
    HolderState,
    Role,
    decide_exit,
    holder_answers,
    quiet_until,
    refuse_handover,
)

states = st.builds(
    HolderState,
    role=st.sampled_from(list(Role)),
    fds=st.integers(0, 50),
    guard_attached=st.booleans(),
    has_standby=st.booleans(),
    exit_requested_at=st.none() | st.floats(0, 1000),
    handover_timeout=st.floats(0.1, 600),
    now=st.floats(0, 2000),
)


@given(states)
def test_exit_invariants(state: HolderState) -> None:
    decision = decide_exit(state)
    if state.exit_requested_at is None:
        assert decision is None  # nobody asked
        return
    if state.role is Role.HANDING_OVER:
        assert decision is None  # a handover in progress is finished first
    if decision is None:
        return
    # Leaving with fds that exist nowhere else happens only after the whole handover timeout.
    if decision.loses_fds:
        assert state.role is Role.PRIMARY and state.fds > 0
        assert not state.guard_attached and not state.has_standby
        assert state.now >= state.exit_requested_at + state.handover_timeout
    if decision.reason is ExitReason.GUARD_HOLDS_ALONE:
        assert state.guard_attached and state.now >= state.exit_requested_at + state.handover_timeout


def test_exit_table() -> None:
    def state(role: Role = Role.PRIMARY, fds: int = 2, guard: bool = False, standby: bool = False, t: float = 1.0):
        return HolderState(role, fds, guard, standby, exit_requested_at=0.0, handover_timeout=60.0, now=t)

    assert decide_exit(state(Role.STANDBY)).reason is ExitReason.SUCCESSOR_HOLDS  # type: ignore[union-attr]
    assert decide_exit(state(Role.RETIRED, fds=0)).reason is ExitReason.SUCCESSOR_HOLDS  # type: ignore[union-attr]
    assert decide_exit(state(fds=0)).reason is ExitReason.NOTHING_HELD  # type: ignore[union-attr]
    assert decide_exit(state(standby=True)).reason is ExitReason.STANDBY_RESUMES  # type: ignore[union-attr]
    assert decide_exit(state()) is None  # waits for a successor ...
    assert decide_exit(state(guard=True)) is None  # ... even when a guard holds copies
    assert decide_exit(state(t=60.0)).reason is ExitReason.FDS_LOST  # type: ignore[union-attr]
    assert decide_exit(state(guard=True, t=60.0)).reason is ExitReason.GUARD_HOLDS_ALONE  # type: ignore[union-attr]
    assert decide_exit(state(Role.HANDING_OVER, t=1e6)) is None


@given(st.sampled_from(list(Role)), st.booleans(), st.booleans())
def test_at_most_the_primary_answers_and_never_beside_a_guard(role: Role, guard: bool, quiet: bool) -> None:
    answers = holder_answers(role, guard, quiet)
    assert answers == (role in (Role.PRIMARY, Role.HANDING_OVER) and not guard and not quiet)


def test_handover_refusals() -> None:
    assert refuse_handover(Role.PRIMARY, 2, 2) is None
    old = refuse_handover(Role.PRIMARY, 1, 2)
    assert old is not None and not old.retry and "version 1" in old.reason
    busy = refuse_handover(Role.HANDING_OVER, 2, 2)
    assert busy is not None and busy.retry
    for role in (Role.STANDBY, Role.RETIRED):
        refusal = refuse_handover(role, 2, 2)
        assert refusal is not None and refusal.retry


def test_a_resumed_holder_waits_for_a_guard_only_when_one_was_attached() -> None:
    assert quiet_until(True, 3.0, 10.0) == 13.0
    assert quiet_until(False, 3.0, 10.0) is None


def test_handover_timeout_setting() -> None:
    assert from_mapping(GuardConfig, {"handoverTimeout": "90s"}).handover_timeout == 90.0
    assert GuardConfig().handover_timeout == 60.0
    try:
        from_mapping(GuardConfig, {"handoverTimeout": 0}, "agent.guard")
    except ConfigError as exc:
        assert "handoverTimeout" in str(exc)
    else:
        raise AssertionError("a zero handover timeout was accepted")
