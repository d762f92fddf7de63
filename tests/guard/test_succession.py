"""The holder's life-cycle decisions (pure): who answers, when a handover is refused, when a
holder asked to stop may leave. Property-tested for the invariants docs/guard.md promises."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core.config import GuardConfig
from spotgpu.core.configfile import ConfigError, from_mapping
from spotgpu.guard.succession import (
    ExitReason,
    HandingOver,
    HolderRole,
    HolderState,
    Primary,
    Retired,
    Role,
    Standby,
    answers,
    decide_exit,
    holder_answers,
    inherited_role,
    quiet_until,
    refuse_handover,
    removes_socket_files,
    standby_of,
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


# --- the role as a value: transitions ------------------------------------------------------

SUCCESSOR, STANDBY_LINK = object(), object()  # stand for sockets: the transitions never touch them


def test_a_handover_that_aborts_restores_the_primary_it_started_from() -> None:
    primary = Primary(STANDBY_LINK, quiet_until=5.0)  # type: ignore[arg-type]
    handing = primary.hand_over(SUCCESSOR, now=1.0)  # type: ignore[arg-type]
    assert handing.kind is Role.HANDING_OVER and handing.sent_at is None and handing.started == 1.0
    assert handing.standby is STANDBY_LINK and handing.quiet_until == 5.0
    assert handing.sent(2.0).abort() == primary
    assert handing.sent(2.0).sent_at == 2.0 and handing.sent_at is None  # frozen: a new value each time


def test_commit_makes_the_link_to_the_successor_the_link_to_our_primary() -> None:
    standby = Primary().hand_over(SUCCESSOR, 1.0).sent(1.5).commit(had_guard=True)  # type: ignore[arg-type]
    assert standby.kind is Role.STANDBY and standby.primary is SUCCESSOR and standby.primary_has_guard
    assert standby_of(standby) is None and not removes_socket_files(standby)
    assert standby.status(False).primary_has_guard is False
    assert standby.retire().kind is Role.RETIRED


@given(st.booleans(), st.floats(0.1, 60), st.floats(0, 1e6))
def test_resume_is_quiet_exactly_when_the_dead_successor_had_a_guard(
    had_guard: bool, timeout: float, now: float
) -> None:
    resumed = Standby(SUCCESSOR, had_guard).resume(timeout, now)  # type: ignore[arg-type]
    assert resumed.kind is Role.PRIMARY and resumed.standby is None
    assert resumed.quiet_until == quiet_until(had_guard, timeout, now)
    assert not answers(resumed, guard_attached=False) if had_guard else answers(resumed, guard_attached=False)


roles = st.sampled_from(
    [
        Primary(),
        Primary(STANDBY_LINK),  # type: ignore[arg-type]
        Primary(None, 3.0),
        HandingOver(SUCCESSOR, 0.0),  # type: ignore[arg-type]
        HandingOver(SUCCESSOR, 0.0, standby=STANDBY_LINK),  # type: ignore[arg-type]
        Standby(SUCCESSOR),  # type: ignore[arg-type]
        Retired(),
    ]
)


@given(roles, st.booleans())
def test_role_values_answer_as_their_kind_does(role: HolderRole, guard: bool) -> None:
    quiet = getattr(role, "quiet_until", None) is not None
    assert answers(role, guard) == holder_answers(role.kind, guard, quiet)
    # Socket files go only with the last holder: a serving one without a standby.
    assert removes_socket_files(role) == (role.kind in (Role.PRIMARY, Role.HANDING_OVER) and standby_of(role) is None)


def test_the_role_a_successor_starts_in() -> None:
    def start(**kw: object) -> tuple[Primary, bool]:
        args: dict[str, object] = {
            "complete": False,
            "link": None,
            "quiet_s": 0.0,
            "guard_attached": False,
            "guard_expected": False,
            "guard_timeout": 3.0,
            "now": 10.0,
        }
        return inherited_role(**{**args, **kw})  # type: ignore[arg-type]

    assert start(complete=True, link=STANDBY_LINK) == (Primary(STANDBY_LINK), False)  # type: ignore[arg-type]
    assert start(complete=True, link=STANDBY_LINK, quiet_s=2.0) == (Primary(STANDBY_LINK, 12.0), False)  # type: ignore[arg-type]
    assert start(complete=True, quiet_s=2.0, guard_attached=True) == (Primary(), False)  # its guard came along
    assert start(guard_attached=True) == (Primary(), False)  # the predecessor died, its guard is here
    assert start(guard_expected=True) == (Primary(None, 13.0), False)  # its guard answers alone meanwhile
    assert start() == (Primary(), True)  # nobody answers: take over at once
