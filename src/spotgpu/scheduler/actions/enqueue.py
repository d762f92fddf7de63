"""Enqueue action: admit Pending gangs (phase Pending -> Inqueue).

Pure decision code; its only effect is on the session (phases, statuses, reasons). A Pending
gang is admitted when no plugin objects (gang: enough pods exist, none is being evicted, else
Wait; queue: its minimum fits under the queue's capacity, else Unschedulable). The gang's
result entry carries the refusing plugin's code. A gang that already has ``min_member`` pods
placed is marked Running.
"""

from __future__ import annotations

from typing import Final

from spotgpu.scheduler.decisions import PodGroupPhase
from spotgpu.scheduler.framework import ACTIONS
from spotgpu.scheduler.session import Session

NAME: Final = "enqueue"


class EnqueueAction:
    name = NAME

    def execute(self, session: Session) -> None:
        for job in session.sorted_jobs(session.state.jobs.values()):
            if job.phase is PodGroupPhase.RUNNING:
                continue
            if session.job_ready(job):
                session.set_status(job, PodGroupPhase.RUNNING, "Scheduled", "min_member pods are placed")
                continue
            if job.phase is not PodGroupPhase.PENDING:
                continue
            status = session.enqueue_status(job)
            if status.ok:
                session.set_status(job, PodGroupPhase.INQUEUE, "Enqueued")
            else:
                session.considered.add(job.ref)
                session.mark_unschedulable(job, f"not admitted: {status.reason}", status.code)


ACTIONS.register(NAME, EnqueueAction)
