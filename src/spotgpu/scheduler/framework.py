"""The scheduling framework: extension-point Protocols, registries, the Session and the Statement.

Pure decision code; no I/O, no clock. A cycle opens a :class:`Session` on a checked
:class:`~spotgpu.scheduler.state.ClusterState`, runs the configured actions (registry
:data:`ACTIONS`), each of which asks the enabled plugins (registry :data:`PLUGINS`) through the
small Protocols below, and closes it into a :class:`~spotgpu.scheduler.model.CycleResult`.

A plugin is any object; the session looks at which Protocols it implements (by method name) and
calls it at those extension points only. Plugins are built per session by their factory
``factory(session)`` so they can read the configuration and precompute per-cycle data.

Node choice works on node *classes* (:class:`~spotgpu.scheduler.state.NodeClass`): class filters
and class scores must depend only on the task's shape and the class, never on a node's name;
that makes them cacheable per (shape, class) for the whole cycle.

Gangs are placed through a :class:`Statement`: its operations change the session state at once
(later tasks see them) and are recorded; :meth:`Statement.commit` turns them into decisions,
:meth:`Statement.discard` undoes them exactly.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from spotgpu.core.ids import SPOT_GPU_RESOURCE, NodeName
from spotgpu.core.refs import PodRef
from spotgpu.core.registry import Registry
from spotgpu.core.types import EvictionReason, QueueType
from spotgpu.scheduler.config import SchedulerConfig
from spotgpu.scheduler.model import (
    Bind,
    ClearNomination,
    CreateShadowPod,
    CycleResult,
    CycleStats,
    DeleteShadowPod,
    DeviceOwner,
    Evict,
    Nominate,
    PodGroupPhase,
    PodGroupStatus,
    Unschedulable,
)
from spotgpu.scheduler.state import (
    ClusterState,
    GPUState,
    JobState,
    NodeClass,
    NodeState,
    QueueState,
    ShadowState,
    TaskKind,
    TaskShape,
    TaskState,
)

SortKey = tuple[float | str, ...]


# --------------------------------------------------------------------------------------------
# Extension points
# --------------------------------------------------------------------------------------------


@runtime_checkable
class QueueOrderPlugin(Protocol):
    def queue_key(self, queue: QueueState) -> SortKey:
        """Smaller first. Called whenever a queue is (re)considered; may depend on its usage."""
        ...


@runtime_checkable
class JobOrderPlugin(Protocol):
    def job_key(self, job: JobState) -> SortKey:
        """Smaller first, within a queue."""
        ...


@runtime_checkable
class EnqueuePlugin(Protocol):
    def enqueue_problem(self, job: JobState) -> str | None:
        """Why a Pending gang may not be admitted yet (``None``: no objection)."""
        ...


@runtime_checkable
class TaskAdmitPlugin(Protocol):
    def admit_problem(self, task: TaskState) -> str | None:
        """Why ``task`` may not be placed now regardless of nodes (e.g. queue capacity)."""
        ...


@runtime_checkable
class JobReadyPlugin(Protocol):
    def job_ready(self, job: JobState) -> bool:
        """Whether the gang's placed pods suffice to commit it."""
        ...


@runtime_checkable
class ClassFilterPlugin(Protocol):
    def class_problem(self, shape: TaskShape, cls: NodeClass) -> str | None:
        """Why nodes of ``cls`` cannot take a task of ``shape`` (short, the same text for the same cause)."""
        ...


@runtime_checkable
class ClassScorePlugin(Protocol):
    def class_score(self, shape: TaskShape, cls: NodeClass) -> float:
        """0..100, higher is better, for a class that passed every filter."""
        ...


@runtime_checkable
class DevicePickPlugin(Protocol):
    def handles(self, kind: TaskKind) -> bool: ...

    def pick_devices(self, task: TaskState, node: NodeState) -> list[GPUState] | None:
        """The exact GPUs ``task`` would take on ``node``, or ``None`` if it does not fit there."""
        ...


@runtime_checkable
class VictimScorePlugin(Protocol):
    def victim_score(self, job: JobState) -> float:
        """Cost of evicting a running gang; lower is evicted first."""
        ...


@runtime_checkable
class EvictionGatePlugin(Protocol):
    def may_evict(self, preemptor: JobState, victim: JobState) -> bool:
        """Whether ``preemptor`` may evict ``victim`` at all."""
        ...


class Action(Protocol):
    name: str

    def execute(self, session: Session) -> None: ...


PluginFactory = Callable[["Session"], object]
ActionFactory = Callable[[], Action]

PLUGINS: Registry[PluginFactory] = Registry("scheduler plugin")
ACTIONS: Registry[ActionFactory] = Registry("scheduler action")


@dataclass(frozen=True, slots=True)
class Placement:
    node: NodeState
    gpus: list[GPUState]


class _ShapeOrder:
    """Feasible classes for one task shape, best first; extended as new classes appear."""

    __slots__ = ("entries", "seen")

    def __init__(self) -> None:
        self.entries: list[tuple[float, int, NodeClass]] = []
        self.seen = 0


# --------------------------------------------------------------------------------------------
# Session
# --------------------------------------------------------------------------------------------


class Session:
    """One cycle's scheduling context. Create with :meth:`open`."""

    def __init__(self, state: ClusterState, config: SchedulerConfig) -> None:
        self.state = state
        self.config = config
        self.now = state.now
        self.plugins: list[object] = []
        self.queue_orders: list[QueueOrderPlugin] = []
        self.job_orders: list[JobOrderPlugin] = []
        self.enqueue_checks: list[EnqueuePlugin] = []
        self.task_admits: list[TaskAdmitPlugin] = []
        self.job_readies: list[JobReadyPlugin] = []
        self.class_filters: list[ClassFilterPlugin] = []
        self.class_scores: list[ClassScorePlugin] = []
        self.device_pickers: list[DevicePickPlugin] = []
        self.victim_scores: list[VictimScorePlugin] = []
        self.eviction_gates: list[EvictionGatePlugin] = []
        self.actions: list[Action] = []
        # outputs
        self.evictions: list[Evict] = []
        self.shadow_deletions: list[DeleteShadowPod] = []
        self.cleared: dict[PodRef, ClearNomination] = {}
        self.nominations: dict[PodRef, Nominate] = {}
        self.shadow_creations: list[CreateShadowPod] = []
        self.binds: list[Bind] = []
        self.statuses: dict[PodRef, PodGroupStatus] = {}
        self.unschedulable: dict[PodRef, str] = {}
        self.considered: set[PodRef] = set()
        self.failed: list[JobState] = []
        """Gangs allocate could not place (the preempt action looks at them)."""
        self.preempted: set[PodRef] = set()
        """Gangs the preempt logic already handled in this cycle."""
        self.gangs_placed = 0
        self.pods_placed = 0
        self.gangs_preempting = 0
        # caches
        self._orders: dict[TaskShape, _ShapeOrder] = {}
        self._fail_memo: dict[TaskShape, tuple[int, str]] = {}
        self._job_keys: dict[PodRef, SortKey] = {}

    @classmethod
    def open(cls, state: ClusterState, config: SchedulerConfig) -> Session:
        """Build plugins and actions named in ``config`` (unknown names: RegistryError)."""
        session = cls(state, config)
        for name in config.plugins:
            session.add_plugin(PLUGINS.get(name)(session))
        session.actions = [ACTIONS.get(name)() for name in config.actions]
        for pod_ref, reason in state.bad_nominations:
            session.cleared[pod_ref] = ClearNomination(pod_ref, reason)
        return session

    def add_plugin(self, plugin: object) -> None:
        """Enable ``plugin`` at every extension point whose Protocol it implements."""
        self.plugins.append(plugin)
        if isinstance(plugin, QueueOrderPlugin):
            self.queue_orders.append(plugin)
        if isinstance(plugin, JobOrderPlugin):
            self.job_orders.append(plugin)
        if isinstance(plugin, EnqueuePlugin):
            self.enqueue_checks.append(plugin)
        if isinstance(plugin, TaskAdmitPlugin):
            self.task_admits.append(plugin)
        if isinstance(plugin, JobReadyPlugin):
            self.job_readies.append(plugin)
        if isinstance(plugin, ClassFilterPlugin):
            self.class_filters.append(plugin)
        if isinstance(plugin, ClassScorePlugin):
            self.class_scores.append(plugin)
        if isinstance(plugin, DevicePickPlugin):
            self.device_pickers.append(plugin)
        if isinstance(plugin, VictimScorePlugin):
            self.victim_scores.append(plugin)
        if isinstance(plugin, EvictionGatePlugin):
            self.eviction_gates.append(plugin)

    # -- ordering ---------------------------------------------------------------------------
    def queue_key(self, queue: QueueState) -> SortKey:
        head: SortKey = (0 if queue.queue.type is QueueType.RESERVED else 1,)
        for p in self.queue_orders:
            head += p.queue_key(queue)
        return (*head, queue.queue.name)

    def job_key(self, job: JobState) -> SortKey:
        key = self._job_keys.get(job.ref)
        if key is None:
            key = ()
            for p in self.job_orders:
                key += p.job_key(job)
            key = (*key, job.created_at, job.ref.namespace or "", job.ref.name)
            self._job_keys[job.ref] = key
        return key

    def sorted_jobs(self, jobs: Iterable[JobState]) -> list[JobState]:
        return sorted(jobs, key=self.job_key)

    # -- gang hooks -------------------------------------------------------------------------
    def enqueue_problem(self, job: JobState) -> str | None:
        for p in self.enqueue_checks:
            problem = p.enqueue_problem(job)
            if problem is not None:
                return problem
        return None

    def job_ready(self, job: JobState) -> bool:
        if not self.job_readies:
            return job.ready >= job.group.min_member
        return all(p.job_ready(job) for p in self.job_readies)

    def admit_problem(self, task: TaskState) -> str | None:
        for p in self.task_admits:
            problem = p.admit_problem(task)
            if problem is not None:
                return problem
        return None

    def victim_score(self, job: JobState) -> float:
        return sum(p.victim_score(job) for p in self.victim_scores)

    def may_evict(self, preemptor: JobState, victim: JobState) -> bool:
        if not self.eviction_gates:
            return False  # nothing may be evicted unless a plugin allows it
        return all(p.may_evict(preemptor, victim) for p in self.eviction_gates)

    # -- node choice ------------------------------------------------------------------------
    def picker(self, kind: TaskKind) -> DevicePickPlugin | None:
        for p in self.device_pickers:
            if p.handles(kind):
                return p
        return None

    def class_problem(self, shape: TaskShape, cls: NodeClass) -> str | None:
        for p in self.class_filters:
            problem = p.class_problem(shape, cls)
            if problem is not None:
                return problem
        return None

    def _order(self, shape: TaskShape) -> list[tuple[float, int, NodeClass]]:
        order = self._orders.get(shape)
        if order is None:
            order = self._orders[shape] = _ShapeOrder()
        classes = self.state.class_list
        if order.seen < len(classes):
            for seq in range(order.seen, len(classes)):
                cls = classes[seq]
                if self.class_problem(shape, cls) is None:
                    score = sum(p.class_score(shape, cls) for p in self.class_scores)
                    bisect.insort(order.entries, (-score, seq, cls))
            order.seen = len(classes)
        return order.entries

    def find_node(self, task: TaskState) -> Placement | str:
        """The best node and devices for ``task`` now, or why there is none."""
        picker = self.picker(task.kind)
        if picker is None:
            return f"no enabled plugin places {task.kind.value} tasks"
        nom = task.nomination
        if nom is not None:
            nom_node, nom_gpus = nom
            if nom_node.node.schedulable and all(g.healthy and g.owner is None and not g.users for g in nom_gpus):
                return Placement(nom_node, list(nom_gpus))
        shape = task.shape
        memo = self._fail_memo.get(shape)
        if memo is not None and memo[0] == self.state.capacity_epoch:
            return memo[1]
        classes = self.state.classes
        for _, _, cls in self._order(shape):
            bucket = classes[cls]
            for ns in bucket:
                picked = picker.pick_devices(task, ns)
                if picked is not None:
                    return Placement(ns, picked)
        reason = self.explain(shape)
        self._fail_memo[shape] = (self.state.capacity_epoch, reason)
        return reason

    def explain(self, shape: TaskShape) -> str:
        """Why no node fits ``shape``: node counts per cause, largest first."""
        counts: dict[str, int] = {}
        total = len(self.state.nodes)
        placed = 0
        for cls, bucket in self.state.classes.items():
            if not bucket:
                continue
            placed += len(bucket)
            cause = self.class_problem(shape, cls) or "no devices fit"
            counts[cause] = counts.get(cause, 0) + len(bucket)
        if total - placed:
            counts["node unschedulable"] = total - placed
        causes = ", ".join(f"{n} {c}" for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        return f"0/{total} nodes fit {shape.describe()}" + (f": {causes}" if causes else "")

    # -- outputs ----------------------------------------------------------------------------
    def set_status(self, job: JobState, phase: PodGroupPhase, reason: str = "", message: str = "") -> None:
        job.phase = phase
        self.statuses[job.ref] = PodGroupStatus(job.ref, phase, reason, message)

    def mark_unschedulable(self, job: JobState, reason: str) -> None:
        self.unschedulable[job.ref] = reason

    def close(self) -> CycleResult:
        """Garbage-collect ShadowPods and assemble the result."""
        self._collect_shadows()
        statuses = []
        for ref, status in self.statuses.items():
            job = self.state.jobs[ref]
            if status.phase != job.group.phase or status.reason:
                statuses.append(status)
        for ref, reason in self.unschedulable.items():
            if ref not in self.statuses:
                job = self.state.jobs[ref]
                statuses.append(PodGroupStatus(ref, job.phase, "Unschedulable", reason))
        statuses.sort(key=lambda s: (s.group.namespace or "", s.group.name))
        return CycleResult(
            evictions=tuple(self.evictions),
            shadow_deletions=tuple(self.shadow_deletions),
            cleared_nominations=tuple(self.cleared[k] for k in sorted(self.cleared)),
            nominations=tuple(self.nominations[k] for k in sorted(self.nominations)),
            shadow_creations=tuple(self.shadow_creations),
            binds=tuple(self.binds),
            statuses=tuple(statuses),
            unschedulable=tuple(Unschedulable(ref, r) for ref, r in sorted(self.unschedulable.items())),
            stats=CycleStats(
                gangs_considered=len(self.considered),
                gangs_placed=self.gangs_placed,
                pods_placed=self.pods_placed,
                gangs_preempting=self.gangs_preempting,
                pods_evicted=len(self.evictions),
                shadows_created=len(self.shadow_creations),
                shadows_deleted=len(self.shadow_deletions),
            ),
        )

    def _collect_shadows(self) -> None:
        grace = self.config.shadow_gc_grace
        for shadow in list(self.state.shadows.values()):
            if shadow.new or shadow.deleting:
                continue
            if any(g.users for g in shadow.devices):
                continue
            wanted = any(g.nominee is not None for g in shadow.devices)
            if not wanted and self.now - shadow.created_at < grace:
                continue
            reason = (
                "its GPUs are nominated for a preempting reserved pod"
                if wanted
                else f"no spot pod has used its GPUs for {grace:g}s"
            )
            self.shadow_deletions.append(
                DeleteShadowPod(shadow.ref, shadow.node.name, tuple(g.id for g in shadow.devices), reason)
            )
            self.state.set_shadow_deleting(shadow, True)


# --------------------------------------------------------------------------------------------
# Statement
# --------------------------------------------------------------------------------------------


def shadow_name(group: PodRef, node: NodeName, first_device: str, now: float) -> str:
    """Deterministic ShadowPod name, a valid DNS subdomain.

    Unique per (gang, node, first device, cycle time): a device has one holder at a time, and the
    time keeps a new ShadowPod from colliding with an earlier one of the same gang still terminating.
    """
    text = f"{group}/{node}/{first_device}/{now!r}"
    digest = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:10]
    return f"{group.name[:200].rstrip('.-')}-shadow-{digest}"


@dataclass(frozen=True, slots=True)
class _Place:
    task: TaskState


@dataclass(frozen=True, slots=True)
class _NewShadow:
    shadow: ShadowState


@dataclass(frozen=True, slots=True)
class _ShadowDevice:
    shadow: ShadowState
    gpu: GPUState


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


_Op = _Place | _NewShadow | _ShadowDevice | _Evict | _Nominate


class Statement:
    """Tentative operations of one gang: applied at once, turned into decisions or undone."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.state = session.state
        self._ops: list[_Op] = []
        self._shadows: dict[tuple[PodRef, NodeName], ShadowState] = {}

    def place(self, task: TaskState, placement: Placement) -> None:
        ns, gpus = placement.node, placement.gpus
        state = self.state
        if task.nomination is not None:
            self._ops.append(_Nominate(task, state.unnominate(task), renominated=False))
        if task.kind is not TaskKind.RESERVED:
            needs = [g for g in gpus if g.owner is None]
            if needs:
                key = (task.job.ref, ns.name)
                shadow = self._shadows.get(key)
                if shadow is None:
                    name = shadow_name(task.job.ref, ns.name, needs[0].id, self.session.now)
                    ref = PodRef(self.session.config.shadow_namespace, name)  # scheduler-only namespace
                    owner = ref.container(self.session.config.shadow_container)
                    shadow = ShadowState(ref, owner, ns, task.job.ref, self.session.now, new=True)
                    self._shadows[key] = shadow
                    self._ops.append(_NewShadow(shadow))
                    state.shadows[owner] = shadow
                for g in needs:
                    g.owner = shadow.owner
                    g.shadow = shadow
                    shadow.devices.append(g)
                    self._ops.append(_ShadowDevice(shadow, g))
        state.place(task, ns, gpus)
        self._ops.append(_Place(task))

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

    def discard(self) -> None:
        """Undo every operation, newest first."""
        state = self.state
        for op in reversed(self._ops):
            if isinstance(op, _Place):
                state.unplace(op.task)
            elif isinstance(op, _ShadowDevice):
                g = op.gpu
                g.owner = None
                g.shadow = None
                op.shadow.devices.remove(g)
                state.refresh(g.node)
            elif isinstance(op, _NewShadow):
                del state.shadows[op.shadow.owner]
            elif isinstance(op, _Evict):
                state.set_evicting(op.task, False)
                state.capacity_epoch += 1
            else:
                if op.renominated:
                    state.unnominate(op.task)
                if op.previous is not None:
                    state.nominate(op.task, *op.previous)
        self._ops.clear()
        self._shadows.clear()

    def commit(self) -> None:
        """Turn the operations into decisions of the session."""
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
            elif isinstance(op, _NewShadow):
                sh = op.shadow
                session.shadow_creations.append(
                    CreateShadowPod(
                        sh.ref,
                        sh.node.name,
                        sh.node.node.resource,
                        tuple(g.id for g in sh.devices),
                        sh.group or sh.ref,
                        sh.owner.name,
                    )
                )
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
        self._shadows.clear()


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


__all__ = [
    "ACTIONS",
    "PLUGINS",
    "Action",
    "ActionFactory",
    "ClassFilterPlugin",
    "ClassScorePlugin",
    "DevicePickPlugin",
    "EnqueuePlugin",
    "EvictionGatePlugin",
    "JobOrderPlugin",
    "JobReadyPlugin",
    "Placement",
    "PluginFactory",
    "QueueOrderPlugin",
    "Session",
    "SortKey",
    "Statement",
    "TaskAdmitPlugin",
    "VictimScorePlugin",
    "shadow_name",
]
