"""Workload sources of the simulator, one small module each, registered by name.

Importing this package registers the built-in sources: owners from ``helios`` (Helios Earth
per-team series), ``devmachine`` (synthetic work-day pattern), ``bursty`` (inference pods and
developers that come and go every few minutes) and ``inline``; jobs from
``elasticflow`` (ElasticFlow traces) and ``inline``. See :mod:`.base` for the extension points.
"""

from __future__ import annotations

from spotgpu.sim.workloads import bursty, devmachine, elasticflow, helios, inline
from spotgpu.sim.workloads.base import (
    EMBEDDED,
    JOB_SOURCES,
    OWNER_SOURCES,
    JobRequest,
    JobSource,
    OwnerRequest,
    OwnerSource,
    OwnerTrace,
    TraceJob,
    WorkloadError,
)
from spotgpu.sim.workloads.lease import LeaseRule
from spotgpu.sim.workloads.priority import PriorityRule

__all__ = [
    "EMBEDDED",
    "JOB_SOURCES",
    "OWNER_SOURCES",
    "JobRequest",
    "JobSource",
    "OwnerRequest",
    "OwnerSource",
    "OwnerTrace",
    "LeaseRule",
    "PriorityRule",
    "TraceJob",
    "WorkloadError",
    "bursty",
    "devmachine",
    "elasticflow",
    "helios",
    "inline",
]
