"""Lending events and the lowpower detector: when is an owner away, when is it back.

Pure decision code; no I/O and no clock reads (every sample carries its own timestamp). The
agent feeds it samples it measured (NVML, exporters, process attribution) and the guard's
"owner back" signal; the simulator feeds it samples derived from traces. Both get the same
events.

Rules (seed 4.2 and 4.5, with the lending caveat of DESIGN.md):

* While the owner is *not* lent out, it is active when any of its GPUs shows utilization or
  any of the owner container's processes is on its GPUs.
* While lent out, utilization belongs to the spot work and is ignored: only the owner's own
  processes (attributed by cgroup / PID namespace) or the guard's signal count.
* Idle is reported once, after ``max_inactive_time`` without activity; busy is reported at
  once, on the first activity after idle.
* A sample whose measurements failed (``None``) never makes an owner idle: unknown is active
  ("when in doubt, fail closed": no lending on missing data).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import DeviceID
from spotgpu.core.refs import ContainerRef


class ActivitySource(StrEnum):
    UTILIZATION = "utilization"
    PROCESS = "process"
    GUARD = "guard"
    UNKNOWN = "unknown"
    """Measurements failed; treated as activity."""


@dataclass(frozen=True, slots=True)
class OwnerIdle:
    """The owner has been inactive for ``max_inactive_time``: its GPUs may be lent."""

    owner: ContainerRef
    devices: tuple[DeviceID, ...]
    at: float
    idle_since: float


@dataclass(frozen=True, slots=True)
class OwnerBusy:
    """The owner is back: evict the spot users of its GPUs, then give them back."""

    owner: ContainerRef
    devices: tuple[DeviceID, ...]
    at: float
    source: ActivitySource


LendingEvent = OwnerIdle | OwnerBusy


@dataclass(frozen=True, slots=True)
class ActivitySample:
    """One detection round for one owner.

    ``utilization_active``: any of the owner's GPUs shows utilization > 0 (``None``: unknown).
    ``owner_process_active``: a process of the owner container is on its GPUs (``None``: unknown).
    """

    at: float
    utilization_active: bool | None
    owner_process_active: bool | None


class LowpowerDetector:
    """Per-owner idle/busy state machine (see module docstring). Not thread-safe; one per owner."""

    def __init__(
        self, owner: ContainerRef, devices: tuple[DeviceID, ...], max_inactive_time: float, now: float
    ) -> None:
        if max_inactive_time < 0:
            raise ValidationError(f"max_inactive_time must not be negative, got {max_inactive_time}")
        if owner.is_relative:
            raise ValidationError(f"owner {owner} must name its namespace")
        self.owner = owner
        self.devices = devices
        self.max_inactive_time = max_inactive_time
        self.last_active = now
        self.idle = False

    def observe(self, sample: ActivitySample) -> LendingEvent | None:
        """Account one sample; return the event it causes, if any."""
        source = self._activity(sample)
        if source is not None:
            return self._active(sample.at, source)
        if not self.idle and sample.at - self.last_active >= self.max_inactive_time:
            self.idle = True
            return OwnerIdle(self.owner, self.devices, sample.at, self.last_active)
        return None

    def owner_back(self, at: float) -> OwnerBusy | None:
        """The guard caught the owner starting a GPU session."""
        return self._active(at, ActivitySource.GUARD)

    def _activity(self, sample: ActivitySample) -> ActivitySource | None:
        if sample.owner_process_active is None:
            return ActivitySource.UNKNOWN
        if sample.owner_process_active:
            return ActivitySource.PROCESS
        if self.idle:
            return None  # lent out: utilization is the spot work's
        if sample.utilization_active is None:
            return ActivitySource.UNKNOWN
        return ActivitySource.UTILIZATION if sample.utilization_active else None

    def _active(self, at: float, source: ActivitySource) -> OwnerBusy | None:
        self.last_active = max(self.last_active, at)
        if self.idle:
            self.idle = False
            return OwnerBusy(self.owner, self.devices, at, source)
        return None


__all__ = [
    "ActivitySample",
    "ActivitySource",
    "LendingEvent",
    "LowpowerDetector",
    "OwnerBusy",
    "OwnerIdle",
]
