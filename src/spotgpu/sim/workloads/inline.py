"""Owners and jobs written out in the scenario file itself (``source: inline``).

Pure: no I/O, no randomness. For small what-if cases, regression scenarios and tests whose
outcome is computed by hand::

    owners:
      - name: dev
        source: inline
        nodes: 1
        gpusPerOwner: 8
        inline:
          owners:
            - active: [{start: 0s, end: 1h}, {start: 3h, end: 4h}]
    spotJobs:
      - name: batch
        source: inline
        inline:
          jobs:
            - {arrival: 20m, duration: 30m, gpus: 8, priority: spotmid, minLease: 20m}
"""

from __future__ import annotations

import dataclasses
from typing import Final

from spotgpu.core.configfile import ConfigError, Seconds
from spotgpu.core.types import SpotPriority
from spotgpu.sim.workloads.base import (
    JOB_SOURCES,
    OWNER_SOURCES,
    JobRequest,
    OwnerRequest,
    OwnerTrace,
    TraceJob,
    WorkloadError,
    merge_intervals,
)

NAME: Final = "inline"


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    start: Seconds
    end: Seconds

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ConfigError(f"end: must be after start ({self.start:g}s), got {self.end:g}s")


@dataclasses.dataclass(frozen=True, slots=True)
class InlineOwner:
    active: tuple[Span, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class InlineOwners:
    """Scenario section ``inline:`` of an owner group: one entry per owner, in slot order."""

    owners: tuple[InlineOwner, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class InlineJob:
    arrival: Seconds
    duration: Seconds
    gpus: int
    priority: SpotPriority | None = None
    min_lease: Seconds | None = None

    def __post_init__(self) -> None:
        if self.min_lease is not None and self.min_lease < 0:
            raise ConfigError("minLease: must not be negative")
        if self.duration <= 0:
            raise ConfigError("duration: must be greater than zero")
        if self.gpus < 1:
            raise ConfigError(f"gpus: must be at least 1, got {self.gpus}")


@dataclasses.dataclass(frozen=True, slots=True)
class InlineJobs:
    """Scenario section ``inline:`` of a job stream."""

    jobs: tuple[InlineJob, ...]


class InlineOwnerSource:
    config_type = InlineOwners

    def build(self, config: InlineOwners, request: OwnerRequest) -> list[OwnerTrace]:
        if len(config.owners) != request.count:
            raise WorkloadError(
                f"inline.owners: lists {len(config.owners)} owner(s) but the group has room for {request.count}"
                " (nodes x gpusPerNode / gpusPerOwner)"
            )
        return [
            OwnerTrace(
                f"{request.group}-{i:05d}",
                request.gpus_per_owner,
                merge_intervals(((s.start, s.end) for s in owner.active), request.horizon),
                f"{NAME}:{i}",
            )
            for i, owner in enumerate(config.owners)
        ]


class InlineJobSource:
    config_type = InlineJobs

    def build(self, config: InlineJobs, request: JobRequest) -> list[TraceJob]:
        if request.target_gpu_seconds is not None or (request.scale is not None and request.scale != 1.0):
            raise WorkloadError(f"{request.stream}: inline jobs are taken as written; drop 'load' and 'scale'")
        jobs = [
            TraceJob(
                f"{NAME}:{request.stream}:{i}",
                j.arrival,
                j.duration,
                j.gpus,
                j.priority,
                None if j.min_lease is None else float(j.min_lease),
            )
            for i, j in enumerate(config.jobs)
        ]
        too_big = [j.origin for j in jobs if j.gpus > request.max_gpus]
        if too_big:
            raise WorkloadError(
                f"{request.stream}: jobs {too_big} ask for more than the cluster's {request.max_gpus} GPUs"
            )
        return sorted(jobs, key=lambda j: (j.arrival, j.origin))


OWNER_SOURCES.register(NAME, InlineOwnerSource())
JOB_SOURCES.register(NAME, InlineJobSource())

__all__ = [
    "NAME",
    "InlineJob",
    "InlineJobSource",
    "InlineJobs",
    "InlineOwner",
    "InlineOwnerSource",
    "InlineOwners",
    "Span",
]
