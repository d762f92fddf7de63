"""Who answers, who may leave: the fd holder's decisions across restarts and upgrades.

Pure: plain data in, decisions out, time is an argument. :class:`~spotgpu.guard.holder.FdHolder`
applies them; docs/guard.md ("Handover") explains the whole life cycle.

A node's holders form at most a pair: the *primary* (accepts runc's and the guard's
connections, answers caught calls while no guard is attached) and, after a handover, its
predecessor as *standby* (keeps a copy of every fd, answers nothing, and resumes as primary if
its successor dies). Exactly one party answers a notify fd at any time: the attached guard, else
the primary holder. Two receivers on one notify fd would be a bug, not a race to tolerate: the
loser's ``SECCOMP_IOCTL_NOTIF_RECV`` blocks until the *next* notification.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    PRIMARY = "primary"
    """Accepts connections; answers caught calls while no guard is attached."""
    HANDING_OVER = "handing-over"
    """A successor asked for everything: no new connections; still answers until it commits."""
    STANDBY = "standby"
    """Handed over: keeps copies of every fd, answers nothing, resumes if the successor dies."""
    RETIRED = "retired"
    """Holds nothing (a newer standby replaced it); waits to be stopped."""


def holder_answers(role: Role, guard_attached: bool, quiet: bool) -> bool:
    """Does the holder itself answer caught calls now? ``quiet``: a guard that was attached to a
    successor which just died may still be answering on its own until it re-attaches."""
    return role in (Role.PRIMARY, Role.HANDING_OVER) and not guard_attached and not quiet


@dataclass(frozen=True, slots=True)
class HandoverRefusal:
    reason: str
    retry: bool
    """True when asking again soon can succeed (another handover is in progress)."""


def refuse_handover(role: Role, successor_version: int, min_version: int) -> HandoverRefusal | None:
    """Whether a holder refuses a successor's ``handover`` request, and why."""
    if successor_version < min_version:
        return HandoverRefusal(f"handover protocol version {successor_version} < {min_version}", retry=False)
    if role is Role.HANDING_OVER:
        return HandoverRefusal("another handover is in progress", retry=True)
    if role is not Role.PRIMARY:
        return HandoverRefusal(f"this holder is {role.value}, not primary", retry=True)
    return None


def quiet_until(primary_had_guard: bool, guard_timeout: float, now: float) -> float | None:
    """A standby resumes because its successor died. If a guard was attached there, the guard
    still holds every fd and answers alone until it re-attaches here (within its reconnect
    interval): the holder stays quiet until then, at most ``guard_timeout``, instead of racing it
    for notifications. Otherwise the holder answers at once (after restarting stranded calls)."""
    return now + guard_timeout if primary_had_guard else None


class ExitReason(StrEnum):
    NOTHING_HELD = "nothing-held"
    SUCCESSOR_HOLDS = "successor-holds"
    """This holder is standby or retired: its successor holds every fd."""
    STANDBY_RESUMES = "standby-resumes"
    """This primary has a standby with every fd, which resumes when it sees this one go."""
    GUARD_HOLDS_ALONE = "guard-holds-alone"
    """No successor within the handover timeout; the attached guard keeps the only copies."""
    FDS_LOST = "fds-lost"
    """No successor within the handover timeout and no guard: the fds close with this process."""


@dataclass(frozen=True, slots=True)
class HolderState:
    role: Role
    fds: int
    guard_attached: bool
    has_standby: bool
    exit_requested_at: float | None
    """When the holder was asked to stop (SIGTERM); None while it was not."""
    handover_timeout: float
    now: float


@dataclass(frozen=True, slots=True)
class ExitDecision:
    reason: ExitReason

    @property
    def loses_fds(self) -> bool:
        return self.reason is ExitReason.FDS_LOST


def decide_exit(state: HolderState) -> ExitDecision | None:
    """Exit now (a decision) or keep serving (None).

    A holder asked to stop leaves at once when nothing depends on it alone; otherwise it keeps
    serving, answering as usual, until a successor takes its fds or the handover timeout ends.
    A handover in progress is always finished first (it is bounded by its own timeouts).
    """
    if state.exit_requested_at is None:
        return None
    if state.role in (Role.STANDBY, Role.RETIRED):
        return ExitDecision(ExitReason.SUCCESSOR_HOLDS)
    if state.role is Role.HANDING_OVER:
        return None
    if state.fds == 0:
        return ExitDecision(ExitReason.NOTHING_HELD)
    if state.has_standby:
        return ExitDecision(ExitReason.STANDBY_RESUMES)
    if state.now < state.exit_requested_at + state.handover_timeout:
        return None
    return ExitDecision(ExitReason.GUARD_HOLDS_ALONE if state.guard_attached else ExitReason.FDS_LOST)


__all__ = [
    "ExitDecision",
    "ExitReason",
    "HandoverRefusal",
    "HolderState",
    "Role",
    "decide_exit",
    "holder_answers",
    "quiet_until",
    "refuse_handover",
]
