"""One cycle's scheduling context: the enabled plugins, node choice, and the decisions so far.

Pure decision code; no I/O, no clock. Built by :meth:`Session.open` from a checked
:class:`~spotgpu.scheduler.state.ClusterState` and the configuration; the actions drive it and
:meth:`Session.close` turns it into a :class:`~spotgpu.scheduler.model.CycleResult`.

How statuses are treated (docs/scheduler.md, "Statuses"): a node-choice failure whose causes are
all ``UnschedulableAndUnresolvable`` is remembered for the rest of the cycle (freed capacity
cannot change it) and reported with that code, so the preempt logic skips the gang; other
failures are remembered only until capacity grows (:attr:`ClusterState.capacity_epoch`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from spotgpu.core.refs import PodRef
from spotgpu.core.types import QueueType
from spotgpu.scheduler.config import SchedulerConfig
from spotgpu.scheduler.decisions import (
    Bind,
    ClearNomination,
    CreateShadowPod,
    CycleResult,
    CycleStats,
    DeleteShadowPod,
    Evict,
    Nominate,
    PodGroupPhase,
    PodGroupStatus,
    Unschedulable,
)
from spotgpu.scheduler.demand import Pressure
from spotgpu.scheduler.framework import (
    ACTIONS,
    PLUGINS,
    Action,
    ClassFilterPlugin,
    ClassScorePlugin,
    DevicePickPlugin,
    EnqueuePlugin,
    EvictionGatePlugin,
    JobOrderPlugin,
    JobReadyPlugin,
    Placement,
    QueueOrderPlugin,
    ReservePlugin,
    SortKey,
    TaskAdmitPlugin,
    VictimScorePlugin,
    extension_points,
)
from spotgpu.scheduler.mirrors import AutoLent, JobState, NodeClass, QueueState, TaskKind, TaskShape, TaskState
from spotgpu.scheduler.state import ClusterState
from spotgpu.scheduler.status import OK, Code, Status


class _ShapeOrder:
    """Feasible classes for one task shape, best first; extended as new classes appear."""

    __slots__ = ("entries", "seen")

    def __init__(self) -> None:
        self.entries: list[tuple[float, int, NodeClass]] = []
        self.seen = 0


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
        self.reserves: list[ReservePlugin] = []
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
        self.codes: dict[PodRef, Code] = {}
        """The status code of each entry of :attr:`unschedulable`."""
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
        self._fail_memo: dict[TaskShape, tuple[int, Status]] = {}
        self._job_keys: dict[PodRef, SortKey] = {}
        self.pressure = Pressure(state)
        """Whether the cycle's pending demand fits the unallocated room (the ``auto`` rule)."""

    @classmethod
    def open(cls, state: ClusterState, config: SchedulerConfig) -> Session:
        """Build plugins and actions named in ``config`` (unknown names, or a plugin that
        implements no extension point: RegistryError)."""
        session = cls(state, config)
        for name in config.plugins:
            session.add_plugin(PLUGINS.get(name)(session), name)
        session.actions = [ACTIONS.get(name)() for name in config.actions]
        for pod_ref, reason in state.bad_nominations:
            session.cleared[pod_ref] = ClearNomination(pod_ref, reason)
        return session

    def add_plugin(self, plugin: object, name: str | None = None) -> None:
        """Enable ``plugin`` at every extension point it implements (see
        :func:`~spotgpu.scheduler.framework.extension_points`, which refuses one that enrols nowhere)."""
        points = {p.name for p in extension_points(plugin, name or type(plugin).__name__)}
        self.plugins.append(plugin)
        targets: list[tuple[str, list[object]]] = [
            ("QueueOrder", self.queue_orders),  # type: ignore[list-item]
            ("JobOrder", self.job_orders),  # type: ignore[list-item]
            ("Enqueue", self.enqueue_checks),  # type: ignore[list-item]
            ("TaskAdmit", self.task_admits),  # type: ignore[list-item]
            ("JobReady", self.job_readies),  # type: ignore[list-item]
            ("ClassFilter", self.class_filters),  # type: ignore[list-item]
            ("ClassScore", self.class_scores),  # type: ignore[list-item]
            ("DevicePick", self.device_pickers),  # type: ignore[list-item]
            ("Reserve", self.reserves),  # type: ignore[list-item]
            ("VictimScore", self.victim_scores),  # type: ignore[list-item]
            ("EvictionGate", self.eviction_gates),  # type: ignore[list-item]
        ]
        for point, bucket in targets:
            if point in points:
                bucket.append(plugin)

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
    def enqueue_status(self, job: JobState) -> Status:
        for p in self.enqueue_checks:
            status = p.enqueue_status(job)
            if not status.ok:
                return status
        return OK

    def job_ready(self, job: JobState) -> bool:
        if not self.job_readies:
            return job.ready >= job.group.min_member
        return all(p.job_ready(job) for p in self.job_readies)

    def admit_status(self, task: TaskState) -> Status:
        for p in self.task_admits:
            status = p.admit_status(task)
            if not status.ok:
                return status
        return OK

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

    def class_status(self, shape: TaskShape, cls: NodeClass) -> Status:
        for p in self.class_filters:
            status = p.class_status(shape, cls)
            if not status.ok:
                return status
        return OK

    def _order(self, shape: TaskShape) -> list[tuple[float, int, NodeClass]]:
        order = self._orders.get(shape)
        if order is None:
            order = self._orders[shape] = _ShapeOrder()
        classes = self.state.class_list
        if order.seen < len(classes):
            for seq in range(order.seen, len(classes)):
                cls = classes[seq]
                if self.class_status(shape, cls).ok:
                    score = sum(p.class_score(shape, cls) for p in self.class_scores)
                    bisect.insort(order.entries, (-score, seq, cls))
            order.seen = len(classes)
        return order.entries

    def find_node(self, task: TaskState) -> Placement | Status:
        """The best node and devices for ``task`` now, or why there is none.

        While some ``auto`` node has lent capacity, a spot task first tries a shape that restricts
        those nodes' lent GPUs (:meth:`first_try`), then its own shape, which may use any of them
        after unallocated ones.
        """
        picker = self.picker(task.kind)
        if picker is None:
            return Status.unresolvable(f"no enabled plugin places {task.kind.value} tasks")
        nom = task.nomination
        if nom is not None:
            nom_node, nom_gpus = nom
            if nom_node.node.schedulable and all(g.healthy and g.owner is None and not g.users for g in nom_gpus):
                return Placement(nom_node, list(nom_gpus))
        shape = task.shape
        if task.kind is not TaskKind.RESERVED and self.state.auto_lent_nodes:
            first = self._find(picker, task, self.state.restricted(shape, self.first_try(shape)))
            if isinstance(first, Placement):
                return first
        return self._find(picker, task, shape)

    def first_try(self, shape: TaskShape) -> AutoLent:
        """Which lent GPUs of ``auto`` nodes a spot task of ``shape`` tries first: none while the
        cycle's pending demand of its pool fits the unallocated room; when it does not, for a task
        that wants a lease, those whose forecast covers its want, before unallocated GPUs
        (:mod:`spotgpu.scheduler.demand`). A task that wants no lease has no forecast to judge
        lent GPUs by and keeps the unallocated-first order."""
        if shape.want and not self.pressure.fits(shape.pool):
            return AutoLent.COVERING
        return AutoLent.NONE

    def _find(self, picker: DevicePickPlugin, task: TaskState, shape: TaskShape) -> Placement | Status:
        memo = self._fail_memo.get(shape)
        if memo is not None and (memo[0] == self.state.capacity_epoch or not memo[1].resolvable):
            return memo[1]
        classes = self.state.classes
        for _, _, cls in self._order(shape):
            bucket = classes[cls]
            for ns in bucket:
                picked = picker.pick_devices(shape, task, ns)
                if picked is not None:
                    return Placement(ns, picked)
        status = self.explain(shape)
        self._fail_memo[shape] = (self.state.capacity_epoch, status)
        return status

    def explain(self, shape: TaskShape) -> Status:
        """Why no node fits ``shape``: node counts per cause, largest first.

        ``UnschedulableAndUnresolvable`` when every node's cause is; otherwise ``Unschedulable``
        (an ``Error`` from a filter is reported as such)."""
        counts: dict[str, int] = {}
        codes: set[Code] = set()
        total = len(self.state.nodes)
        placed = 0
        for cls, bucket in self.state.classes.items():
            if not bucket:
                continue
            placed += len(bucket)
            status = self.class_status(shape, cls)
            cause = status.reason or "no devices fit"
            codes.add(status.code if not status.ok else Code.UNSCHEDULABLE)
            counts[cause] = counts.get(cause, 0) + len(bucket)
        if total - placed:
            counts["node unschedulable"] = total - placed
            codes.add(Code.UNSCHEDULABLE)  # a cordoned or NotReady node may come back
        causes = ", ".join(f"{n} {c}" for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        reason = f"0/{total} nodes fit {shape.describe()}" + (f": {causes}" if causes else "")
        if Code.ERROR in codes:
            return Status.error(reason)
        if codes == {Code.UNRESOLVABLE} or not codes:
            return Status.unresolvable(reason)
        return Status.unschedulable(reason)

    # -- outputs ----------------------------------------------------------------------------
    def set_status(self, job: JobState, phase: PodGroupPhase, reason: str = "", message: str = "") -> None:
        job.phase = phase
        self.statuses[job.ref] = PodGroupStatus(job.ref, phase, reason, message)

    def mark_unschedulable(self, job: JobState, reason: str, code: Code = Code.UNSCHEDULABLE) -> None:
        self.unschedulable[job.ref] = reason
        self.codes[job.ref] = code

    def clear_unschedulable(self, job: JobState) -> None:
        self.unschedulable.pop(job.ref, None)
        self.codes.pop(job.ref, None)

    def close(self) -> CycleResult:
        """Garbage-collect ShadowPods and assemble the result."""
        self._collect_shadows()
        self._shadow_creations()
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
            unschedulable=tuple(
                Unschedulable(ref, r, self.codes.get(ref, Code.UNSCHEDULABLE))
                for ref, r in sorted(self.unschedulable.items())
            ),
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

    def _shadow_creations(self) -> None:
        """A ``CreateShadowPod`` for every ShadowPod reserved in this cycle (in creation order)."""
        for sh in self.state.shadows.values():
            if sh.new and sh.devices:
                self.shadow_creations.append(
                    CreateShadowPod(
                        sh.ref,
                        sh.node.name,
                        sh.node.node.resource,
                        tuple(g.id for g in sh.devices),
                        sh.group or sh.ref,
                        sh.owner.name,
                    )
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


__all__ = ["Session"]
