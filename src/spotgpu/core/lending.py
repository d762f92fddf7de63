"""The lending state machine: one owner's lend / return life, as a pure function.

``transition(state, event, now, rules) -> (state, actions)``; no I/O and no clock reads. The
agent's solver (:mod:`spotgpu.agent.solver`) and the simulator (:mod:`spotgpu.sim.lending`)
both call it and apply the actions it returns: the same decisions in a cluster and in a
simulation. docs/agent.md ("The lending state machine") has the table of states, events and
actions; in short:

States (:class:`LendState`): ``active`` (twins Unhealthy), ``lent`` (twins Healthy, guard
armed), ``evicting`` (twins Unhealthy, spot work being stopped, the owner's call held).

Events: :class:`Sample` (one detection round: an :class:`ActivitySample` and whether the return
guard covers the owner), :class:`GuardSignal`, :class:`EvictionDone` (the owner was released),
:class:`ArmFailed`, :class:`Violation` (spot users found where they may not be),
:class:`Gone`, :class:`DevicesChanged`, and :class:`Recovered` for a fresh state after an agent
start.

Actions, applied in order: :class:`Lent` / :class:`NotLent` (reports: logs, metrics, events),
:class:`Arm`, :class:`Disarm`, :class:`Persist` (the lending record), :class:`Publish` (twin
health and the node annotation), :class:`Evict`, :class:`Forget`. When :class:`Arm` fails the
caller skips the rest of that list and feeds :class:`ArmFailed`.

Activity rules (unchanged from the lowpower detector of seed 4.2 / 4.5):

* while not lent, the owner is active when any of its GPUs shows utilization or any of the
  owner container's processes is on them; while lent, utilization belongs to the spot work and
  only the owner's own processes (or the guard's signal) count;
* a measurement that failed (``None``) is activity: no lending on missing data;
* the idle judgement happens on a sample at least ``maxInactiveTime`` after the last activity
  (and not before ``retry_at``); the return is reported at once.

Lend rule: an owner the guard does not cover is not lent (``unguardedPolicy: refuse``,
:class:`NotLent` ``unguarded``), and a lent owner whose coverage is lost is evicted
(reason ``Unguarded``); ``pollOnly`` lends it anyway. Under the ``timer`` policy a covered owner
is lent at the first judgement; under ``predictive``, when :func:`spotgpu.core.idle_forecast.judge`
agrees. The owner's idle history learns every idle period that reached a judgement (the return
ends it, whether the owner was lent or not) and the backoff every loan that ended with the
owner's return.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Final

from spotgpu.core.config import LendingConfig, LendPolicyKind, UnguardedPolicy
from spotgpu.core.errors import ValidationError
from spotgpu.core.idle_forecast import (
    EMPTY_HISTORY,
    NO_BACKOFF,
    Backoff,
    IdleHistory,
    Refusal,
    after_loan,
    judge,
    observe,
    remainder,
)
from spotgpu.core.ids import DeviceID
from spotgpu.core.refs import ContainerRef
from spotgpu.core.types import EvictionReason, OwnerState


class ActivitySource(StrEnum):
    UTILIZATION = "utilization"
    PROCESS = "process"
    GUARD = "guard"
    UNKNOWN = "unknown"
    """Measurements failed; treated as activity."""


@dataclass(frozen=True, slots=True)
class ActivitySample:
    """One detection round for one owner.

    ``utilization_active``: any of the owner's GPUs shows utilization > 0 (``None``: unknown).
    ``owner_process_active``: a process of the owner container is on its GPUs (``None``: unknown).
    """

    at: float
    utilization_active: bool | None
    owner_process_active: bool | None


class LendState(StrEnum):
    """One owner container's lending state."""

    ACTIVE = "active"
    """Using its GPUs (or not yet judged idle): twins Unhealthy, nothing lent."""
    LENT = "lent"
    """Judged idle and lent: twins Healthy, guard armed, spot work may run."""
    EVICTING = "evicting"
    """Back: twins Unhealthy, spot work being stopped; the guard holds the owner's call."""

    @property
    def owner_state(self) -> OwnerState:
        return OwnerState.IDLE if self is LendState.LENT else OwnerState.ACTIVE


@dataclass(frozen=True, slots=True)
class LendRules:
    """What the state machine decides by: the idle timer and ``agent.lending``."""

    max_inactive_time: float
    lending: LendingConfig = field(default_factory=LendingConfig)

    def __post_init__(self) -> None:
        if self.max_inactive_time < 0:
            raise ValidationError(f"max_inactive_time must not be negative, got {self.max_inactive_time}")


@dataclass(frozen=True, slots=True)
class OwnerLending:
    """One owner's state (see module docstring); build with :func:`new_owner`."""

    owner: ContainerRef
    devices: tuple[DeviceID, ...]
    last_active: float
    """When activity was last seen (the current idle period started then)."""
    state: LendState = LendState.ACTIVE
    judged: bool = False
    """The current idle period reached a judgement (its end will be learned)."""
    retry_at: float = 0.0
    """No judgement before this (a refusal's earliest possible change)."""
    refused: Refusal | None = None
    """Why the current idle period is not lent (reported once per reason and period)."""
    lent_at: float | None = None
    poll_only: bool = False
    """Lent without the guard's coverage (``unguardedPolicy: pollOnly``)."""
    gone: bool = False
    """The owner's pod went away during an eviction: forgotten when it is released."""
    history: IdleHistory = EMPTY_HISTORY
    backoff: Backoff = NO_BACKOFF


# --- events -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    activity: ActivitySample
    covered: bool
    """The return guard holds a notify fd of this owner (it can catch its return)."""


@dataclass(frozen=True, slots=True)
class GuardSignal:
    """The guard caught the owner starting a GPU session."""


@dataclass(frozen=True, slots=True)
class EvictionDone:
    """The eviction's GPUs are clean; the owner is released."""


@dataclass(frozen=True, slots=True)
class ArmFailed:
    """Arming the guard for a loan failed: the loan does not happen."""


@dataclass(frozen=True, slots=True)
class Violation:
    """Spot users on the owner's GPUs whose twins are not Healthy (GPU failed, recovery, ...)."""

    reason: EvictionReason


@dataclass(frozen=True, slots=True)
class Gone:
    """The owner no longer holds GPUs (its pod went away)."""


@dataclass(frozen=True, slots=True)
class DevicesChanged:
    devices: tuple[DeviceID, ...]


@dataclass(frozen=True, slots=True)
class Recovered:
    """After an agent start, for a fresh state: was the owner lent before (spot users on its
    GPUs, or the lending record), since when, and does the guard cover it now?"""

    lent: bool
    covered: bool
    lent_at: float | None = None


Event = Sample | GuardSignal | EvictionDone | ArmFailed | Violation | Gone | DevicesChanged | Recovered


# --- actions ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lent:
    """Report: the owner is lent now, idle for ``idle_for`` seconds."""

    owner: ContainerRef
    devices: tuple[DeviceID, ...]
    idle_for: float


@dataclass(frozen=True, slots=True)
class NotLent:
    """Report: an idle (or lent) owner is not lent, and why."""

    owner: ContainerRef
    reason: Refusal


@dataclass(frozen=True, slots=True)
class Arm:
    owner: ContainerRef


@dataclass(frozen=True, slots=True)
class Disarm:
    owner: ContainerRef


@dataclass(frozen=True, slots=True)
class Persist:
    """Write the lending record (which owners are lent, what they taught the model)."""


@dataclass(frozen=True, slots=True)
class Publish:
    """Recompute and publish twin health (device plugin list, node annotation)."""


@dataclass(frozen=True, slots=True)
class Evict:
    """Evict the spot users of the owner's GPUs, then feed :class:`EvictionDone`."""

    owner: ContainerRef
    devices: tuple[DeviceID, ...]
    reason: EvictionReason
    at: float
    source: ActivitySource | None = None
    """What showed the owner's return (``OwnerBack`` only)."""


@dataclass(frozen=True, slots=True)
class Forget:
    """Drop the owner's state."""

    owner: ContainerRef


Action = Lent | NotLent | Arm | Disarm | Persist | Publish | Evict | Forget
Actions = tuple[Action, ...]
PERSIST: Final = Persist()
PUBLISH: Final = Publish()


def new_owner(
    owner: ContainerRef,
    devices: tuple[DeviceID, ...],
    now: float,
    history: IdleHistory = EMPTY_HISTORY,
    backoff: Backoff = NO_BACKOFF,
) -> OwnerLending:
    """A newly seen owner: active, its idle timer starting ``now``, with what it taught before."""
    if owner.is_relative:
        raise ValidationError(f"owner {owner} must name its namespace")
    return OwnerLending(owner, devices, now, history=history, backoff=backoff)


# --- the transition -----------------------------------------------------------------------------


def transition(s: OwnerLending, event: Event, now: float, rules: LendRules) -> tuple[OwnerLending, Actions]:
    """The owner's next state and the actions to apply, in order (see module docstring)."""
    handler = _HANDLERS[type(event)]
    return handler(s, event, now, rules)


def activity(sample: ActivitySample, lent: bool) -> ActivitySource | None:
    """What in ``sample`` counts as the owner's activity (None: nothing)."""
    if sample.owner_process_active is None:
        return ActivitySource.UNKNOWN
    if sample.owner_process_active:
        return ActivitySource.PROCESS
    if lent:
        return None  # lent out: utilization is the spot work's
    if sample.utilization_active is None:
        return ActivitySource.UNKNOWN
    return ActivitySource.UTILIZATION if sample.utilization_active else None


def _sample(s: OwnerLending, event: Event, now: float, rules: LendRules) -> tuple[OwnerLending, Actions]:
    assert isinstance(event, Sample)
    if s.state is LendState.EVICTING:
        return s, ()
    source = activity(event.activity, s.state is LendState.LENT)
    if s.state is LendState.LENT:
        if source is not None:
            return _owner_back(s, now, source, rules)
        if event.covered == (not s.poll_only):
            return s, ()
        if event.covered or rules.lending.unguarded_policy is UnguardedPolicy.POLL_ONLY:
            return replace(s, poll_only=not event.covered), ()
        lost = (PUBLISH, NotLent(s.owner, Refusal.UNGUARDED), _evict(s, now, EvictionReason.UNGUARDED))
        return _evicting(s), lost  # coverage lost: the loan ends (fail closed)
    if source is not None:
        learned = s.judged and source is not ActivitySource.UNKNOWN
        after = replace(
            s,
            last_active=max(s.last_active, now),
            judged=False,
            retry_at=0.0,
            refused=None,
            history=observe(s.history, now - s.last_active, rules.lending.predictive.memory) if learned else s.history,
        )
        return after, (PERSIST,) if learned else ()
    if now - s.last_active < rules.max_inactive_time or now < s.retry_at:
        return s, ()
    return _judge(replace(s, judged=True), now, event.covered, rules)


def _judge(s: OwnerLending, now: float, covered: bool, rules: LendRules) -> tuple[OwnerLending, Actions]:
    lending = rules.lending
    if not covered and lending.unguarded_policy is UnguardedPolicy.REFUSE:
        return _refuse(s, Refusal.UNGUARDED, 0.0)
    if lending.policy is LendPolicyKind.PREDICTIVE:
        verdict = judge(
            s.history,
            s.backoff,
            idle_start=s.last_active,
            now=now,
            gate=rules.max_inactive_time,
            config=lending.predictive,
        )
        if verdict.refusal is not None:
            return _refuse(s, verdict.refusal, verdict.retry_at)
    lent = replace(s, state=LendState.LENT, lent_at=now, refused=None, retry_at=0.0, poll_only=not covered)
    return lent, (Lent(s.owner, s.devices, now - s.last_active), Arm(s.owner), PERSIST, PUBLISH)


def _refuse(s: OwnerLending, reason: Refusal, retry_at: float) -> tuple[OwnerLending, Actions]:
    report: Actions = () if s.refused is reason else (NotLent(s.owner, reason),)
    return replace(s, refused=reason, retry_at=retry_at), report


def _evicting(s: OwnerLending, **changes: object) -> OwnerLending:
    return replace(s, state=LendState.EVICTING, judged=False, lent_at=None, poll_only=False, **changes)  # type: ignore[arg-type]


def _evict(s: OwnerLending, now: float, reason: EvictionReason, source: ActivitySource | None = None) -> Evict:
    return Evict(s.owner, s.devices, reason, now, source)


def _owner_back(s: OwnerLending, now: float, source: ActivitySource, rules: LendRules) -> tuple[OwnerLending, Actions]:
    """A lent owner is back: twins Unhealthy, evict; learn the idle period and the loan."""
    predictive = rules.lending.predictive
    history, backoff = s.history, s.backoff
    if source is not ActivitySource.UNKNOWN:
        history = observe(history, now - s.last_active, predictive.memory)
        backoff = after_loan(backoff, now - (s.lent_at if s.lent_at is not None else now), now, predictive)
    after = _evicting(s, last_active=max(s.last_active, now), history=history, backoff=backoff)
    return after, (PUBLISH, _evict(s, now, EvictionReason.OWNER_BACK, source))


def _guard_signal(s: OwnerLending, event: Event, now: float, rules: LendRules) -> tuple[OwnerLending, Actions]:
    if s.state is LendState.LENT:
        return _owner_back(s, now, ActivitySource.GUARD, rules)
    if s.state is LendState.ACTIVE:
        return s, (Disarm(s.owner),)  # nothing lent: let its call go
    return s, ()  # an eviction is running; it releases the call when done


def _eviction_done(s: OwnerLending, event: Event, now: float, rules: LendRules) -> tuple[OwnerLending, Actions]:
    if s.state is not LendState.EVICTING:
        return s, ()
    after = replace(s, state=LendState.ACTIVE)
    if s.gone:
        return after, (Disarm(s.owner), Forget(s.owner), PUBLISH, PERSIST)
    return after, (Disarm(s.owner), PUBLISH, PERSIST)


def _arm_failed(s: OwnerLending, event: Event, now: float, rules: LendRules) -> tuple[OwnerLending, Actions]:
    if s.state is not LendState.LENT:
        return s, ()
    return replace(s, state=LendState.ACTIVE, last_active=now, judged=False, lent_at=None, poll_only=False), ()


def _violation(s: OwnerLending, event: Event, now: float, rules: LendRules) -> tuple[OwnerLending, Actions]:
    assert isinstance(event, Violation)
    if s.state is LendState.EVICTING:
        return s, ()
    return _evicting(s), (PUBLISH, _evict(s, now, event.reason))


def _gone(s: OwnerLending, event: Event, now: float, rules: LendRules) -> tuple[OwnerLending, Actions]:
    if s.state is LendState.EVICTING:
        return replace(s, gone=True), ()
    if s.state is LendState.LENT:
        return s, (Disarm(s.owner), Forget(s.owner))
    return s, (Forget(s.owner),)


def _devices(s: OwnerLending, event: Event, now: float, rules: LendRules) -> tuple[OwnerLending, Actions]:
    assert isinstance(event, DevicesChanged)
    return replace(s, devices=event.devices), ()


def _recovered(s: OwnerLending, event: Event, now: float, rules: LendRules) -> tuple[OwnerLending, Actions]:
    assert isinstance(event, Recovered)
    if not event.lent or s.state is not LendState.ACTIVE:
        return s, ()
    if not event.covered and rules.lending.unguarded_policy is UnguardedPolicy.REFUSE:
        return _refuse(s, Refusal.UNGUARDED, 0.0)
    lent_at = event.lent_at if event.lent_at is not None else now
    lent = replace(s, state=LendState.LENT, lent_at=min(lent_at, now), last_active=now, poll_only=not event.covered)
    return lent, (Arm(s.owner),)


_Handler = Callable[[OwnerLending, Event, float, LendRules], tuple[OwnerLending, Actions]]
_HANDLERS: Final[dict[type, _Handler]] = {
    Sample: _sample,
    GuardSignal: _guard_signal,
    EvictionDone: _eviction_done,
    ArmFailed: _arm_failed,
    Violation: _violation,
    Gone: _gone,
    DevicesChanged: _devices,
    Recovered: _recovered,
}


# --- questions about a state --------------------------------------------------------------------


def judge_at(s: OwnerLending, rules: LendRules) -> float:
    """The earliest time a sample can lend this (active) owner, if it stays idle (``inf``: never
    without new evidence). The simulator polls then; the agent's polls before it are no-ops."""
    return max(s.last_active + rules.max_inactive_time, s.retry_at)


@dataclass(frozen=True, slots=True)
class IdleForecast:
    """A lent owner's predicted idle remainder, in whole seconds (floored to :data:`FORECAST_STEP`
    steps, so a published value changes rarely and errs short)."""

    expected: int
    p20: int


FORECAST_STEP: Final = 1.25
"""Published forecasts are floored to 60 s * 1.25^k (20% resolution); below 60 s they are 0."""


def _floor_step(seconds: float) -> int:
    if not seconds >= 60.0:
        return 0
    k = math.floor(math.log(seconds / 60.0, FORECAST_STEP) + 1e-9)
    return int(60.0 * FORECAST_STEP**k)


def idle_forecast(s: OwnerLending, now: float, rules: LendRules) -> IdleForecast | None:
    """For a lent owner, the predicted rest of its idle period (None when it is not lent)."""
    if s.state is not LendState.LENT:
        return None
    f = remainder(s.history, rules.lending.predictive, now - s.last_active)
    return IdleForecast(_floor_step(f.expected), _floor_step(f.p20))


def node_forecasts(states: Iterable[OwnerLending], now: float, rules: LendRules) -> dict[DeviceID, IdleForecast]:
    """Per real device of a lent owner among ``states``, its owner's :func:`idle_forecast`."""
    out: dict[DeviceID, IdleForecast] = {}
    for s in states:
        forecast = idle_forecast(s, now, rules)
        if forecast is not None:
            out.update(dict.fromkeys(s.devices, forecast))
    return out


__all__ = [
    "FORECAST_STEP",
    "Action",
    "Actions",
    "ActivitySample",
    "ActivitySource",
    "Arm",
    "ArmFailed",
    "DevicesChanged",
    "Disarm",
    "Event",
    "Evict",
    "EvictionDone",
    "Forget",
    "Gone",
    "GuardSignal",
    "IdleForecast",
    "LendRules",
    "LendState",
    "Lent",
    "NotLent",
    "OwnerLending",
    "Persist",
    "Publish",
    "Recovered",
    "Sample",
    "Violation",
    "activity",
    "idle_forecast",
    "judge_at",
    "new_owner",
    "node_forecasts",
    "transition",
]
