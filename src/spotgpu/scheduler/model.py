"""The scheduler's public data model: the cluster snapshot it reads (and, re-exported from
:mod:`spotgpu.scheduler.decisions`, the decisions it returns).

Pure data; no side effects. Everything here is a frozen, slotted dataclass. Objects check their
own fields when they are constructed (a negative request, an unknown spot priority, a malformed
name raise :class:`SnapshotError` naming the object), and :func:`spotgpu.scheduler.run_cycle`
checks the snapshot as a whole (a device owned twice, a pod on an unknown node) before it
decides anything. See docs/scheduler.md for how to build a snapshot and apply decisions.

Conventions:

* Device IDs are always the *real* GPU IDs (``GPU-x``), also for spot pods, whose kubelet
  devices are the twins ``spot-GPU-x`` (``Bind.twin_ids`` converts).
* Times are seconds since the Unix epoch, as floats (``now`` of a cycle, pod start times).
* GPU amounts in queue capacities and usage are GPU milli (``core.types.GPU_MILLI`` = 1 GPU).
* A snapshot is cheap to rebuild: unchanged :class:`Node`, :class:`Pod` and :class:`PodGroup`
  objects can be reused from one snapshot to the next (``dataclasses.replace`` the changed ones).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from spotgpu.core import keys
from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import (
    NVIDIA_GPU_RESOURCE,
    SPOT_GPU_RESOURCE,
    DeviceID,
    NodeName,
    ResourceName,
    to_spot_id,
    validate_device_id,
    validate_resource_name,
)
from spotgpu.core.refs import ContainerRef, PodRef, RefError
from spotgpu.core.types import GPU_MILLI, Health, NodeStrategy, QueueType, SpotPriority
from spotgpu.scheduler.decisions import (
    DEFAULT_CONTAINER,
    PodGroupPhase,
)

MAX_FORECAST_S: Final = 30 * 86400
"""Idle forecasts above 30 days are not believed (an annotation claiming more is ignored)."""


class SnapshotError(ValidationError):
    """The snapshot is malformed or contradicts itself; the message names the object.

    Raised before any decision is made: a cycle that raises returns nothing at all.
    """


class SchedulerBug(Exception):
    """An internal invariant broke during a cycle (a bug, never bad input). No decisions are returned."""


# --------------------------------------------------------------------------------------------
# Snapshot: the cluster as the scheduler sees it at the start of a cycle
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GPU:
    """One real GPU of a node, with its twin ``spot-<id>``.

    ``owner`` is the container the kubelet allocated the real GPU to (a reserved pod's container
    or a ShadowPod's), or ``None`` when the GPU is unallocated. ``health`` is the real device's
    health (from the vendor's device plugin); ``twin`` is the twin's health as the spotgpu agent
    reports it: Healthy when the GPU is unallocated or its owner is idle (lendable), Unhealthy
    when the owner is using it.
    """

    id: DeviceID
    owner: ContainerRef | None = None
    twin: Health = Health.HEALTHY
    health: Health = Health.HEALTHY

    def __post_init__(self) -> None:
        try:
            validate_device_id(self.id)
            to_spot_id(self.id)
        except ValidationError as exc:
            raise SnapshotError(f"GPU {self.id!r}: {exc}") from None
        if self.owner is not None:
            if not isinstance(self.owner, ContainerRef):
                raise SnapshotError(f"GPU {self.id}: owner must be a ContainerRef, got {type(self.owner).__name__}")
            if self.owner.is_relative:
                raise SnapshotError(f"GPU {self.id}: owner {self.owner} must name its namespace")
        if not isinstance(self.twin, Health) or not isinstance(self.health, Health):
            raise SnapshotError(f"GPU {self.id}: twin and health must be core.types.Health values")


def parse_node_annotations(node: str, annotations: Mapping[str, str]) -> tuple[bool, NodeStrategy]:
    """Read a node's lending settings: (lending allowed, strategy).

    ``platform.k8s.io/lowpower-spot`` is ``"true"`` or ``"false"`` (default false: only
    unallocated GPUs are lent, through ShadowPods). ``platform.k8s.io/spot-prefer`` is ``auto``
    (the default), ``idle`` or ``lowpower``. Anything else raises :class:`SnapshotError` naming
    node and key.
    """
    raw_lending = annotations.get(keys.NODE_LOWPOWER_SPOT, "false").strip().lower()
    if raw_lending not in ("true", "false"):
        raise SnapshotError(
            f"node {node}: annotation {keys.NODE_LOWPOWER_SPOT}={annotations[keys.NODE_LOWPOWER_SPOT]!r}"
            " must be 'true' or 'false'"
        )
    raw_strategy = annotations.get(keys.NODE_SPOT_PREFER, keys.NODE_SPOT_PREFER_DEFAULT).strip().lower()
    try:
        strategy = NodeStrategy(raw_strategy)
    except ValueError:
        raise SnapshotError(
            f"node {node}: annotation {keys.NODE_SPOT_PREFER}={annotations[keys.NODE_SPOT_PREFER]!r}"
            f" must be one of {', '.join(s.value for s in NodeStrategy)}"
        ) from None
    return raw_lending == "true", strategy


@dataclass(frozen=True, slots=True)
class IdleForecast:
    """The node agent's forecast for one lent GPU: how long its owner stays idle from now.

    ``expected`` is the expected remainder in seconds, ``p20`` the conservative one (the owner
    stays idle at least this long with 80% probability). Both are whole seconds in
    ``0..MAX_FORECAST_S``.
    """

    expected: int
    p20: int

    def __post_init__(self) -> None:
        for name in ("expected", "p20"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_FORECAST_S:
                raise SnapshotError(
                    f"idle forecast: {name} must be whole seconds in 0..{MAX_FORECAST_S}, got {value!r}"
                )


NO_FORECAST: Final[Mapping[DeviceID, IdleForecast]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Node:
    """A GPU node: its real GPUs (in device-plugin order) and lending settings.

    ``lending`` is the node annotation that allows lending *allocated* idle GPUs (unallocated
    GPUs are always lendable through ShadowPods); ``strategy`` is ``auto`` (the default: prefer
    unallocated GPUs, lend allocated ones only to spot work that would otherwise wait), ``idle``
    (prefer unallocated GPUs, exclusive spot first) or ``lowpower`` (prefer lent idle GPUs,
    shared spot first). ``schedulable`` is false for cordoned or NotReady nodes: nothing new is
    placed there. ``pool`` is a free-form node pool (e.g. the GPU model); a PodGroup with a pool
    only goes there. ``idle_forecast``: the agent's forecast per lent GPU (real device ID; GPUs
    without one count as unknown, see :mod:`spotgpu.scheduler.lease`).
    """

    name: NodeName
    gpus: tuple[GPU, ...]
    resource: ResourceName = NVIDIA_GPU_RESOURCE
    lending: bool = False
    strategy: NodeStrategy = NodeStrategy.AUTO
    schedulable: bool = True
    pool: str = ""
    idle_forecast: Mapping[DeviceID, IdleForecast] = field(default_factory=lambda: NO_FORECAST, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SnapshotError(f"node name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.gpus, tuple):
            raise SnapshotError(f"node {self.name}: gpus must be a tuple, got {type(self.gpus).__name__}")
        try:
            validate_resource_name(self.resource)
        except ValidationError as exc:
            raise SnapshotError(f"node {self.name}: {exc}") from None
        if self.resource == SPOT_GPU_RESOURCE:
            raise SnapshotError(
                f"node {self.name}: its real GPU resource cannot be the twin resource {SPOT_GPU_RESOURCE}"
            )
        if not isinstance(self.strategy, NodeStrategy):
            raise SnapshotError(f"node {self.name}: strategy {self.strategy!r} is not a NodeStrategy")
        if self.idle_forecast:
            self._check_forecast()

    def _check_forecast(self) -> None:
        if not isinstance(self.idle_forecast, Mapping):
            raise SnapshotError(f"node {self.name}: idle_forecast must be a mapping, got {self.idle_forecast!r}")
        ids = {g.id for g in self.gpus if isinstance(g, GPU)}
        for device, forecast in self.idle_forecast.items():
            if device not in ids:
                raise SnapshotError(f"node {self.name}: idle forecast for device {device!r}, which it does not have")
            if not isinstance(forecast, IdleForecast):
                raise SnapshotError(f"node {self.name}: idle forecast for {device} must be an IdleForecast")


@dataclass(frozen=True, slots=True)
class Queue:
    """A queue of PodGroups. ``type`` spot makes its tasks spot tasks (they use twins).

    ``weight`` sets its fair share against queues of the same type; ``capacity_milli`` caps the
    GPU milli its running and newly placed pods may hold (``None``: no cap).
    """

    name: str
    type: QueueType = QueueType.RESERVED
    weight: int = 1
    capacity_milli: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SnapshotError(f"queue name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.type, QueueType):
            raise SnapshotError(f"queue {self.name}: type {self.type!r} is not a QueueType")
        if isinstance(self.weight, bool) or not isinstance(self.weight, int) or self.weight < 1:
            raise SnapshotError(f"queue {self.name}: weight must be an integer >= 1, got {self.weight!r}")
        cap = self.capacity_milli
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
            raise SnapshotError(f"queue {self.name}: capacity_milli must be None or an integer >= 0, got {cap!r}")


@dataclass(frozen=True, slots=True)
class PodGroup:
    """A gang: at least ``min_member`` of its pods are placed together, or none.

    ``priority`` is the priority-class value of a reserved gang; a spot gang is ordered and
    protected by ``spot_priority`` (spothigh 3000 > spotmid 2000 > spotlow 1000; default spotlow).
    A spot gang may declare ``min_lease`` (seconds: run only on GPUs expected to stay available
    that long) and ``checkpoint_interval`` (seconds between its checkpoints); see
    :mod:`spotgpu.scheduler.lease`. Both 0 (the default): no lease, forecasts are ignored.
    """

    ref: PodRef
    queue: str
    min_member: int = 1
    priority: int = 0
    spot_priority: SpotPriority | None = None
    phase: PodGroupPhase = PodGroupPhase.PENDING
    created_at: float = 0.0
    pool: str | None = None
    min_lease: float = 0.0
    checkpoint_interval: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.ref, PodRef) or self.ref.is_relative:
            raise SnapshotError(f"PodGroup {self.ref}: ref must be a PodRef with a namespace")
        for name in ("min_lease", "checkpoint_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise SnapshotError(
                    f"PodGroup {self.ref}: {name} must be a finite number of seconds >= 0, got {value!r}"
                )
        if not isinstance(self.queue, str) or not self.queue:
            raise SnapshotError(f"PodGroup {self.ref}: queue must be a non-empty string")
        if isinstance(self.min_member, bool) or not isinstance(self.min_member, int) or self.min_member < 1:
            raise SnapshotError(f"PodGroup {self.ref}: min_member must be an integer >= 1, got {self.min_member!r}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise SnapshotError(f"PodGroup {self.ref}: priority must be an integer, got {self.priority!r}")
        if self.spot_priority is not None and not isinstance(self.spot_priority, SpotPriority):
            raise SnapshotError(f"PodGroup {self.ref}: spot_priority {self.spot_priority!r} is not a SpotPriority")
        if not isinstance(self.phase, PodGroupPhase):
            raise SnapshotError(f"PodGroup {self.ref}: phase {self.phase!r} is not a PodGroupPhase")


@dataclass(frozen=True, slots=True)
class GPURequest:
    """What one pod asks for, in its GPU container.

    Reserved pods ask for ``gpus`` whole real GPUs of ``resource`` (e.g. ``nvidia.com/gpu``).
    Spot pods ask for ``platform/spot-gpu``: ``gpus`` whole twins (exclusive spot) or ``milli``
    of one twin, 1..999 (shared spot). Use the constructors :meth:`reserved`, :meth:`spot` and
    :meth:`shared`. Validity is checked by the :class:`Pod` that carries the request, so that
    the error names the pod.
    """

    resource: ResourceName
    gpus: int = 0
    milli: int = 0

    @classmethod
    def reserved(cls, gpus: int, resource: ResourceName = NVIDIA_GPU_RESOURCE) -> GPURequest:
        return cls(resource, gpus=gpus)

    @classmethod
    def spot(cls, gpus: int) -> GPURequest:
        return cls(SPOT_GPU_RESOURCE, gpus=gpus)

    @classmethod
    def shared(cls, milli: int) -> GPURequest:
        return cls(SPOT_GPU_RESOURCE, milli=milli)

    @property
    def is_spot(self) -> bool:
        return self.resource == SPOT_GPU_RESOURCE

    @property
    def is_shared(self) -> bool:
        return self.milli > 0

    @property
    def total_milli(self) -> int:
        """The request in GPU milli (queue accounting)."""
        return self.gpus * GPU_MILLI + self.milli

    def problem(self) -> str | None:
        """Why the request is invalid, or ``None``."""
        for name in ("gpus", "milli"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                return f"{name} must be an integer, got {value!r}"
            if value < 0:
                return f"{name} must not be negative, got {value}"
        try:
            validate_resource_name(self.resource)
        except ValidationError as exc:
            return str(exc)
        if self.gpus and self.milli:
            return f"asks for both {self.gpus} whole GPUs and {self.milli} milli; shared spot takes a part of one GPU"
        if not self.gpus and not self.milli:
            return "asks for no GPU; spotgpu schedules GPU pods only"
        if self.milli and not self.is_spot:
            return f"milli ({self.milli}) is only for shared spot pods ({SPOT_GPU_RESOURCE})"
        if self.milli >= GPU_MILLI:
            return f"milli must be below {GPU_MILLI} (one GPU), got {self.milli}; ask for whole GPUs instead"
        return None


@dataclass(frozen=True, slots=True)
class Nomination:
    """GPUs freed (or being freed) by preemption and kept for a pending pod."""

    node: NodeName
    devices: tuple[DeviceID, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.node, str) or not isinstance(self.devices, tuple):
            raise SnapshotError(
                f"nomination needs a node name and a tuple of devices, got {self.node!r}, {self.devices!r}"
            )


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod of a PodGroup (``group`` is the PodGroup's name in the pod's namespace).

    Pending pods have ``node is None``. Placed pods (bound or running) have ``node`` and the
    real ``devices`` they hold (reserved) or share through twins (spot; a shared spot pod has
    one device and uses ``request.milli`` of it). ``start_time`` is when the pod started running
    (for the running-duration victim weight; bind time is fine). ``evicting`` is true once the
    pod is being deleted or evicted (deletionTimestamp or the DisruptionTarget condition):
    its devices count as freed for preemption, but nothing new is bound to them until it is gone.
    ``nominated`` is a pending pod's nomination from an earlier preemption.
    """

    ref: PodRef
    group: str
    request: GPURequest
    container: str = DEFAULT_CONTAINER
    node: NodeName | None = None
    devices: tuple[DeviceID, ...] = ()
    start_time: float | None = None
    evicting: bool = False
    nominated: Nomination | None = None
    created_at: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.ref, PodRef) or self.ref.is_relative:
            raise SnapshotError(f"pod {self.ref}: ref must be a PodRef with a namespace")
        if not isinstance(self.group, str) or not self.group:
            raise SnapshotError(f"pod {self.ref}: group must name its PodGroup")
        if not isinstance(self.request, GPURequest):
            raise SnapshotError(f"pod {self.ref}: request must be a GPURequest, got {type(self.request).__name__}")
        problem = self.request.problem()
        if problem is not None:
            raise SnapshotError(f"pod {self.ref}: request {problem}")
        try:
            ContainerRef(self.ref.namespace, self.ref.name, self.container)
        except RefError as exc:
            raise SnapshotError(f"pod {self.ref}: container {self.container!r}: {exc}") from None
        if self.nominated is not None and not isinstance(self.nominated, Nomination):
            raise SnapshotError(f"pod {self.ref}: nominated must be a Nomination, got {type(self.nominated).__name__}")
        if not isinstance(self.devices, tuple):
            raise SnapshotError(f"pod {self.ref}: devices must be a tuple, got {type(self.devices).__name__}")
        if self.node is None:
            if self.devices:
                raise SnapshotError(f"pod {self.ref}: has devices {list(self.devices)} but no node")
        else:
            want = 1 if self.request.is_shared else self.request.gpus
            if len(self.devices) != want:
                raise SnapshotError(
                    f"pod {self.ref}: placed on {self.node} with {len(self.devices)} devices {list(self.devices)}"
                    f" but its request needs {want}"
                )
            if len(set(self.devices)) != len(self.devices):
                raise SnapshotError(f"pod {self.ref}: lists a device twice: {list(self.devices)}")

    @property
    def placed(self) -> bool:
        return self.node is not None

    @property
    def group_ref(self) -> PodRef:
        return PodRef(self.ref.namespace, self.group)

    @property
    def container_ref(self) -> ContainerRef:
        return ContainerRef(self.ref.namespace, self.ref.name, self.container)


@dataclass(frozen=True, slots=True)
class ShadowPod:
    """A placeholder pod holding unallocated real GPUs while spot pods use them.

    The GPUs it holds have ``owner == ContainerRef(ns, name, container)`` in the snapshot.
    ``group`` is the spot PodGroup it was created for (label ``scheduling.spotgpu.io/shadow-for``).
    A ShadowPod without spot users is deleted by the scheduler after ``shadowGcGrace``.
    """

    ref: PodRef
    node: NodeName
    devices: tuple[DeviceID, ...]
    container: str = DEFAULT_CONTAINER
    group: PodRef | None = None
    created_at: float = 0.0
    deleting: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.ref, PodRef) or self.ref.is_relative:
            raise SnapshotError(f"ShadowPod {self.ref}: ref must be a PodRef with a namespace")
        if not isinstance(self.devices, tuple) or not self.devices:
            raise SnapshotError(f"ShadowPod {self.ref}: devices must be a non-empty tuple, got {self.devices!r}")
        if self.group is not None and not isinstance(self.group, PodRef):
            raise SnapshotError(f"ShadowPod {self.ref}: group must be a PodRef, got {type(self.group).__name__}")
        if len(set(self.devices)) != len(self.devices):
            raise SnapshotError(f"ShadowPod {self.ref}: lists a device twice: {list(self.devices)}")

    @property
    def container_ref(self) -> ContainerRef:
        return ContainerRef(self.ref.namespace, self.ref.name, self.container)


@dataclass(frozen=True, slots=True)
class VictimScale:
    """Cluster-wide maxima that victim scores are normalised by, for a snapshot that leaves gangs out.

    The victim policy normalises each factor by its maximum over the running spot gangs (see the
    spot plugin). A snapshot that leaves nodes out, and with them running spot gangs, would
    normalise over fewer gangs and could rank victims differently than a full one. Given a
    scale, a cycle normalises by the larger of the snapshot's own maxima and these, so a partial
    snapshot that holds every candidate victim scores exactly like the full one. Over the running
    spot gangs (placed pods not being evicted): ``tasks`` the most pods of one gang, ``milli``
    the most GPU milli of one gang (1000 per whole GPU), ``earliest_start`` the earliest start
    time of a gang (its earliest pod's ``start_time``; ``None``: no gang).
    """

    tasks: int = 0
    milli: int = 0
    earliest_start: float | None = None

    def __post_init__(self) -> None:
        for name in ("tasks", "milli"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SnapshotError(f"victim scale: {name} must be a non-negative integer, got {value!r}")
        start = self.earliest_start
        if start is not None and (
            isinstance(start, bool) or not isinstance(start, int | float) or not math.isfinite(start)
        ):
            raise SnapshotError(f"victim scale: earliest_start must be a finite time or None, got {start!r}")


@dataclass(frozen=True, slots=True)
class SpotOutside:
    """What a snapshot that leaves nodes or pending spot pods out would have counted for the
    ``auto`` strategy's demand rule (:mod:`spotgpu.scheduler.demand`), in GPU milli: ``pending``
    the spot requests of the pending spot pods left out, by their PodGroup's pool (``None``: any),
    and ``room`` the spot room on unallocated GPUs of the schedulable nodes left out, by node pool
    (:attr:`spotgpu.scheduler.rules.NodeSummary.unallocated_milli`). A cycle adds them to what its
    snapshot holds, so it judges the demand as on the full snapshot."""

    pending: Mapping[str | None, int] = field(default_factory=dict, hash=False)
    room: Mapping[str, int] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for what, table, keyed in (("pending", self.pending, (str, type(None))), ("room", self.room, (str,))):
            if not isinstance(table, Mapping):
                raise SnapshotError(f"spot outside: {what} must be a mapping, got {type(table).__name__}")
            for pool, milli in table.items():
                if not isinstance(pool, keyed):
                    raise SnapshotError(f"spot outside: {what} has a pool key {pool!r} that is not a pool name")
                if isinstance(milli, bool) or not isinstance(milli, int) or milli < 0:
                    raise SnapshotError(f"spot outside: {what}[{pool!r}] must be a non-negative integer, got {milli!r}")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one cycle needs. Build with tuples; :meth:`of` accepts any iterables.

    ``pods`` are the pods spotgpu schedules (members of PodGroups), pending or placed. Reserved
    pods not scheduled by spotgpu (a developer machine started by the default scheduler) do not
    appear here: they appear as the ``owner`` of the GPUs they hold. ``victim_scale`` and
    ``spot_outside``: only for snapshots that leave running spot gangs, nodes or pending spot pods
    out (see :class:`VictimScale`, :class:`SpotOutside`).
    """

    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    groups: tuple[PodGroup, ...]
    pods: tuple[Pod, ...]
    shadows: tuple[ShadowPod, ...] = ()
    victim_scale: VictimScale | None = None
    spot_outside: SpotOutside | None = None

    @classmethod
    def of(
        cls,
        nodes: Iterable[Node],
        queues: Iterable[Queue],
        groups: Iterable[PodGroup] = (),
        pods: Iterable[Pod] = (),
        shadows: Iterable[ShadowPod] = (),
        *,
        victim_scale: VictimScale | None = None,
        spot_outside: SpotOutside | None = None,
    ) -> Snapshot:
        return cls(tuple(nodes), tuple(queues), tuple(groups), tuple(pods), tuple(shadows), victim_scale, spot_outside)


__all__ = [
    "MAX_FORECAST_S",
    "NO_FORECAST",
    "GPU",
    "GPURequest",
    "IdleForecast",
    "Node",
    "Nomination",
    "Pod",
    "PodGroup",
    "Queue",
    "SchedulerBug",
    "ShadowPod",
    "Snapshot",
    "SnapshotError",
    "SpotOutside",
    "VictimScale",
    "parse_node_annotations",
]
