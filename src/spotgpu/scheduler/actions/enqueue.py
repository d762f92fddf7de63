"""Enqueue action: admit Pending gangs (phase Pending -> Inqueue).

Pure decision code; its only effect is on the session (phases, statuses, reasons). A Pending
gang is admitted when no plugin objects (gang: enough pods exist; queue: its minimum fits under
the queue's capacity). A gang that already has ``min_member`` pods placed is marked Running.
"""

from __future__ import annotations

from typing import Final

from spotgpu.scheduler.framework import ACTIONS, Session
from spotgpu.scheduler.model import PodGroupPhase

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
            problem = session.enqueue_problem(job)
            if problem is None:
                session.set_status(job, PodGroupPhase.INQUEUE, "Enqueued")
            else:
                session.considered.add(job.ref)
                session.mark_unschedulable(job, f"not admitted: {problem}")


ACTIONS.register(NAME, EnqueueAction)
