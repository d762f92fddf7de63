"""The guard's decisions: continue or hold a caught GPU call, when to report the owner back,
when to release, when to fail open.

Pure: plain data in, decisions out; time is an argument. :class:`~spotgpu.guard.service.GuardService`
applies the decisions to notify fds (under its lock) and the simulator or tests can drive the
same object with a manual clock.

Rules:

* A call from a container that is not a known owner, or from a disarmed owner, continues at once.
* An armed owner's call is held. The first hold of an arming reports the owner back (once).
* :meth:`GuardPolicy.disarm` (the agent finished evicting) releases every hold of the owner.
* A hold never outlives ``fail_open_timeout``: at the deadline every hold of that owner is
  released and the arming *fails open*: later calls continue at once until the owner is
  disarmed and armed again, so a stuck eviction costs the owner one timeout, not one per call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from spotgpu.core.refs import ContainerRef


class OwnerState(StrEnum):
    DISARMED = "disarmed"
    ARMED = "armed"
    HOLDING = "holding"
    FAILED_OPEN = "failed-open"


class Verdict(StrEnum):
    CONTINUE = "continue"
    HOLD = "hold"


class ContinueReason(StrEnum):
    UNKNOWN_OWNER = "unknown-owner"
    DISARMED = "disarmed"
    FAILED_OPEN = "failed-open"


class ReleaseReason(StrEnum):
    EVICTED = "evicted"
    """The agent disarmed the owner: its GPUs are clean."""
    FAIL_OPEN = "fail-open"
    FD_GONE = "fd-gone"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class Hold:
    key: str
    """The notify fd's key."""
    id: int
    """The notification's cookie."""
    owner: ContainerRef
    since: float
    deadline: float


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: ContinueReason | None = None
    """Why a call continues; None for a hold."""
    hold: Hold | None = None
    owner_back: bool = False
    """Report the owner back now (first hold of this arming)."""


@dataclass(frozen=True, slots=True)
class Release:
    hold: Hold
    reason: ReleaseReason


class GuardPolicy:
    """Arm state per owner and the calls held for them. Not thread-safe; callers serialise."""

    def __init__(self, fail_open_timeout: float) -> None:
        if not fail_open_timeout > 0:
            raise ValueError(f"fail_open_timeout must be > 0, got {fail_open_timeout!r}")
        self.fail_open_timeout = fail_open_timeout
        self._armed: set[ContainerRef] = set()
        self._reported: set[ContainerRef] = set()
        self._failed_open: set[ContainerRef] = set()
        self._holds: dict[tuple[str, int], Hold] = {}

    # -- the agent's side ------------------------------------------------------------------
    def arm(self, owner: ContainerRef) -> None:
        """Idempotent: arming an armed owner keeps its holds and its failed-open state."""
        self._armed.add(owner)

    def disarm(self, owner: ContainerRef) -> list[Release]:
        self._armed.discard(owner)
        self._reported.discard(owner)
        self._failed_open.discard(owner)
        return self._release(lambda h: h.owner == owner, ReleaseReason.EVICTED)

    def is_armed(self, owner: ContainerRef) -> bool:
        return owner in self._armed

    def state(self, owner: ContainerRef) -> OwnerState:
        if owner not in self._armed:
            return OwnerState.DISARMED
        if owner in self._failed_open:
            return OwnerState.FAILED_OPEN
        if any(h.owner == owner for h in self._holds.values()):
            return OwnerState.HOLDING
        return OwnerState.ARMED

    def armed(self) -> frozenset[ContainerRef]:
        return frozenset(self._armed)

    # -- the fd side -----------------------------------------------------------------------
    def on_notification(self, owner: ContainerRef | None, key: str, notification_id: int, now: float) -> Decision:
        if owner is None:
            return Decision(Verdict.CONTINUE, ContinueReason.UNKNOWN_OWNER)
        if owner not in self._armed:
            return Decision(Verdict.CONTINUE, ContinueReason.DISARMED)
        if owner in self._failed_open:
            return Decision(Verdict.CONTINUE, ContinueReason.FAILED_OPEN)
        hold = Hold(key, notification_id, owner, now, now + self.fail_open_timeout)
        self._holds[(key, notification_id)] = hold
        first = owner not in self._reported
        self._reported.add(owner)
        return Decision(Verdict.HOLD, hold=hold, owner_back=first)

    def expire(self, now: float) -> list[Release]:
        """Fail open every owner with a hold past its deadline; release all its holds."""
        late = {h.owner for h in self._holds.values() if h.deadline <= now}
        self._failed_open |= late
        return self._release(lambda h: h.owner in late, ReleaseReason.FAIL_OPEN)

    def next_deadline(self) -> float | None:
        return min((h.deadline for h in self._holds.values()), default=None)

    def forget(self, key: str, notification_id: int) -> Hold | None:
        """The call vanished on its own (the caller was killed or interrupted)."""
        return self._holds.pop((key, notification_id), None)

    def drop_fd(self, key: str) -> list[Release]:
        return self._release(lambda h: h.key == key, ReleaseReason.FD_GONE)

    def release_all(self) -> list[Release]:
        return self._release(lambda _h: True, ReleaseReason.STOPPED)

    def holds(self) -> tuple[Hold, ...]:
        return tuple(self._holds.values())

    def is_held(self, key: str, notification: int) -> bool:
        """Whether the call ``notification`` of the notify fd ``key`` is held now."""
        return (key, notification) in self._holds

    def _release(self, which: Callable[[Hold], bool], reason: ReleaseReason) -> list[Release]:
        chosen = [k for k, h in self._holds.items() if which(h)]
        return [Release(self._holds.pop(k), reason) for k in chosen]


__all__ = [
    "ContinueReason",
    "Decision",
    "GuardPolicy",
    "Hold",
    "OwnerState",
    "Release",
    "ReleaseReason",
    "Verdict",
]
