"""The mutable per-cycle mirrors of the snapshot's objects, and the keys nodes are indexed by.

No I/O and no clock. :class:`~spotgpu.scheduler.state.ClusterState` builds one mirror per node,
GPU, gang, pod and ShadowPod and changes only these (every change reversible); the rules that
read a GPU's mirror live in :mod:`spotgpu.scheduler.rules`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from spotgpu.core.ids import DeviceID, NodeName, ResourceName
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import GPU_MILLI, Health, NodeStrategy, QueueType, SpotPriority
from spotgpu.scheduler import lease, rules
from spotgpu.scheduler.model import GPU, Node, Pod, PodGroup, Queue
from spotgpu.scheduler.rules import Lend


class AutoLent(StrEnum):
    """Which lent twins of ``auto`` nodes a spot task's try may use (docs/scheduler.md,
    "Strategies"; the session chooses, :mod:`spotgpu.scheduler.demand` says when)."""

    NONE = "none"
    """None: the first try while the cycle's pending spot demand fits the unallocated room."""
    COVERING = "covering"
    """Those whose forecast's ``p20`` covers the task's want, before unallocated GPUs: the first
    try when the demand does not fit (they keep unallocated GPUs whole for gangs and reserved work)."""
    ALL = "all"
    """Any, after unallocated GPUs (as on ``idle`` nodes): the last try, and every other node strategy."""


class TaskKind(StrEnum):
    RESERVED = "reserved"
    """Whole real GPUs."""
    EXCLUSIVE = "exclusive"
    """Whole twins (exclusive spot)."""
    SHARED = "shared"
    """GPU milli of one twin (shared spot)."""


@dataclass(frozen=True, slots=True, eq=False)
class TaskShape:
    """What placement of a task depends on; tasks of one shape are interchangeable for node choice.

    Interned per cycle (:meth:`ClusterState.shape`): equal shapes are the same object, so identity
    is equality and hashing is cheap (shapes key the session's per-shape caches)."""

    kind: TaskKind
    resource: ResourceName
    gpus: int
    milli: int
    pool: str | None
    min_lease: float = 0.0
    """Spot: lent GPUs must have an idle forecast (p20) covering this many seconds (0: any)."""
    want: float = 0.0
    """Spot: the remainder lent GPUs should best fit, ``max(min_lease, checkpoint_interval)``."""
    auto_lent: AutoLent = AutoLent.ALL
    """Spot: which lent GPUs of ``auto`` nodes it may use (the session's first try restricts them)."""

    def describe(self) -> str:
        lease = f" with minLease {self.min_lease:g}s" if self.min_lease else ""
        if self.kind is TaskKind.SHARED:
            return f"{self.milli} milli of one spot GPU{lease}"
        what = "spot GPU" if self.kind is TaskKind.EXCLUSIVE else self.resource
        return f"{self.gpus} x {what}{lease}"


@dataclass(frozen=True, slots=True, eq=False)
class NodeClass:
    """A summary of a node's placement-relevant state. Scores are functions of (TaskShape, NodeClass).

    Interned per cycle (:meth:`ClusterState.refresh`): equal classes are the same object."""

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
    lent_partials: tuple[int, ...] = ()
    """Those of ``partials`` on lent GPUs (``auto`` nodes only; empty elsewhere)."""
    lent_leases: tuple[int, ...] = ()
    """Forecast buckets (:mod:`spotgpu.scheduler.lease`) of the ``spot_lent`` twins whose forecast is
    known, ascending (only in cycles where some pending spot gang declares a lease)."""

    @property
    def spot_free(self) -> int:
        return self.spot_unallocated + self.spot_lent

    def lent_usable(self, shape: TaskShape) -> int:
        """How many unused lent twins a spot task of ``shape`` may use here (optimistic for leases:
        a forecast bucket that may cover ``min_lease`` counts; the device picker decides exactly)."""
        if self.strategy is NodeStrategy.AUTO and shape.auto_lent is not AutoLent.ALL:
            if shape.auto_lent is AutoLent.NONE:
                return 0
            return lease.coverable(self.lent_leases, shape.want)  # want >= min_lease
        if shape.min_lease:
            return lease.coverable(self.lent_leases, shape.min_lease)
        return self.spot_lent

    def spot_usable(self, shape: TaskShape) -> int:
        """Unused twins a spot task of ``shape`` may use here (``spot_free`` without leases or tiers)."""
        return self.spot_unallocated + self.lent_usable(shape)

    @property
    def auto_lent(self) -> bool:
        """An ``auto`` node with lent capacity (which a spot task's first try restricts)."""
        return self.strategy is NodeStrategy.AUTO and bool(self.spot_lent or self.lent_partials)


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
    """One GPU's state in this cycle. The rules about it are :mod:`spotgpu.scheduler.rules`'."""

    __slots__ = (
        "exclusive",
        "healthy",
        "holder",
        "id",
        "index",
        "lease",
        "live",
        "node",
        "nominee",
        "owner",
        "p20",
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
        self.p20 = self.lease = -1  # lease.UNKNOWN (a literal: 40k GPUs per large cycle)
        """``p20``: its owner's conservative idle forecast in seconds; ``lease``: its bucket
        (:func:`spotgpu.scheduler.lease.bucket`). -1: unknown, or unused in this cycle."""

    def lend(self) -> Lend:
        """How spot work could use this GPU (ignoring its current users): :func:`rules.lend`."""
        return rules.lend(self, self.node.node.lending)

    def bindable(self) -> bool:
        """A reserved task could be bound to it now: :func:`rules.bindable` (inlined: hot)."""
        return self.healthy and self.owner is None and not self.users and self.nominee is None

    def reclaimable(self) -> bool:
        """Preemption could free it for a reserved task: :func:`rules.reclaimable`."""
        return rules.reclaimable(self)


class NodeState:
    __slots__ = ("by_id", "cls", "gpus", "name", "node", "order", "pkey", "room", "version")

    def __init__(self, node: Node, order: int) -> None:
        self.node = node
        self.name: NodeName = node.name
        self.order = order
        self.gpus = [GPUState(self, i, g) for i, g in enumerate(node.gpus)]
        self.by_id = {g.id: g for g in self.gpus}
        self.cls: NodeClass | None = None
        self.pkey: PreemptKey | None = None
        self.room = 0
        """Spot room on its unallocated GPUs in milli (:attr:`rules.NodeSummary.unallocated_milli`;
        0 while the node is not schedulable)."""
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
        "priority",
        "ref",
        "shape",
        "start_time",
        "tentative",
    )

    def __init__(self, pod: Pod, job: JobState, shape: TaskShape) -> None:
        self.pod = pod
        self.ref = pod.ref
        self.job = job
        self.priority = job.priority
        """Its gang's priority (fixed for the cycle; read by the rules as a user's priority)."""
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


__all__ = [
    "AutoLent",
    "GPUState",
    "JobState",
    "NodeClass",
    "NodeState",
    "PreemptKey",
    "QueueState",
    "ShadowState",
    "TaskKind",
    "TaskShape",
    "TaskState",
]
