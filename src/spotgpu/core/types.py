"""Enumerations and small value types shared by scheduler, agent, runtime and simulator.

Constants and pure helpers only; no side effects. Names and numbers follow the original
design (shared/seed sections 4, 5 and 7).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from spotgpu.core.errors import ValidationError


class Health(StrEnum):
    """A twin's health as the device plugin reports it (kubelet constants)."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


class PodDeviceType(StrEnum):
    """Pods that hold real GPUs for others."""

    SHADOW = "shadow"
    """Placeholder pod that holds unallocated real GPUs while spot pods use them."""
    SHARE = "share"
    """Inference pod whose GPUs other pods share."""


class QueueType(StrEnum):
    RESERVED = "reserved"
    SPOT = "spot"


class SpotPriority(StrEnum):
    """Spot priority classes; :attr:`value_int` is the scheduler weight (seed 5.2)."""

    SPOTHIGH = "spothigh"
    SPOTMID = "spotmid"
    SPOTLOW = "spotlow"

    @property
    def value_int(self) -> int:
        return _SPOT_PRIORITY_VALUES[self]

    @classmethod
    def parse(cls, text: object) -> SpotPriority:
        try:
            return cls(str(text))
        except ValueError:
            raise ValidationError(f"spot priority {text!r} is not one of {', '.join(p.value for p in cls)}") from None


_SPOT_PRIORITY_VALUES: Final = {
    SpotPriority.SPOTHIGH: 3000,
    SpotPriority.SPOTMID: 2000,
    SpotPriority.SPOTLOW: 1000,
}


class NodeStrategy(StrEnum):
    """Where a node prefers to place spot work (node annotation ``spot-prefer``; default ``auto``)."""

    AUTO = "auto"
    """Unallocated GPUs first; lent idle allocated GPUs only for spot work that unallocated GPUs
    cannot serve in the same cycle (otherwise it would wait)."""
    IDLE = "idle"
    """Prefer unallocated GPUs, exclusive spot first."""
    LOWPOWER = "lowpower"
    """Prefer lent idle allocated GPUs, shared spot first."""


class DurationPolicy(StrEnum):
    """Which running spot gangs to evict first by running duration."""

    SHORTEST = "shortest"
    """Evict the shortest-running first (least work lost); the default."""
    LONGEST = "longest"


class EvictionReason(StrEnum):
    OWNER_BACK = "OwnerBack"
    """The owner of a lent GPU started using it again."""
    RESERVED_PREEMPT = "ReservedPreempt"
    """A reserved task needs real GPUs held by spot work."""
    DEVICE_UNHEALTHY = "DeviceUnhealthy"
    """The real GPU failed."""
    RECOVERY = "Recovery"
    """Found on a returned owner's GPU after an agent restart."""
    UNGUARDED = "Unguarded"
    """The return guard stopped covering a lent owner (its notify fd is gone): the loan ends
    (``agent.lending.unguardedPolicy: refuse``)."""


class OwnerState(StrEnum):
    """What the agent believes about a real GPU's owner."""

    UNALLOCATED = "unallocated"
    ACTIVE = "active"
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class VictimWeights:
    """Weights of the victim-selection policy (seed 5.2 ``pluginParams``)."""

    priority_class: int = 100
    task_number: int = 10
    task_resource: int = 10
    running_duration: int = 10
    duration_policy: DurationPolicy = DurationPolicy.SHORTEST

    def __post_init__(self) -> None:
        for name in ("priority_class", "task_number", "task_resource", "running_duration"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValidationError(f"victim weight {name} must be a non-negative integer, got {value!r}")


GPU_MILLI: Final = 1000
"""One whole GPU in milli-GPU units (shared spot requests a fraction)."""

__all__ = [
    "GPU_MILLI",
    "DurationPolicy",
    "EvictionReason",
    "Health",
    "NodeStrategy",
    "OwnerState",
    "PodDeviceType",
    "QueueType",
    "SpotPriority",
    "VictimWeights",
]
