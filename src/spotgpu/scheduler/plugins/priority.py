"""Priority plugin: higher-priority gangs first within a queue.

Pure ordering; no side effects. A reserved gang's priority is its priority-class value; a spot
gang's is its spot tier (spothigh 3000, spotmid 2000, spotlow 1000).
"""

from __future__ import annotations

from typing import Final

from spotgpu.scheduler.framework import PLUGINS, SortKey
from spotgpu.scheduler.mirrors import JobState
from spotgpu.scheduler.session import Session

NAME: Final = "priority"


class PriorityPlugin:
    def __init__(self, session: Session) -> None:
        del session

    def job_key(self, job: JobState) -> SortKey:
        return (-job.priority,)


PLUGINS.register(NAME, PriorityPlugin)
