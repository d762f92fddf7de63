"""The documented rule that gives trace jobs a spot priority (the traces have none).

Pure; no I/O, no randomness (the ``hash`` rule hashes the job's trace identity). Rules:

* ``duration`` (the default): short jobs are the interactive, debugging kind the seed names
  as spot's first use ("short debugging tasks"), whose users want them back quickly and pay for
  the higher tier: ``duration < highBelow`` (1 h) -> spothigh, ``< midBelow`` (12 h) ->
  spotmid, longer -> spotlow (long batch runs, which should checkpoint). Because victims are
  chosen lowest priority first, this also protects short jobs, which lose little when evicted
  anyway, and exposes long ones, which is why their wasted GPU-hours are worth watching.
* ``hash``: a stable pseudo-random split with the given shares (``highShare``, ``midShare``,
  the rest spotlow), from SHA-256 of the job's origin (``elasticflow:cluster04:123``): the same
  job always gets the same tier, independent of size or duration.
* ``fixed``: every job gets ``fixed``.

A job that carries an explicit priority (inline jobs) keeps it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Final, Literal

from spotgpu.core.configfile import ConfigError, Seconds
from spotgpu.core.types import SpotPriority
from spotgpu.sim.workloads.base import TraceJob

_HIGH_BELOW: Final = Seconds(3600.0)
_MID_BELOW: Final = Seconds(12 * 3600.0)


@dataclasses.dataclass(frozen=True, slots=True)
class PriorityRule:
    """Scenario section ``priority:`` of a spot job stream."""

    rule: Literal["duration", "hash", "fixed"] = "duration"
    high_below: Seconds = _HIGH_BELOW
    mid_below: Seconds = _MID_BELOW
    high_share: float = 0.2
    mid_share: float = 0.3
    fixed: SpotPriority = SpotPriority.SPOTMID

    def __post_init__(self) -> None:
        if self.mid_below < self.high_below:
            raise ConfigError(f"midBelow: must not be shorter than highBelow ({self.high_below:g}s)")
        if self.high_share < 0 or self.mid_share < 0 or self.high_share + self.mid_share > 1:
            raise ConfigError("highShare: highShare and midShare must be >= 0 and add up to at most 1")

    def assign(self, job: TraceJob) -> SpotPriority:
        if job.priority is not None:
            return job.priority
        if self.rule == "fixed":
            return self.fixed
        if self.rule == "hash":
            digest = hashlib.sha256(job.origin.encode()).digest()
            u = int.from_bytes(digest[:8], "big") / 2.0**64
            if u < self.high_share:
                return SpotPriority.SPOTHIGH
            return SpotPriority.SPOTMID if u < self.high_share + self.mid_share else SpotPriority.SPOTLOW
        if job.duration < self.high_below:
            return SpotPriority.SPOTHIGH
        return SpotPriority.SPOTMID if job.duration < self.mid_below else SpotPriority.SPOTLOW


__all__ = ["PriorityRule"]
