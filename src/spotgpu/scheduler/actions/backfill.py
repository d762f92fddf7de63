"""Backfill action: place the members of ready gangs beyond ``min_member``, one pod at a time.

Pure decision code; it changes only the session. After every gang had its chance at its minimum
(allocate, preempt), ready gangs (placed >= min_member) in gang order place their other pending
pods wherever they fit; each pod is its own statement, so one that does not fit costs nothing.
Backfilled pods never trigger preemption.
"""

from __future__ import annotations

from typing import Final

from spotgpu.scheduler.framework import ACTIONS
from spotgpu.scheduler.mirrors import TaskShape
from spotgpu.scheduler.session import Session
from spotgpu.scheduler.statement import Statement
from spotgpu.scheduler.status import Status

NAME: Final = "backfill"


class BackfillAction:
    name = NAME

    def execute(self, session: Session) -> None:
        ready = [
            j for j in session.state.jobs.values() if session.job_ready(j) and any(t.node is None for t in j.tasks)
        ]
        for job in session.sorted_jobs(ready):
            failed: set[TaskShape] = set()
            for task in job.pending():
                if task.shape in failed or not session.admit_status(task).ok:
                    continue
                found = session.find_node(task)
                if isinstance(found, Status):
                    failed.add(task.shape)
                    continue
                stmt = Statement(session)
                if stmt.place(task, found).ok:
                    stmt.commit()


ACTIONS.register(NAME, BackfillAction)
