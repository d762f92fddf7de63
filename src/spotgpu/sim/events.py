"""The simulation's events: what the engine's heap holds, one frozen record per kind.

Pure data; no I/O. :class:`spotgpu.sim.simulation.Simulation` dispatches each on its type (a
``match`` over :data:`Event`) to the component that owns it: owners and the agent
(:mod:`spotgpu.sim.owners`), jobs (:mod:`spotgpu.sim.jobs`), the model's mutations
(:mod:`spotgpu.sim.apply`) and the core itself (cycles and ticks).
"""

from __future__ import annotations

from dataclasses import dataclass

from spotgpu.core.refs import PodRef


@dataclass(frozen=True, slots=True)
class OwnerStart:
    owner: int
    interval: int


@dataclass(frozen=True, slots=True)
class OwnerStop:
    owner: int
    interval: int


@dataclass(frozen=True, slots=True)
class IdlePoll:
    owner: int


@dataclass(frozen=True, slots=True)
class ReturnPoll:
    owner: int


@dataclass(frozen=True, slots=True)
class GuardSignal:
    owner: int


@dataclass(frozen=True, slots=True)
class EvictionDone:
    owner: int
    pods: tuple[PodRef, ...]


@dataclass(frozen=True, slots=True)
class OwnerDeadline:
    owner: int
    since: float


@dataclass(frozen=True, slots=True)
class JobArrival:
    job: int


@dataclass(frozen=True, slots=True)
class JobStart:
    job: int
    attempt: int


@dataclass(frozen=True, slots=True)
class JobFinish:
    job: int
    attempt: int


@dataclass(frozen=True, slots=True)
class PodsGone:
    job: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Requeue:
    job: int


@dataclass(frozen=True, slots=True)
class ShadowGone:
    shadow: PodRef


@dataclass(frozen=True, slots=True)
class Cycle:
    pass


@dataclass(frozen=True, slots=True)
class Tick:
    """Time-series sample, progress report and (every ``audit_every`` ticks) full audit."""

    n: int


OwnerEvent = OwnerStart | OwnerStop | IdlePoll | ReturnPoll | GuardSignal | EvictionDone | OwnerDeadline
JobEvent = JobArrival | JobStart | JobFinish | PodsGone | Requeue
Event = OwnerEvent | JobEvent | ShadowGone | Cycle | Tick

__all__ = [
    "Cycle",
    "Event",
    "EvictionDone",
    "GuardSignal",
    "IdlePoll",
    "JobArrival",
    "JobEvent",
    "JobFinish",
    "JobStart",
    "OwnerDeadline",
    "OwnerEvent",
    "OwnerStart",
    "OwnerStop",
    "PodsGone",
    "Requeue",
    "ReturnPoll",
    "ShadowGone",
    "Tick",
]
