"""Per-cycle working state: the snapshot, checked and indexed, with reversible mutations.

No I/O and no clock reads. :meth:`ClusterState.build` checks the whole snapshot (raising
:class:`~spotgpu.scheduler.model.SnapshotError` naming the object) and builds mutable mirrors of
nodes, GPUs, gangs and pods. A cycle mutates only these mirrors, never the snapshot; every
mutation has an exact inverse so that a :class:`~spotgpu.scheduler.framework.Statement` can undo
a gang that did not fit.

Nodes are indexed by their :class:`NodeClass`, a summary of everything placement scores depend
on (resource, pool, strategy, lending, free counts, shared remainders). Nodes of one class are
interchangeable for filtering and scoring, which keeps the cost of finding a node proportional to
the number of distinct classes (hundreds) instead of nodes (thousands). A second index by
:class:`PreemptKey` serves victim search.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import TypeVar

from spotgpu.core.ids import DeviceID, NodeName, ResourceName
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import GPU_MILLI, Health, NodeStrategy, QueueType, SpotPriority
from spotgpu.scheduler.model import GPU, Node, Pod, PodGroup, Queue, ShadowPod, Snapshot, SnapshotError, VictimScale


class TaskKind(StrEnum):
    RESERVED = "reserved"
    """Whole real GPUs."""
    EXCLUSIVE = "exclusive"
    """Whole twins (exclusive spot)."""
    SHARED = "shared"
    """GPU milli of one twin (shared spot)."""


class Lend(IntEnum):
    """How a GPU could serve spot work right now (from the spot plugin's point of view)."""

    NO = 0
    NEW_SHADOW = 1
    """Unallocated: a new ShadowPod must hold it."""
    SHADOW = 2
    """Held by a ShadowPod already."""
    LENT = 3
    """Allocated to an idle reserved owner on a node that allows lending."""


@dataclass(frozen=True, slots=True)
class TaskShape:
    """What placement of a task depends on; tasks of one shape are interchangeable for node choice."""

    kind: TaskKind
    resource: ResourceName
    gpus: int
    milli: int
    pool: str | None

    def describe(self) -> str:
        if self.kind is TaskKind.SHARED:
            return f"{self.milli} milli of one spot GPU"
        what = "spot GPU" if self.kind is TaskKind.EXCLUSIVE else self.resource
        return f"{self.gpus} x {what}"


@dataclass(frozen=True, slots=True)
class NodeClass:
    """A summary of a node's placement-relevant state. Scores are functions of (TaskShape, NodeClass)."""

    resource: ResourceName
    pool: str
    strategy: NodeStrategy
    lending: bool
    gpus: int
    """GPUs on the node (healthy or not)."""
    free: int
    """Unallocated, healthy, unused, un-nominated real GPUs (reserved tasks can take them)."""
    spot_unallocated: int
    """Twins usable by exclusive spot on unallocated or ShadowPod-held GPUs."""
    spot_lent: int
    """Twins usable by exclusive spot on GPUs allocated to an idle owner (lending nodes only)."""
    partials: tuple[int, ...]
    """Remaining milli of GPUs that shared spot pods use partly, ascending."""

    @property
    def spot_free(self) -> int:
        return self.spot_unallocated + self.spot_lent


@dataclass(frozen=True, slots=True, order=True)
class PreemptKey:
    """Index key for victim search (ordered: cheapest-looking nodes first)."""

    top_priority: int
    """Highest spot priority among live spot users of reclaimable GPUs (0: none)."""
    neg_zero_cost: int
    """Minus the GPUs available without new victims (free, or all users already evicting; for a
    GPU held by a ShadowPod that is not being deleted: no live user on any of its GPUs)."""
    neg_available: int
    """Minus the GPUs available with victims."""
    resource: ResourceName
    pool: str


class ShadowState:
    """A ShadowPod, from the snapshot or created in this cycle."""

    __slots__ = ("created_at", "deleting", "devices", "group", "new", "node", "nominated", "owner", "ref")

    def __init__(
        self, ref: PodRef, owner: ContainerRef, node: NodeState, group: PodRef | None, created_at: float, *, new: bool
    ) -> None:
        self.ref = ref
        self.owner = owner
        self.node = node
        self.group = group
        self.created_at = created_at
        self.new = new
        self.deleting = False
        self.devices: list[GPUState] = []
        self.nominated = 0
        """How many of its GPUs are nominated for a preempting pod. While any is, the ShadowPod is
        *draining*: it has to go as a whole (a pod's resources are immutable), so no new spot work
        may use any of its GPUs."""

    def live_users(self) -> bool:
        """Whether any of its GPUs has a spot user that is not being evicted (it cannot go yet)."""
        return any(g.live for g in self.devices)


class GPUState:
    __slots__ = (
        "exclusive",
        "healthy",
        "holder",
        "id",
        "index",
        "live",
        "node",
        "nominee",
        "owner",
        "shadow",
        "twin_ok",
        "used_milli",
        "users",
    )

    def __init__(self, node: NodeState, index: int, gpu: GPU) -> None:
        self.node = node
        self.index = index
        self.id: DeviceID = gpu.id
        self.owner: ContainerRef | None = gpu.owner
        self.shadow: ShadowState | None = None
        self.holder: TaskState | None = None
        self.healthy = gpu.health is Health.HEALTHY
        self.twin_ok = gpu.twin is Health.HEALTHY
        self.users: list[TaskState] = []
        self.used_milli = 0
        self.exclusive = 0
        self.live = 0
        """Users not being evicted."""
        self.nominee: TaskState | None = None

    def lend(self) -> Lend:
        """How spot work could use this GPU (ignoring its current users)."""
        if not (self.healthy and self.twin_ok) or self.nominee is not None:
            return Lend.NO
        if self.owner is None:
            return Lend.NEW_SHADOW
        if self.shadow is not None:
            return Lend.NO if self.shadow.deleting or self.shadow.nominated else Lend.SHADOW
        if self.holder is not None and self.holder.tentative:
            return Lend.NO  # placed in this cycle: its owner is about to start, not idle
        return Lend.LENT if self.node.node.lending else Lend.NO

    def bindable(self) -> bool:
        """A reserved task could be bound to it now."""
        return self.healthy and self.owner is None and not self.users and self.nominee is None

    def reclaimable(self) -> bool:
        """Preemption could free it for a reserved task (spot users and ShadowPods only).

        Necessary, not sufficient: a ShadowPod-held GPU is freed only with its whole ShadowPod,
        i.e. once every spot user of *any* of the ShadowPod's GPUs is gone
        (:mod:`spotgpu.scheduler.victims` counts that cost).
        """
        return self.healthy and (self.owner is None or (self.shadow is not None and not self.shadow.new))


class NodeState:
    __slots__ = ("by_id", "cls", "gpus", "name", "node", "order", "pkey", "version")

    def __init__(self, node: Node, order: int) -> None:
        self.node = node
        self.name: NodeName = node.name
        self.order = order
        self.gpus = [GPUState(self, i, g) for i, g in enumerate(node.gpus)]
        self.by_id = {g.id: g for g in self.gpus}
        self.cls: NodeClass | None = None
        self.pkey: PreemptKey | None = None
        self.version = 0
        """Incremented by every change on the node (caches of per-node evaluations check it)."""

    def __repr__(self) -> str:
        return f"NodeState({self.name})"


class TaskState:
    __slots__ = (
        "container",
        "devices",
        "evicting",
        "gpus",
        "job",
        "kind",
        "milli",
        "node",
        "nomination",
        "pod",
        "ref",
        "shape",
        "start_time",
        "tentative",
    )

    def __init__(self, pod: Pod, job: JobState, shape: TaskShape) -> None:
        self.pod = pod
        self.ref = pod.ref
        self.job = job
        self.shape = shape
        self.kind = shape.kind
        self.gpus = shape.gpus
        self.milli = shape.milli
        self.container: ContainerRef | None = pod.container_ref if shape.kind is TaskKind.RESERVED else None
        """The GPU container (reserved tasks only: it becomes the owner of their GPUs)."""
        self.node: NodeState | None = None
        self.devices: list[GPUState] = []
        self.evicting = pod.evicting
        self.start_time = pod.start_time
        self.nomination: tuple[NodeState, list[GPUState]] | None = None
        self.tentative = False
        """Placed in this cycle (not yet in the cluster)."""

    @property
    def request_milli(self) -> int:
        return self.gpus * GPU_MILLI + self.milli

    def __repr__(self) -> str:
        return f"TaskState({self.ref})"


class JobState:
    __slots__ = ("created_at", "group", "phase", "priority", "queue", "ready", "ref", "spot", "tasks")

    def __init__(self, group: PodGroup, queue: QueueState) -> None:
        self.group = group
        self.ref = group.ref
        self.queue = queue
        self.spot = queue.queue.type is QueueType.SPOT
        if self.spot:
            self.priority = (group.spot_priority or SpotPriority.SPOTLOW).value_int
        else:
            self.priority = group.priority
        self.created_at = group.created_at
        self.phase = group.phase
        self.tasks: list[TaskState] = []
        self.ready = 0
        """Placed pods not being evicted."""

    def pending(self) -> list[TaskState]:
        return [t for t in self.tasks if t.node is None]

    def __repr__(self) -> str:
        return f"JobState({self.ref})"


class QueueState:
    __slots__ = ("allocated_milli", "jobs", "queue")

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.allocated_milli = 0
        self.jobs: list[JobState] = []


_T = TypeVar("_T")


class ClusterState:
    """The indexed, mutable mirror of one snapshot. Build with :meth:`build`."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.nodes: dict[NodeName, NodeState] = {}
        self.queues: dict[str, QueueState] = {}
        self.jobs: dict[PodRef, JobState] = {}
        self.tasks: dict[PodRef, TaskState] = {}
        self.shadows: dict[ContainerRef, ShadowState] = {}
        self.bad_nominations: list[tuple[PodRef, str]] = []
        self.victim_scale: VictimScale | None = None
        """Cluster-wide normalisation maxima for victim scores, when the snapshot is partial."""
        # class index: NodeClass -> ordered set of nodes
        self.classes: dict[NodeClass, dict[NodeState, None]] = {}
        self.class_list: list[NodeClass] = []
        """Every class ever created in this cycle, in creation order (the framework extends its cached orders)."""
        self.pindex: dict[PreemptKey, dict[NodeState, None]] = {}
        self._pkeys_sorted: list[PreemptKey] | None = None
        self.capacity_epoch = 0
        """Incremented whenever placement capacity may have grown (memoised failures expire)."""
        self._shapes: dict[tuple[TaskKind, ResourceName, int, int, str | None], TaskShape] = {}
        self._interned: dict[tuple[object, ...], NodeClass] = {}

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def build(cls, snapshot: Snapshot, now: float) -> ClusterState:
        """Check ``snapshot`` and index it. Raises :class:`SnapshotError` naming the first bad object."""
        if not isinstance(snapshot, Snapshot):
            raise SnapshotError(f"expected a Snapshot, got {type(snapshot).__name__}")
        state = cls(now)
        scale = snapshot.victim_scale
        if scale is not None and not isinstance(scale, VictimScale):
            raise SnapshotError(f"snapshot victim_scale must be a VictimScale or None, got {type(scale).__name__}")
        state.victim_scale = scale
        device_node: dict[DeviceID, NodeName] = {}
        for order, node in enumerate(_typed(snapshot.nodes, Node, "nodes")):
            if node.name in state.nodes:
                raise SnapshotError(f"node {node.name} is listed twice")
            for gpu in node.gpus:
                if not isinstance(gpu, GPU):
                    raise SnapshotError(f"node {node.name}: gpus must be GPU objects, got {type(gpu).__name__}")
                other = device_node.get(gpu.id)
                if other is not None:
                    where = "twice on that node" if other == node.name else f"on node {other} too"
                    raise SnapshotError(f"device {gpu.id} of node {node.name} is listed {where}")
                device_node[gpu.id] = node.name
            state.nodes[node.name] = NodeState(node, order)
        for queue in _typed(snapshot.queues, Queue, "queues"):
            if queue.name in state.queues:
                raise SnapshotError(f"queue {queue.name} is listed twice")
            state.queues[queue.name] = QueueState(queue)
        for group in _typed(snapshot.groups, PodGroup, "groups"):
            if group.ref in state.jobs:
                raise SnapshotError(f"PodGroup {group.ref} is listed twice")
            qs = state.queues.get(group.queue)
            if qs is None:
                raise SnapshotError(f"PodGroup {group.ref}: queue {group.queue!r} is not in the snapshot")
            job = JobState(group, qs)
            state.jobs[group.ref] = job
            qs.jobs.append(job)
        state._build_shadows(snapshot)
        state._build_pods(snapshot)
        state._build_nominations()
        for ns in state.nodes.values():
            state.refresh(ns)
        return state

    def _build_shadows(self, snapshot: Snapshot) -> None:
        seen: set[tuple[str | None, str]] = set()
        for shadow in _typed(snapshot.shadows, ShadowPod, "shadows"):
            ref = shadow.ref
            key = (ref.namespace, ref.name)
            if key in seen:
                raise SnapshotError(f"ShadowPod {ref} is listed twice")
            seen.add(key)
            ns, gpus = self._locate(f"ShadowPod {ref}", shadow.node, shadow.devices)
            for g in gpus:
                o = g.owner
                if o is None or o.name != shadow.container or o.pod != ref.name or o.namespace != ref.namespace:
                    raise SnapshotError(
                        f"ShadowPod {ref} lists device {g.id} on {ns.name}, but the GPU's owner is {o or 'nobody'}"
                    )
            owner = gpus[0].owner
            assert owner is not None
            st = ShadowState(ref, owner, ns, shadow.group, shadow.created_at, new=False)
            st.deleting = shadow.deleting
            for g in gpus:
                g.shadow = st
            st.devices = gpus
            self.shadows[owner] = st

    def _build_pods(self, snapshot: Snapshot) -> None:
        jobs = {(ref.namespace, ref.name): job for ref, job in self.jobs.items()}
        for pod in _typed(snapshot.pods, Pod, "pods"):
            if pod.ref in self.tasks:
                raise SnapshotError(f"pod {pod.ref} is listed twice")
            job = jobs.get((pod.ref.namespace, pod.group))
            if job is None:
                raise SnapshotError(f"pod {pod.ref}: its PodGroup {pod.group_ref} is not in the snapshot")
            req = pod.request
            if job.spot != req.is_spot:
                what = "spot" if job.spot else "reserved"
                raise SnapshotError(
                    f"pod {pod.ref} requests {req.resource} but its PodGroup {job.ref} is in {what} queue "
                    f"{job.queue.queue.name!r}; {what} pods request "
                    + ("platform/spot-gpu" if job.spot else "real GPUs, never platform/spot-gpu")
                )
            kind = TaskKind.SHARED if req.is_shared else TaskKind.EXCLUSIVE if req.is_spot else TaskKind.RESERVED
            task = TaskState(pod, job, self.shape(kind, req.resource, req.gpus, req.milli, job.group.pool))
            self.tasks[pod.ref] = task
            job.tasks.append(task)
            if pod.node is not None:
                self._place_from_snapshot(task, pod)
        for job in self.jobs.values():
            job.tasks.sort(key=lambda t: (t.pod.created_at, t.ref.name))

    def _place_from_snapshot(self, task: TaskState, pod: Pod) -> None:
        assert pod.node is not None
        ns, gpus = self._locate(f"pod {pod.ref}", pod.node, pod.devices)
        if task.kind is TaskKind.RESERVED:
            if pod.request.resource != ns.node.resource:
                raise SnapshotError(
                    f"pod {pod.ref} holds {pod.request.resource} but node {ns.name} has {ns.node.resource}"
                )
            for g in gpus:
                if g.owner != task.container:
                    raise SnapshotError(
                        f"pod {pod.ref} is placed on device {g.id} of {ns.name}, but the GPU's owner is "
                        f"{g.owner or 'nobody'}, not {task.container}"
                    )
                if g.holder is not None:
                    raise SnapshotError(f"device {g.id} of {ns.name} is held by both {g.holder.ref} and {pod.ref}")
                if g.shadow is not None:
                    raise SnapshotError(f"pod {pod.ref} holds device {g.id}, which ShadowPod {g.shadow.ref} holds")
        else:
            for g in gpus:
                if task.kind is TaskKind.EXCLUSIVE and g.users:
                    raise SnapshotError(
                        f"spot pod {pod.ref} uses device {g.id} of {ns.name} exclusively, but "
                        f"{', '.join(str(u.ref) for u in g.users)} use it too"
                    )
                if g.exclusive:
                    raise SnapshotError(
                        f"spot pod {pod.ref} shares device {g.id} of {ns.name}, which {g.users[0].ref} uses exclusively"
                    )
                if task.kind is TaskKind.SHARED and g.used_milli + task.milli > GPU_MILLI:
                    raise SnapshotError(
                        f"device {g.id} of {ns.name} is shared beyond one GPU: {g.used_milli} milli of "
                        f"{', '.join(str(u.ref) for u in g.users)} plus {task.milli} of {pod.ref}"
                    )
        self._attach(task, ns, gpus)

    def _locate(self, who: str, node: NodeName, devices: tuple[DeviceID, ...]) -> tuple[NodeState, list[GPUState]]:
        """The node and GPUs an object says it holds; SnapshotError naming ``who`` if either is unknown."""
        ns = self.nodes.get(node)
        if ns is None:
            raise SnapshotError(f"{who} is on unknown node {node}")
        gpus = []
        for dev in devices:
            g = ns.by_id.get(dev)
            if g is None:
                raise SnapshotError(f"{who} holds device {dev}, which its node {ns.name} does not have")
            gpus.append(g)
        return ns, gpus

    def _build_nominations(self) -> None:
        for task in self.tasks.values():
            nom = task.pod.nominated
            if nom is None:
                continue
            if task.node is not None:
                self.bad_nominations.append((task.ref, "the pod is placed"))
                continue
            if task.kind is not TaskKind.RESERVED:
                self.bad_nominations.append((task.ref, "only reserved pods are nominated"))
                continue
            ns = self.nodes.get(nom.node)
            if ns is None:
                self.bad_nominations.append((task.ref, f"node {nom.node} is gone"))
                continue
            gpus: list[GPUState] = []
            problem = None
            if len(nom.devices) != task.gpus or len(set(nom.devices)) != len(nom.devices):
                problem = f"it names {len(nom.devices)} devices for a request of {task.gpus}"
            for dev in nom.devices:
                if problem is not None:
                    break
                g = ns.by_id.get(dev)
                if g is None:
                    problem = f"node {ns.name} has no device {dev}"
                elif g.nominee is not None:
                    problem = f"device {dev} is nominated for {g.nominee.ref} as well"
                elif not g.reclaimable():
                    problem = f"device {dev} now belongs to {g.owner}"
                else:
                    gpus.append(g)
            if problem is not None:
                self.bad_nominations.append((task.ref, problem))
                continue
            for g in gpus:
                g.nominee = task
                if g.shadow is not None:
                    g.shadow.nominated += 1
            task.nomination = (ns, gpus)

    # -- helpers ----------------------------------------------------------------------------
    def shape(self, kind: TaskKind, resource: ResourceName, gpus: int, milli: int, pool: str | None) -> TaskShape:
        key = (kind, resource, gpus, milli, pool)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = TaskShape(kind, resource, gpus, milli, pool)
        return shape

    # -- primitive mutations (each has an exact inverse) ------------------------------------
    def _attach(self, task: TaskState, ns: NodeState, gpus: list[GPUState]) -> None:
        task.node = ns
        task.devices = gpus
        job = task.job
        if task.kind is TaskKind.RESERVED:
            for g in gpus:
                g.holder = task
                g.owner = task.container
        else:
            for g in gpus:
                g.users.append(task)
                if task.kind is TaskKind.EXCLUSIVE:
                    g.exclusive += 1
                    g.used_milli += GPU_MILLI
                else:
                    g.used_milli += task.milli
                if not task.evicting:
                    g.live += 1
        if not task.evicting:
            job.ready += 1
        job.queue.allocated_milli += task.request_milli

    def _detach(self, task: TaskState) -> None:
        job = task.job
        if task.kind is TaskKind.RESERVED:
            for g in task.devices:
                g.holder = None
                g.owner = None
        else:
            for g in task.devices:
                g.users.remove(task)
                if task.kind is TaskKind.EXCLUSIVE:
                    g.exclusive -= 1
                    g.used_milli -= GPU_MILLI
                else:
                    g.used_milli -= task.milli
                if not task.evicting:
                    g.live -= 1
        if not task.evicting:
            job.ready -= 1
        job.queue.allocated_milli -= task.request_milli
        task.node = None
        task.devices = []

    def place(self, task: TaskState, ns: NodeState, gpus: list[GPUState]) -> None:
        """Place a pending task tentatively (this cycle)."""
        if task.node is not None:
            raise AssertionError(f"{task.ref} is already placed")
        task.tentative = True
        self._attach(task, ns, gpus)
        self.refresh(ns)

    def unplace(self, task: TaskState) -> None:
        ns = task.node
        assert ns is not None and task.tentative
        self._detach(task)
        task.tentative = False
        self.refresh(ns)
        self.capacity_epoch += 1

    def set_evicting(self, task: TaskState, evicting: bool) -> None:
        if task.evicting == evicting:
            raise AssertionError(f"{task.ref}: evicting is already {evicting}")
        ns = task.node
        assert ns is not None
        step = -1 if evicting else 1
        task.evicting = evicting
        task.job.ready += step
        if task.kind is not TaskKind.RESERVED:
            for g in task.devices:
                g.live += step
        self.refresh(ns)

    def nominate(self, task: TaskState, ns: NodeState, gpus: list[GPUState]) -> None:
        for g in gpus:
            if g.nominee is not None:
                raise AssertionError(f"{g.id} is nominated for {g.nominee.ref} already")
            g.nominee = task
            if g.shadow is not None:
                g.shadow.nominated += 1
        task.nomination = (ns, gpus)
        self.refresh(ns)

    def unnominate(self, task: TaskState) -> tuple[NodeState, list[GPUState]] | None:
        nom = task.nomination
        if nom is None:
            return None
        ns, gpus = nom
        for g in gpus:
            g.nominee = None
            if g.shadow is not None:
                g.shadow.nominated -= 1
        task.nomination = None
        self.refresh(ns)
        self.capacity_epoch += 1
        return nom

    def add_shadow(self, shadow: ShadowState, gpus: list[GPUState]) -> None:
        for g in gpus:
            assert g.owner is None and g.shadow is None
            g.owner = shadow.owner
            g.shadow = shadow
        shadow.devices.extend(gpus)
        self.shadows[shadow.owner] = shadow
        self.refresh(shadow.node)

    def remove_shadow(self, shadow: ShadowState) -> None:
        for g in shadow.devices:
            g.owner = None
            g.shadow = None
        shadow.devices.clear()
        shadow.nominated = 0
        del self.shadows[shadow.owner]
        self.refresh(shadow.node)
        self.capacity_epoch += 1

    def set_shadow_deleting(self, shadow: ShadowState, deleting: bool) -> None:
        shadow.deleting = deleting
        self.refresh(shadow.node)

    # -- indexes ----------------------------------------------------------------------------
    def refresh(self, ns: NodeState) -> None:
        """Recompute the node's class and preemption key and move it in the indexes.

        Called after every change on the node; kept branch-light because it is the hottest
        function of a cycle (the rules are those of :meth:`GPUState.lend`, :meth:`GPUState.bindable`
        and :meth:`GPUState.reclaimable`, inlined).
        """
        ns.version += 1
        node = ns.node
        cls: NodeClass | None = None
        pkey: PreemptKey | None = None
        if node.schedulable:
            lending = node.lending
            free = spot_u = spot_l = zero = avail = top = 0
            partials: list[int] = []
            idle_in_shadow: list[ShadowState] | None = None
            for g in ns.gpus:
                if not g.healthy or g.nominee is not None:
                    continue
                users = g.users
                owner = g.owner
                shadow = g.shadow
                if owner is None:
                    lend = Lend.NEW_SHADOW
                    if not users:
                        free += 1
                elif shadow is not None:
                    lend = Lend.NO if shadow.deleting or shadow.nominated else Lend.SHADOW
                else:
                    holder = g.holder
                    lend = Lend.LENT if lending and (holder is None or not holder.tentative) else Lend.NO
                if lend and g.twin_ok:
                    if not users:
                        if lend is Lend.LENT:
                            spot_l += 1
                        else:
                            spot_u += 1
                    elif not g.exclusive and g.used_milli < GPU_MILLI:
                        partials.append(GPU_MILLI - g.used_milli)
                if owner is None or (shadow is not None and not shadow.new):
                    avail += 1
                    if g.live == 0:
                        if shadow is None or shadow.deleting:
                            zero += 1
                        elif idle_in_shadow is None:
                            idle_in_shadow = [shadow]
                        else:
                            idle_in_shadow.append(shadow)
                    else:
                        for u in users:
                            if not u.evicting and u.job.priority > top:
                                top = u.job.priority
            if idle_in_shadow is not None:
                # Freed only with the whole ShadowPod: zero cost only if none of its GPUs has a live user.
                zero += sum(1 for sh in idle_in_shadow if not sh.live_users())
            partials.sort()
            key = (
                node.resource,
                node.pool,
                node.strategy,
                lending,
                len(ns.gpus),
                free,
                spot_u,
                spot_l,
                tuple(partials),
            )
            cls = self._interned.get(key)
            if cls is None:
                cls = self._interned[key] = NodeClass(*key)
            if avail:
                pkey = PreemptKey(top, -zero, -avail, node.resource, node.pool)
        if cls is not ns.cls:
            if ns.cls is not None:
                del self.classes[ns.cls][ns]
            if cls is not None:
                bucket = self.classes.get(cls)
                if bucket is None:
                    bucket = self.classes[cls] = {}
                    self.class_list.append(cls)
                bucket[ns] = None
            ns.cls = cls
        if pkey != ns.pkey:
            if ns.pkey is not None:
                del self.pindex[ns.pkey][ns]
            if pkey is not None:
                pbucket = self.pindex.get(pkey)
                if pbucket is None:
                    pbucket = self.pindex[pkey] = {}
                    self._pkeys_sorted = None
                pbucket[ns] = None
            ns.pkey = pkey

    def dispose(self) -> None:
        """Break the reference cycles between nodes, GPUs, gangs and pods.

        After a cycle the whole state is garbage; without this, the cycles among its ~100k
        objects would wait for Python's cyclic collector (slowing the next cycles, which then
        traverse them). With it, reference counting frees everything at once. The state is
        unusable afterwards.
        """
        for ns in self.nodes.values():
            for g in ns.gpus:
                g.users.clear()
            ns.gpus.clear()
            ns.by_id.clear()
        for job in self.jobs.values():
            job.tasks.clear()
        for task in self.tasks.values():
            task.devices = []
            task.nomination = None
        for queue in self.queues.values():
            queue.jobs.clear()
        for shadow in self.shadows.values():
            shadow.devices.clear()
        self.classes.clear()
        self.pindex.clear()

    def preempt_keys(self) -> list[PreemptKey]:
        """Preemption keys in evaluation order (lowest top priority, most zero-cost GPUs first)."""
        if self._pkeys_sorted is None:
            self._pkeys_sorted = sorted(self.pindex)
        return self._pkeys_sorted


def _typed(items: object, cls: type[_T], what: str) -> tuple[_T, ...]:
    if not isinstance(items, tuple):
        raise SnapshotError(f"snapshot {what} must be a tuple (use Snapshot.of), got {type(items).__name__}")
    for item in items:
        if not isinstance(item, cls):
            raise SnapshotError(f"snapshot {what} must hold {cls.__name__} objects, got {type(item).__name__}")
    return items


__all__ = [
    "ClusterState",
    "GPUState",
    "JobState",
    "Lend",
    "NodeClass",
    "NodeState",
    "PreemptKey",
    "QueueState",
    "ShadowState",
    "TaskKind",
    "TaskShape",
    "TaskState",
]
