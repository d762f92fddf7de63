"""The decisions a scheduling cycle returns: what should be done, as data.

Pure data; no side effects. Adapters apply them (:mod:`spotgpu.kube.apply` in a cluster); the
model-level applier :mod:`spotgpu.scheduler.apply` says what each does to a snapshot, and the
simulator and tests use it. Re-exported by :mod:`spotgpu.scheduler.model` and
:mod:`spotgpu.scheduler`. See docs/scheduler.md, "Decisions".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from spotgpu.core import keys
from spotgpu.core.codec import format_assigned_devices
from spotgpu.core.ids import SPOT_GPU_RESOURCE, DeviceID, NodeName, ResourceName, to_spot_id
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.shadow import shadow_labels
from spotgpu.core.types import EvictionReason, PodDeviceType
from spotgpu.scheduler.status import Code

DEFAULT_CONTAINER: Final = "main"
"""Container name used when a pod does not say which of its containers requests the GPUs."""


class PodGroupPhase(StrEnum):
    """A PodGroup's phase (in the snapshot it reads and in the statuses it writes)."""

    PENDING = "Pending"
    """Waiting to be admitted (not enough members yet, queue over capacity) or requeued after eviction."""
    INQUEUE = "Inqueue"
    """Admitted: the scheduler tries to place it."""
    RUNNING = "Running"
    """At least ``min_member`` pods are placed."""


@dataclass(frozen=True, slots=True)
class DeviceOwner:
    """The owner of one real device a spot pod uses: a reserved container or a ShadowPod's."""

    device: DeviceID
    owner: ContainerRef


@dataclass(frozen=True, slots=True)
class Bind:
    """Bind ``pod`` to ``node`` with exactly these real ``devices``.

    For a reserved pod, ``resource`` is the real GPU resource and the kubelet must allocate
    these devices. For a spot pod, ``resource`` is ``platform/spot-gpu``; the kubelet allocates
    the twins (:meth:`twin_ids`) and ``owners`` names, per real device, the container the runtime
    syncs it from (write it as the ``platform.k8s.io/device-owner`` annotation:
    :meth:`annotations`). ``milli`` is the share of a shared spot pod (0 = whole GPUs).
    """

    pod: PodRef
    group: PodRef
    node: NodeName
    resource: ResourceName
    devices: tuple[DeviceID, ...]
    container: str = DEFAULT_CONTAINER
    milli: int = 0
    owners: tuple[DeviceOwner, ...] = ()

    @property
    def spot(self) -> bool:
        return self.resource == SPOT_GPU_RESOURCE

    def twin_ids(self) -> tuple[DeviceID, ...]:
        """The twins (``spot-<id>``) a spot pod gets from the kubelet."""
        return tuple(to_spot_id(d) for d in self.devices)

    def owner_map(self) -> dict[DeviceID, ContainerRef]:
        return {o.device: o.owner for o in self.owners}

    def annotations(self) -> dict[str, str]:
        """Pod annotations to write before binding (device-owner for spot pods; assigned devices)."""
        out = {
            keys.ASSIGNED_DEVICES: format_assigned_devices(
                self.resource, self.twin_ids() if self.spot else self.devices
            )
        }
        if self.owners:
            out[keys.DEVICE_OWNER] = json.dumps(
                {o.device: o.owner.format() for o in self.owners}, separators=(",", ":"), sort_keys=True
            )
        return out


@dataclass(frozen=True, slots=True)
class CreateShadowPod:
    """Create a ShadowPod on ``node`` requesting exactly these unallocated real ``devices``.

    It lives in the ShadowPod namespace (``shadowNamespace``: only the scheduler may write there),
    carries the ShadowPod label and annotation (:mod:`spotgpu.core.shadow`: what makes the agent
    believe it), runs a pause container named ``container`` and is the device owner of its
    devices for the gang's spot pods. Apply it before the binds of the same cycle that name it as owner.
    """

    pod: PodRef
    node: NodeName
    resource: ResourceName
    devices: tuple[DeviceID, ...]
    group: PodRef
    container: str = DEFAULT_CONTAINER

    @property
    def container_ref(self) -> ContainerRef:
        return ContainerRef(self.pod.namespace, self.pod.name, self.container)

    def labels(self) -> dict[str, str]:
        """The ShadowPod label, and the shadow-for label: the PodGroup's name, when it fits a label value."""
        return {**shadow_labels(), **({keys.SHADOW_FOR: self.group.name} if len(self.group.name) <= 63 else {})}

    def annotations(self) -> dict[str, str]:
        return {
            keys.POD_DEVICE_TYPE: PodDeviceType.SHADOW.value,
            keys.ASSIGNED_DEVICES: format_assigned_devices(self.resource, self.devices),
            keys.SHADOW_FOR: self.group.format(),
        }


@dataclass(frozen=True, slots=True)
class DeleteShadowPod:
    """Delete a ShadowPod whose devices no spot pod uses any more (or that preemption frees)."""

    pod: PodRef
    node: NodeName
    devices: tuple[DeviceID, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Evict:
    """Evict ``pod`` (a member of spot gang ``group``; whole gangs are always evicted together).

    ``preemptor`` is the reserved PodGroup the GPUs are freed for. Set the pod condition
    ``DisruptionTarget`` with ``reason`` and ``message``, kill, delete.
    """

    pod: PodRef
    group: PodRef
    node: NodeName | None
    devices: tuple[DeviceID, ...]
    reason: EvictionReason
    message: str
    preemptor: PodRef | None = None


@dataclass(frozen=True, slots=True)
class Nominate:
    """Keep ``devices`` on ``node`` for pending pod ``pod`` (preemption frees them for it)."""

    pod: PodRef
    group: PodRef
    node: NodeName
    devices: tuple[DeviceID, ...]

    def annotations(self) -> dict[str, str]:
        """The nominated-devices annotation (with ``status.nominatedNodeName`` = ``node``)."""
        value = {"node": self.node, "devices": list(self.devices)}
        return {keys.NOMINATED_DEVICES: json.dumps(value, separators=(",", ":"), sort_keys=True)}


@dataclass(frozen=True, slots=True)
class ClearNomination:
    """Drop a pod's nomination (it no longer applies); ``reason`` says why."""

    pod: PodRef
    reason: str


@dataclass(frozen=True, slots=True)
class PodGroupStatus:
    """Set a PodGroup's phase; ``reason``/``message`` go to its Scheduled/Unschedulable condition."""

    group: PodRef
    phase: PodGroupPhase
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """Why a gang that wanted to be placed in this cycle was not (or only nominated).

    ``code`` says what may change it (:mod:`spotgpu.scheduler.status`): ``Unschedulable`` (more
    capacity may), ``UnschedulableAndUnresolvable`` (freeing capacity cannot), ``Wait`` (it waits
    for pods being created or evicted, or for GPUs nominated to it), ``Error`` (a plugin failed).
    """

    group: PodRef
    reason: str
    code: Code = Code.UNSCHEDULABLE


Decision = Evict | DeleteShadowPod | ClearNomination | Nominate | CreateShadowPod | Bind | PodGroupStatus


@dataclass(frozen=True, slots=True)
class CycleStats:
    """Counts of one cycle (no wall-clock figures: the core never reads a clock)."""

    gangs_considered: int = 0
    gangs_placed: int = 0
    pods_placed: int = 0
    gangs_preempting: int = 0
    pods_evicted: int = 0
    shadows_created: int = 0
    shadows_deleted: int = 0


@dataclass(frozen=True, slots=True)
class CycleResult:
    """All decisions of one cycle, complete; each tuple is in a deterministic order.

    :meth:`decisions` yields them in the order to apply: evictions, ShadowPod deletions,
    nomination changes, ShadowPod creations, binds, PodGroup statuses.
    """

    evictions: tuple[Evict, ...] = ()
    shadow_deletions: tuple[DeleteShadowPod, ...] = ()
    cleared_nominations: tuple[ClearNomination, ...] = ()
    nominations: tuple[Nominate, ...] = ()
    shadow_creations: tuple[CreateShadowPod, ...] = ()
    binds: tuple[Bind, ...] = ()
    statuses: tuple[PodGroupStatus, ...] = ()
    unschedulable: tuple[Unschedulable, ...] = ()
    stats: CycleStats = field(default_factory=CycleStats)

    def decisions(self) -> Iterator[Decision]:
        yield from self.evictions
        yield from self.shadow_deletions
        yield from self.cleared_nominations
        yield from self.nominations
        yield from self.shadow_creations
        yield from self.binds
        yield from self.statuses

    def reasons(self) -> dict[PodRef, str]:
        """PodGroup -> why it was not placed in this cycle."""
        return {u.group: u.reason for u in self.unschedulable}


@dataclass(frozen=True, slots=True)
class Preemption:
    """The outcome of victim selection for one pending reserved gang.

    When ``possible``: evicting the PodGroups ``victims`` (in policy order, whole gangs) frees
    enough GPUs; ``evictions`` are the pods to evict, ``nominations`` the GPUs kept for the
    preemptor's pods, ``waiting_on`` pods already being evicted whose GPUs were counted as
    freed. Otherwise ``reason`` says why no victim set exists.
    """

    preemptor: PodRef
    possible: bool
    victims: tuple[PodRef, ...] = ()
    evictions: tuple[Evict, ...] = ()
    nominations: tuple[Nominate, ...] = ()
    waiting_on: tuple[PodRef, ...] = ()
    reason: str = ""


__all__ = [
    "DEFAULT_CONTAINER",
    "Bind",
    "ClearNomination",
    "CreateShadowPod",
    "CycleResult",
    "CycleStats",
    "Decision",
    "DeleteShadowPod",
    "DeviceOwner",
    "Evict",
    "Nominate",
    "PodGroupPhase",
    "PodGroupStatus",
    "Preemption",
    "Unschedulable",
]
