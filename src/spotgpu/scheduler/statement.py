"""Statements: the tentative changes of one gang, applied at once, then committed or undone exactly.

Pure decision code; it changes only the session state. Its operations change the state at once
(later tasks see them) and are recorded; :meth:`Statement.commit` turns them into decisions,
:meth:`Statement.discard` undoes them, newest first. A placement runs the session's Reserve
plugins (the spot plugin lets a ShadowPod hold the unallocated GPUs a spot task takes); undoing
it calls their ``unreserve``.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from spotgpu.core.ids import SPOT_GPU_RESOURCE
from spotgpu.core.types import EvictionReason
from spotgpu.scheduler.decisions import Bind, ClearNomination, DeviceOwner, Evict, Nominate
from spotgpu.scheduler.framework import Placement, ReservePlugin
from spotgpu.scheduler.mirrors import GPUState, JobState, NodeState, TaskKind, TaskState
from spotgpu.scheduler.session import Session
from spotgpu.scheduler.status import OK, Status


@dataclass(frozen=True, slots=True)
class _Place:
    task: TaskState


@dataclass(frozen=True, slots=True)
class _Reserve:
    plugin: ReservePlugin
    task: TaskState
    placement: Placement


@dataclass(frozen=True, slots=True)
class _Evict:
    task: TaskState
    preemptor: JobState
    message: str


@dataclass(frozen=True, slots=True)
class _Nominate:
    task: TaskState
    previous: tuple[NodeState, list[GPUState]] | None
    renominated: bool
    """False: the nomination was only released (the task was placed)."""


_Op = _Place | _Reserve | _Evict | _Nominate


class Statement:
    """Tentative operations of one gang: applied at once, turned into decisions or undone."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.state = session.state
        self._ops: list[_Op] = []
        self.scratch: dict[Hashable, object] = {}
        """Per-statement notes of Reserve plugins (what to reuse and what to undo), keyed by them."""

    def place(self, task: TaskState, placement: Placement) -> Status:
        """Reserve for ``task`` (Reserve plugins, in order), then place it tentatively; a refused
        reservation undoes the reservations before it and places nothing."""
        ns, gpus = placement.node, placement.gpus
        state = self.state
        mark = len(self._ops)
        if task.nomination is not None:
            self._ops.append(_Nominate(task, state.unnominate(task), renominated=False))
        for plugin in self.session.reserves:
            status = plugin.reserve(self, task, placement)
            if not status.ok:
                self._undo(mark)
                return status
            self._ops.append(_Reserve(plugin, task, placement))
        state.place(task, ns, gpus)
        self._ops.append(_Place(task))
        return OK

    def evict_job(self, job: JobState, preemptor: JobState, message: str) -> int:
        """Mark every live placed pod of ``job`` as evicted; returns how many."""
        n = 0
        for task in job.tasks:
            if task.node is not None and not task.evicting and not task.tentative:
                self.state.set_evicting(task, True)
                self._ops.append(_Evict(task, preemptor, message))
                n += 1
        return n

    def nominate(self, task: TaskState, node: NodeState, gpus: list[GPUState]) -> None:
        previous = self.state.unnominate(task)
        self.state.nominate(task, node, gpus)
        self._ops.append(_Nominate(task, previous, renominated=True))

    def _undo(self, mark: int) -> None:
        """Undo the operations after the first ``mark``, newest first."""
        state = self.state
        while len(self._ops) > mark:
            op = self._ops.pop()
            if isinstance(op, _Place):
                state.unplace(op.task)
            elif isinstance(op, _Reserve):
                op.plugin.unreserve(self, op.task, op.placement)
            elif isinstance(op, _Evict):
                state.set_evicting(op.task, False)
                state.capacity_epoch += 1
            else:
                if op.renominated:
                    state.unnominate(op.task)
                if op.previous is not None:
                    state.nominate(op.task, *op.previous)

    def discard(self) -> None:
        """Undo every operation, newest first."""
        self._undo(0)
        self.scratch.clear()

    def commit(self) -> None:
        """Turn the operations into decisions of the session (ShadowPods reserved for the placed
        tasks become ``CreateShadowPod`` decisions when the session closes)."""
        session = self.session
        for op in self._ops:
            if isinstance(op, _Place):
                task = op.task
                session.binds.append(_bind_of(task))
                session.pods_placed += 1
                if task.pod.nominated is not None:
                    where = task.node.name if task.node is not None else "?"
                    session.cleared.setdefault(task.ref, ClearNomination(task.ref, f"bound to {where}"))
                session.nominations.pop(task.ref, None)
            elif isinstance(op, _Evict):
                task = op.task
                assert task.node is not None
                session.evictions.append(
                    Evict(
                        task.ref,
                        task.job.ref,
                        task.node.name,
                        tuple(g.id for g in task.devices),
                        EvictionReason.RESERVED_PREEMPT,
                        op.message,
                        op.preemptor.ref,
                    )
                )
            elif isinstance(op, _Nominate) and op.renominated:
                task = op.task
                assert task.nomination is not None
                ns, gpus = task.nomination
                nom = Nominate(task.ref, task.job.ref, ns.name, tuple(g.id for g in gpus))
                old = task.pod.nominated
                if old is not None and old.node == nom.node and old.devices == nom.devices:
                    session.nominations.pop(task.ref, None)
                else:
                    session.nominations[task.ref] = nom
                session.cleared.pop(task.ref, None)
        self._ops.clear()
        self.scratch.clear()


def _bind_of(task: TaskState) -> Bind:
    ns = task.node
    assert ns is not None
    devices = tuple(g.id for g in task.devices)
    if task.kind is TaskKind.RESERVED:
        return Bind(task.ref, task.job.ref, ns.name, ns.node.resource, devices, task.pod.container)
    owners = []
    for g in task.devices:
        assert g.owner is not None
        owners.append(DeviceOwner(g.id, g.owner))
    return Bind(
        task.ref, task.job.ref, ns.name, SPOT_GPU_RESOURCE, devices, task.pod.container, task.milli, tuple(owners)
    )


__all__ = ["Statement"]
