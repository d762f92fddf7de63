"""The simulated cluster's state: nodes, GPUs, owners, jobs, pods and ShadowPods.

Plain mutable records (the simulated world changes; decisions about it are data elsewhere);
no I/O. The simulation's components (:mod:`spotgpu.sim.simulation` and the modules it
dispatches to) mutate them only through their handlers, which keep the invariant checker and
the metrics informed. Each record caches the frozen scheduler object it
last produced (``Node``, ``Pod``, ``PodGroup``) and drops the cache when it changes, so a
snapshot reuses every unchanged object.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

from spotgpu.core.ids import DeviceID, NodeName
from spotgpu.core.lending import LendState
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import EvictionReason, Health
from spotgpu.scheduler.decisions import PodGroupPhase
from spotgpu.scheduler.model import GPURequest, Nomination

if TYPE_CHECKING:
    from collections.abc import Mapping

    from spotgpu.scheduler.model import GPU, IdleForecast, Node, Pod, PodGroup, ShadowPod
    from spotgpu.sim.lending import OwnerAgent
    from spotgpu.sim.scenario import JobSpec
    from spotgpu.sim.workloads import OwnerTrace


class Category(IntEnum):
    """What one GPU is doing (the allocation plot's bands; GPU-time per category is integrated)."""

    FREE = 0
    """Unallocated, nobody on it."""
    SHADOW_IDLE = 1
    """Held by a ShadowPod whose spot users are gone (until garbage collection)."""
    SPOT_UNALLOCATED = 2
    """Classic spot: spot work on an unallocated GPU (through a ShadowPod)."""
    RESERVED = 3
    """A reserved job runs on it."""
    OWNER_ACTIVE = 4
    """Its reserved owner is using it."""
    OWNER_IDLE = 5
    """Its owner is idle and no spot work runs on it (lent or not)."""
    SPOT_LENT = 6
    """Reclaimed: spot work on a lent GPU whose owner is idle."""
    SPOT_EXPOSED = 7
    """Spot work still on a GPU whose owner is back (the hold / exposure window)."""


CATEGORY_NAMES: tuple[str, ...] = tuple(c.name.lower() for c in Category)
SPOT_CATEGORIES = (Category.SPOT_UNALLOCATED, Category.SPOT_LENT, Category.SPOT_EXPOSED)


class JobPhase(IntEnum):
    PENDING = 0
    """Submitted (or requeued), waiting for placement."""
    BOUND = 1
    """All pods bound; work starts after the start latency."""
    RUNNING = 2
    EVICTED = 3
    """Torn down; its pods are going away, then it is requeued (spot) ."""
    DONE = 4


class GpuSim:
    __slots__ = ("cached", "category", "id", "index", "node", "owner", "owner_sim", "reserved_pod", "shadow", "users")

    def __init__(self, device: DeviceID, index: int, node: NodeSim) -> None:
        self.id = device
        self.index = index
        self.node = node
        self.owner: ContainerRef | None = None
        """The container the kubelet allocated the real GPU to (trace owner, reserved pod, ShadowPod)."""
        self.owner_sim: OwnerSim | None = None
        self.reserved_pod: PodSim | None = None
        self.shadow: ShadowSim | None = None
        self.users: list[PodSim] = []
        """Spot pods placed on it (running, starting or being evicted)."""
        self.category = Category.FREE
        self.cached: GPU | None = None
        """The scheduler's view of it last built (reused while owner and twin health stay)."""

    def running_spot(self) -> bool:
        """A spot process runs on it (its job is working and the pod was not killed)."""
        return any(u.job.phase is JobPhase.RUNNING and not u.killed for u in self.users)


class NodeSim:
    __slots__ = (
        "cached",
        "forecast",
        "forecast_kind",
        "forecast_node",
        "free_twins",
        "gpu_states",
        "gpus",
        "health",
        "health_key",
        "index",
        "kind",
        "name",
        "preempt_key",
        "room",
        "unallocated",
    )

    def __init__(self, index: int, name: NodeName) -> None:
        self.index = index
        self.name = name
        self.gpus: list[GpuSim] = []
        self.cached: Node | None = None
        self.free_twins = 0
        """GPUs whose twin is Healthy with no spot user and no nomination: room for spot pods."""
        self.unallocated = 0
        """GPUs unallocated or held by a ShadowPod: where reserved pods can go (maybe after preemption)."""
        self.room = 0
        """Spot room on its unallocated GPUs in milli, as the scheduler's ``auto`` demand rule counts it
        (:attr:`spotgpu.scheduler.rules.NodeSummary.unallocated_milli`)."""
        self.kind: tuple[object, ...] = ()
        """The multiset of its GPUs' states (see ``spotgpu.sim.snapshot.Snapshots.first_per_kind``)."""
        self.gpu_states: list[tuple[object, ...]] = []
        """Each GPU's state in ``kind``, in GPU order (a lent GPU's forecast bucket is added per cycle)."""
        self.forecast: tuple[tuple[object, ...], Mapping[DeviceID, IdleForecast]] | None = None
        """The last forecasts of its owners and their merge (reused while none changed)."""
        self.forecast_kind: tuple[object, object, tuple[float, ...], tuple[object, ...]] | None = None
        """The last kind with forecasts: (``gpu_states``, forecasts, leases, the kind)."""
        self.forecast_node: tuple[Node, Mapping[DeviceID, IdleForecast], Node] | None = None
        """The last scheduler object with idle forecasts: (``cached`` then, the forecasts, the object)."""
        self.health: dict[DeviceID, Health] | None = None
        self.health_key: tuple[object, ...] = ()
        """Twin health as the agent's rule gave it, and the inputs it was computed from."""
        self.preempt_key: tuple[int, int, int] = (0, 0, 0)
        """(top live spot priority, -GPUs free without victims, -GPUs reclaimable) over its
        unallocated and ShadowPod-held GPUs: the scheduler's documented preemption order."""


class OwnerSim:
    """A reserved owner from a trace, and the node agent's view of it."""

    __slots__ = (
        "active",
        "active_end",
        "agent",
        "forecast",
        "gpus",
        "hold_start",
        "idle_check",
        "index",
        "interval",
        "lend",
        "poll_phase",
        "ref",
        "trace",
    )

    def __init__(self, index: int, trace: OwnerTrace, ref: ContainerRef, gpus: list[GpuSim], poll_phase: float) -> None:
        self.index = index
        self.trace = trace
        self.ref = ref
        self.gpus = gpus
        self.poll_phase = poll_phase
        self.active = False
        self.active_end = 0.0
        self.interval = -1
        """Index of the current (or last) active interval in ``trace.active``."""
        self.agent: OwnerAgent | None = None
        """The agent's lending state for this owner (lending policies only)."""
        self.lend = LendState.ACTIVE
        """Mirrors ``agent.lend`` (read often: twin health, invariants)."""
        self.idle_check: int | None = None
        """Engine handle of the pending idle poll."""
        self.hold_start: float | None = None
        """When the owner came back while lent (start of the hold or exposure)."""
        self.forecast: tuple[object, float, dict[DeviceID, IdleForecast]] | None = None
        """The last forecast published for it: (lending state, as of, forecast per device)."""

    @property
    def devices(self) -> tuple[DeviceID, ...]:
        return tuple(g.id for g in self.gpus)


class JobSim:
    """A job's life across attempts (each eviction tears the gang down; a spot job is requeued)."""

    __slots__ = (
        "arrival",
        "attempt",
        "bound_at",
        "cached_group",
        "completion",
        "done_at",
        "evictions",
        "first_start",
        "group_ref",
        "index",
        "phase",
        "pod_phase",
        "pods",
        "remaining",
        "spec",
        "started_at",
        "submitted_at",
    )

    def __init__(self, index: int, spec: JobSpec) -> None:
        self.index = index
        self.spec = spec
        self.arrival = spec.arrival
        self.attempt = 0
        self.phase = JobPhase.PENDING
        self.pod_phase = PodGroupPhase.PENDING
        """The PodGroup phase the scheduler last set."""
        self.group_ref = PodRef("spot" if spec.spot else "reserved", spec.name)
        self.pods: list[PodSim] = []
        self.remaining = spec.duration
        """Seconds of work still to do (checkpointed progress is kept across evictions)."""
        self.submitted_at = spec.arrival
        self.bound_at: float | None = None
        self.started_at: float | None = None
        self.first_start: float | None = None
        self.done_at: float | None = None
        self.completion: int | None = None
        self.evictions: list[EvictionReason] = []
        self.cached_group: PodGroup | None = None

    @property
    def spot(self) -> bool:
        return self.spec.spot

    def placed(self) -> bool:
        return all(p.node is not None for p in self.pods)


class PodSim:
    __slots__ = ("cached", "evicting", "gpus", "job", "killed", "node", "nominated", "ref", "request")

    def __init__(self, job: JobSim, ref: PodRef, request: GPURequest) -> None:
        self.job = job
        self.ref = ref
        self.request = request
        self.gpus: list[GpuSim] = []
        self.node: NodeSim | None = None
        self.evicting = False
        self.killed = False
        self.nominated: Nomination | None = None
        self.cached: Pod | None = None

    @property
    def devices(self) -> tuple[DeviceID, ...]:
        return tuple(g.id for g in self.gpus)


class ShadowSim:
    __slots__ = ("cached", "created_at", "deleting", "gpus", "group", "node", "ref")

    def __init__(self, ref: PodRef, node: NodeSim, gpus: list[GpuSim], group: PodRef, created_at: float) -> None:
        self.ref = ref
        self.node = node
        self.gpus = gpus
        self.group = group
        self.created_at = created_at
        self.deleting = False
        self.cached: ShadowPod | None = None


def health_of(healthy: bool) -> Health:
    return Health.HEALTHY if healthy else Health.UNHEALTHY


__all__ = [
    "CATEGORY_NAMES",
    "SPOT_CATEGORIES",
    "Category",
    "GpuSim",
    "JobPhase",
    "JobSim",
    "NodeSim",
    "OwnerSim",
    "PodSim",
    "ShadowSim",
    "health_of",
]
