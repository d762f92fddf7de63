"""Preempt action: reserved gangs that did not fit evict spot gangs and get the freed GPUs nominated.

Pure decision code; it changes only the session (through statements). For each reserved gang that
allocate could not place (and that allocate did not already send here before serving spot
queues), in gang order, :func:`spotgpu.scheduler.victims.preempt_gang` plans
victims for every task it still needs; all or nothing. Gangs whose failure code says freed
capacity cannot help (UnschedulableAndUnresolvable, Error) are not preempted for. A gang that
got GPUs nominated is reported with code Wait (its victims are going). On success: every pod of every victim gang
is evicted (reason ReservedPreempt), victims go back to Pending ("Preempted"), and the preemptor's
pods are nominated to the freed GPUs. A gang whose GPUs are already being freed (its earlier
victims are still terminating) gets the same nomination again and no new victim.
"""

from __future__ import annotations

from typing import Final

from spotgpu.scheduler.decisions import ClearNomination, PodGroupPhase
from spotgpu.scheduler.framework import ACTIONS
from spotgpu.scheduler.session import Session
from spotgpu.scheduler.status import Code
from spotgpu.scheduler.victims import preempt_gang

NAME: Final = "preempt"


_HOPELESS = (Code.UNRESOLVABLE, Code.ERROR)


def preempt_failed(session: Session) -> None:
    """Preempt for every reserved gang allocate could not place and that was not handled yet
    (not for gangs whose failure freed capacity cannot change: UnschedulableAndUnresolvable, Error)."""
    for job in session.sorted_jobs(j for j in session.failed if not j.spot and j.ref not in session.preempted):
        session.preempted.add(job.ref)
        if job.ready >= job.group.min_member or not job.pending():
            continue
        if session.codes.get(job.ref) in _HOPELESS and all(t.nomination is None for t in job.tasks):
            continue  # freeing GPUs cannot help (a nominated gang is re-planned, so its nomination goes)
        outcome = preempt_gang(session, job)
        before = session.unschedulable.get(job.ref, "")
        if not outcome.possible:
            code = session.codes.get(job.ref, Code.UNSCHEDULABLE)
            session.mark_unschedulable(
                job, f"{before}; preemption: {outcome.reason}" if before else outcome.reason, code
            )
            for task in job.tasks:
                if task.pod.nominated is not None and task.nomination is not None and task.node is None:
                    session.state.unnominate(task)
                    session.cleared.setdefault(
                        task.ref, ClearNomination(task.ref, f"preemption no longer possible: {outcome.reason}")
                    )
            continue
        outcome.statement.commit()
        session.gangs_preempting += 1
        names = sorted({str(v.ref) for v in outcome.victims})
        for victim in outcome.victims:
            session.set_status(victim, PodGroupPhase.PENDING, "Preempted", f"evicted for reserved PodGroup {job.ref}")
        waiting = len({t.ref for t in outcome.waiting})
        parts = []
        if names:
            parts.append(
                f"evicting {len(names)} spot gangs ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
            )
        if waiting:
            parts.append(f"waiting for {waiting} pods already being evicted")
        what = " and ".join(parts) or "waiting for nominated GPUs to be released"
        session.mark_unschedulable(job, f"preempting: {what}; {len(outcome.nominated)} pods nominated", Code.WAIT)


class PreemptAction:
    name = NAME

    def execute(self, session: Session) -> None:
        preempt_failed(session)


ACTIONS.register(NAME, PreemptAction)
