"""Allocate action: place admitted gangs, all or nothing, best queue and gang first.

Pure decision code; it changes only the session (through statements). Reserved queues are served
first; then, when the preempt action is configured, reserved gangs that did not fit preempt at
once (so spot gangs placed later in this cycle never take GPUs a reserved gang could have had);
then spot queues. Within each, queues go by the queue plugins' order (fair share), re-evaluated
after every gang;
within a queue, gangs in the job plugins' order (priority, nominations, age). For a gang that
lacks ``need = min_member - placed`` pods, pending pods are placed one by one in a statement;
when ``need`` are placed and the gang is ready the statement commits (binds, ShadowPods, phase
Running), otherwise it is discarded and the gang gets a reason with a status code and, unless
that code says freed capacity cannot help (UnschedulableAndUnresolvable, Error), goes to
preemption. Members beyond ``min_member`` are left to backfill.
"""

from __future__ import annotations

import heapq
from typing import Final

from spotgpu.scheduler.actions.preempt import NAME as PREEMPT
from spotgpu.scheduler.actions.preempt import preempt_failed
from spotgpu.scheduler.decisions import PodGroupPhase
from spotgpu.scheduler.framework import ACTIONS, SortKey
from spotgpu.scheduler.mirrors import JobState, QueueState, TaskShape
from spotgpu.scheduler.session import Session
from spotgpu.scheduler.statement import Statement
from spotgpu.scheduler.status import Code, Status, combine

NAME: Final = "allocate"


def wants_allocation(session: Session, job: JobState) -> bool:
    if job.phase is PodGroupPhase.PENDING and "enqueue" in session.config.actions:
        return False
    return job.ready < job.group.min_member and any(t.node is None for t in job.tasks)


def place_gang(session: Session, job: JobState) -> bool:
    """Try to make ``job`` ready; commit or discard. Returns whether it was placed.

    A gang that does not fit gets a reason listing every distinct cause and the code
    :func:`~spotgpu.scheduler.status.combine` makes of theirs."""
    session.considered.add(job.ref)
    need = job.group.min_member - job.ready
    pending = job.pending()
    if len(pending) < need:
        session.mark_unschedulable(
            job,
            f"gang needs {need} more pods to reach min_member {job.group.min_member} but has {len(pending)} pending",
            Code.WAIT,
        )
        return False
    stmt = Statement(session)
    placed = 0
    problems: list[Status] = []
    failed: set[TaskShape] = set()
    for i, task in enumerate(pending):
        if placed >= need:
            break
        status = session.admit_status(task)
        if status.ok and task.nomination is None and task.shape in failed:
            continue
        if status.ok:
            found = session.find_node(task)
            if isinstance(found, Status):
                status = found
                failed.add(task.shape)
            else:
                status = stmt.place(task, found)
                if status.ok:
                    placed += 1
                    continue
        if all(p.reason != status.reason for p in problems):
            problems.append(status)
        if placed + len(pending) - i - 1 < need:
            break
    if placed >= need and session.job_ready(job):
        stmt.commit()
        session.gangs_placed += 1
        session.clear_unschedulable(job)
        if job.phase is not PodGroupPhase.RUNNING:
            session.set_status(job, PodGroupPhase.RUNNING, "Scheduled", f"{job.ready} pods placed")
        return True
    stmt.discard()
    session.mark_unschedulable(
        job,
        f"{placed} of {need} pods needed for min_member {job.group.min_member} fit: "
        + "; ".join(p.reason for p in problems),
        combine([p.code for p in problems]) if problems else Code.UNSCHEDULABLE,
    )
    return False


class AllocateAction:
    name = NAME

    def execute(self, session: Session) -> None:
        self._serve(session, spot=False)
        if PREEMPT in session.config.actions:
            # Reserved gangs that did not fit preempt before spot gangs take what is left, so
            # spot work placed in this cycle never stands in the way of reserved work.
            preempt_failed(session)
        self._serve(session, spot=True)

    @staticmethod
    def _serve(session: Session, *, spot: bool) -> None:
        per_queue: dict[str, list[JobState]] = {}
        for job in session.state.jobs.values():
            if job.spot == spot and wants_allocation(session, job):
                per_queue.setdefault(job.queue.queue.name, []).append(job)
        heap: list[tuple[SortKey, int, QueueState, list[JobState]]] = []
        for seq, (name, unsorted) in enumerate(sorted(per_queue.items())):
            queue = session.state.queues[name]
            jobs = session.sorted_jobs(unsorted)
            jobs.reverse()  # pop() from the end takes the best
            heap.append((session.queue_key(queue), seq, queue, jobs))
        heapq.heapify(heap)
        while heap:
            _, seq, queue, jobs = heapq.heappop(heap)
            job = jobs.pop()
            if not place_gang(session, job):
                session.failed.append(job)
            if jobs:
                heapq.heappush(heap, (session.queue_key(queue), seq, queue, jobs))


ACTIONS.register(NAME, AllocateAction)
