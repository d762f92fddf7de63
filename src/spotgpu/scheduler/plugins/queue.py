"""Queue plugin: fair share between queues and queue capacity.

Pure decision code; no side effects. Queues of one type are served in order of their share,
``allocated GPU milli / weight`` (smallest first), re-evaluated after every gang. A queue with a
``capacity_milli`` admits a gang only if its minimum fits under the cap, and a pod only if the
queue's allocation plus the pod's request stays within it.
"""

from __future__ import annotations

from typing import Final

from spotgpu.scheduler.framework import PLUGINS, SortKey
from spotgpu.scheduler.mirrors import JobState, QueueState, TaskState
from spotgpu.scheduler.session import Session
from spotgpu.scheduler.status import OK, Status

NAME: Final = "queue"


class QueuePlugin:
    def __init__(self, session: Session) -> None:
        del session

    def queue_key(self, queue: QueueState) -> SortKey:
        return (queue.allocated_milli / queue.queue.weight,)

    def enqueue_status(self, job: JobState) -> Status:
        queue = job.queue
        cap = queue.queue.capacity_milli
        if cap is None:
            return OK
        need = max(0, job.group.min_member - job.ready)
        sizes = sorted(t.request_milli for t in job.pending())[:need]
        want = sum(sizes)
        if queue.allocated_milli + want > cap:
            reason = (
                f"queue {queue.queue.name!r} is over capacity: {queue.allocated_milli} of {cap} milli in use, "
                f"the gang needs {want} more"
            )
            return Status.unresolvable(reason) if want > cap else Status.unschedulable(reason)
        return OK

    def admit_status(self, task: TaskState) -> Status:
        queue = task.job.queue
        cap = queue.queue.capacity_milli
        if cap is not None and queue.allocated_milli + task.request_milli > cap:
            reason = f"queue {queue.queue.name!r} capacity {cap} milli reached ({queue.allocated_milli} in use)"
            return Status.unresolvable(reason) if task.request_milli > cap else Status.unschedulable(reason)
        return OK


PLUGINS.register(NAME, QueuePlugin)
