"""Who answers, who may leave: the fd holder's decisions across restarts and upgrades.

Pure: plain data in, decisions out, time is an argument. :class:`~spotgpu.guard.holder.FdHolder`
and :class:`~spotgpu.guard.succession_io.Succession` apply them; docs/guard.md ("Handover")
explains the whole life cycle.

A node's holders form at most a pair: the *primary* (accepts runc's and the guard's
connections, answers caught calls while no guard is attached) and, after a handover, its
predecessor as *standby* (keeps a copy of every fd, answers nothing, and resumes as primary if
its successor dies). Exactly one party answers a notify fd at any time: the attached guard, else
the primary holder. Two receivers on one notify fd would be a bug, not a race to tolerate: the
loser's ``SECCOMP_IOCTL_NOTIF_RECV`` blocks until the *next* notification.

A holder's role is a value: :class:`Primary`, :class:`HandingOver`, :class:`Standby` or
:class:`Retired`, each with the fields that role needs (the links to the other holder, the
quiet period, the handover's timing) and methods that return the next role. The transitions::

    Primary --hand_over--> HandingOver --commit--> Standby --retire--> Retired
       ^                       |                      |
       +-------abort-----------+                      |
       +-------------------resume---------------------+

The links are sockets, but nothing here reads or writes them: the holder does, after it has
taken the new role.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from socket import socket


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
class Primary:
    """Accepts connections; answers caught calls while no guard is attached and it is not quiet."""

    kind: ClassVar[Role] = Role.PRIMARY
    standby: socket | None = None
    """The link to our predecessor, which stands by with copies of every fd (after a handover)."""
    quiet_until: float | None = None
    """Answer nothing before then: a guard may be answering alone until it re-attaches here."""

    def hand_over(self, successor: socket, now: float) -> HandingOver:
        return HandingOver(successor, started=now, standby=self.standby, quiet_until=self.quiet_until)

    def quiet(self, until: float | None) -> Primary:
        return replace(self, quiet_until=until)

    def without_standby(self) -> Primary:
        return replace(self, standby=None)


@dataclass(frozen=True, slots=True)
class HandingOver:
    """A successor asked for everything: no new connections; still answers until it commits."""

    kind: ClassVar[Role] = Role.HANDING_OVER
    successor: socket
    started: float
    sent_at: float | None = None
    """When the state went out; from then on the guard's messages wait for the successor."""
    standby: socket | None = None
    """Our own standby, kept while the handover may still abort."""
    quiet_until: float | None = None

    def sent(self, now: float) -> HandingOver:
        return replace(self, sent_at=now)

    def abort(self) -> Primary:
        return Primary(self.standby, self.quiet_until)

    def commit(self, had_guard: bool) -> Standby:
        """The successor took everything; the link to it is now the link to our primary."""
        return Standby(self.successor, had_guard)

    def quiet(self, until: float | None) -> HandingOver:
        return replace(self, quiet_until=until)

    def without_standby(self) -> HandingOver:
        return replace(self, standby=None)


@dataclass(frozen=True, slots=True)
class Standby:
    """Handed over: keeps copies of every fd, answers nothing, resumes if the successor dies."""

    kind: ClassVar[Role] = Role.STANDBY
    primary: socket
    primary_has_guard: bool = False
    """A guard is attached to the primary (it reports every change)."""

    def status(self, guard: bool) -> Standby:
        return replace(self, primary_has_guard=guard)

    def resume(self, guard_timeout: float, now: float) -> Primary:
        """The successor is gone; we hold every fd it held (see :func:`quiet_until`)."""
        return Primary(None, quiet_until(self.primary_has_guard, guard_timeout, now))

    def retire(self) -> Retired:
        return Retired()


@dataclass(frozen=True, slots=True)
class Retired:
    """Holds nothing (a newer standby replaced it); waits to be stopped."""

    kind: ClassVar[Role] = Role.RETIRED


HolderRole = Primary | HandingOver | Standby | Retired
Serving = Primary | HandingOver
"""The roles that hold the node's sockets and may answer."""


def answers(role: HolderRole, guard_attached: bool) -> bool:
    """:func:`holder_answers` for a role value."""
    quiet = isinstance(role, Primary | HandingOver) and role.quiet_until is not None
    return holder_answers(role.kind, guard_attached, quiet)


def standby_of(role: HolderRole) -> socket | None:
    return role.standby if isinstance(role, Primary | HandingOver) else None


def removes_socket_files(role: HolderRole) -> bool:
    """A listening socket file is removed only by the last holder using it: never by one that
    handed over (its successor serves on the same socket) or that has a standby to resume."""
    return isinstance(role, Primary | HandingOver) and role.standby is None


def inherited_role(
    *,
    complete: bool,
    link: socket | None,
    quiet_s: float,
    guard_attached: bool,
    guard_expected: bool,
    guard_timeout: float,
    now: float,
) -> tuple[Primary, bool]:
    """A successor's first role after a pull, and whether it must take over answering at once.

    ``complete``: the predecessor committed and stands by on ``link``; its quiet period (if any)
    carries over unless its guard came along. Otherwise the predecessor died part-way: with its
    guard here nothing is stranded; a guard that was attached there but did not arrive answers
    alone until it re-attaches (quiet for ``guard_timeout``); with neither, take over at once.
    """
    if complete:
        return Primary(link, now + quiet_s if quiet_s > 0 and not guard_attached else None), False
    if guard_attached:
        return Primary(), False
    if guard_expected:
        return Primary(None, now + guard_timeout), False
    return Primary(), True


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
    "HandingOver",
    "HandoverRefusal",
    "HolderRole",
    "HolderState",
    "Primary",
    "Retired",
    "Role",
    "Serving",
    "Standby",
    "answers",
    "decide_exit",
    "holder_answers",
    "inherited_role",
    "quiet_until",
    "refuse_handover",
    "removes_socket_files",
    "standby_of",
]
