"""Gang plugin: all or nothing, by ``min_member``.

Pure decision code; no side effects. A Pending gang is admitted only when at least
``min_member`` of its pods exist (until then: Wait); a gang is ready (its statement may commit) only when at least
``min_member`` of its pods are placed and not being evicted. A gang with pods still being evicted
is not admitted again until they are gone (an evicted gang is torn down and requeued whole).
Gangs that already wait on a nomination go first among equals, so GPUs freed for them are used
before anything else is tried.
"""

from __future__ import annotations

from typing import Final

from spotgpu.scheduler.framework import PLUGINS, SortKey
from spotgpu.scheduler.mirrors import JobState
from spotgpu.scheduler.session import Session
from spotgpu.scheduler.status import OK, Status

NAME: Final = "gang"


class GangPlugin:
    def __init__(self, session: Session) -> None:
        del session

    def enqueue_status(self, job: JobState) -> Status:
        have, want = len(job.tasks), job.group.min_member
        if have < want:
            return Status.wait(f"gang has {have} of min_member {want} pods; waiting for the rest to be created")
        evicting = sum(1 for t in job.tasks if t.evicting)
        if evicting:
            return Status.wait(f"{evicting} of its pods are still being evicted; waiting for the gang to be torn down")
        return OK

    def job_ready(self, job: JobState) -> bool:
        return job.ready >= job.group.min_member

    def job_key(self, job: JobState) -> SortKey:
        return (0 if any(t.nomination is not None for t in job.tasks) else 1,)


PLUGINS.register(NAME, GangPlugin)
