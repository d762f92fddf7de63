"""The documented rule that gives spot trace jobs a minimum lease (the traces have none).

Pure; no I/O, no randomness (the ``share`` split hashes the job's trace identity). A job's
``minLease`` asks the scheduler to place it only on GPUs expected to stay available that long:
unallocated GPUs, or lent GPUs whose owner's idle forecast (``p20``) covers it
(docs/scheduler.md, "Minimum leases and idle forecasts"). Rules (``minLease:`` of a spot stream):

* ``none`` (the default): no job declares one;
* ``fixed``: every job declares ``fixed``;
* ``duration``: a job declares ``fraction`` x its duration (the run time its user expects),
  within ``minimum`` .. ``maximum``: long jobs ask for long leases, short ones for short ones.

``share`` (default 1) is the fraction of jobs that declare one, a stable pseudo-random split
(SHA-256 of the job's origin): the same job always declares the same. A job that carries an
explicit ``minLease`` (inline jobs) keeps it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Final, Literal

from spotgpu.core.configfile import ConfigError, Seconds
from spotgpu.sim.workloads.base import TraceJob

_NONE: Final = Seconds(0.0)
_DAY: Final = Seconds(86400.0)


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseRule:
    """Scenario section ``minLease:`` of a spot job stream (see module docstring)."""

    rule: Literal["none", "fixed", "duration"] = "none"
    fixed: Seconds = _NONE
    fraction: float = 0.5
    minimum: Seconds = _NONE
    maximum: Seconds = _DAY
    share: float = 1.0

    def __post_init__(self) -> None:
        if self.fixed < 0 or self.minimum < 0:
            raise ConfigError("fixed: a lease must not be negative")
        if not 0 < self.fraction <= 10:
            raise ConfigError(f"fraction: must be within (0, 10], got {self.fraction}")
        if self.maximum < self.minimum:
            raise ConfigError(f"maximum: must not be shorter than minimum ({self.minimum:g}s)")
        if not 0 <= self.share <= 1:
            raise ConfigError(f"share: must be within 0..1, got {self.share}")

    def assign(self, job: TraceJob) -> float:
        """The minimum lease ``job`` declares, in seconds (0: none)."""
        if job.min_lease is not None:
            return job.min_lease
        if self.rule == "none" or not self._declares(job):
            return 0.0
        if self.rule == "fixed":
            return float(self.fixed)
        return float(min(self.maximum, max(self.minimum, self.fraction * job.duration)))

    def _declares(self, job: TraceJob) -> bool:
        if self.share >= 1:
            return True
        digest = hashlib.sha256(f"{job.origin}:minLease".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2.0**64 < self.share


__all__ = ["LeaseRule"]
