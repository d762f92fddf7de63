"""The agent's pure decisions: who owns which GPU, which twins are Healthy, whom to evict.

Pure functions over plain data; no I/O, no clock reads, no locks. The agent process
(:mod:`spotgpu.agent.solver`) calls them with what it measured and applies the returned plans
through its ports; the simulator can call the same functions with its model's data.
One of the agent's pure modules (``model``, ``steer``, ``detect``, ``settings``, ``ports``): an
import-linter contract keeps adapters, gRPC, protobuf, Prometheus and NVML out of it and of
everything it imports.

Decisions made here:

* :func:`build_mapping`: the MappingCache content from the kubelet's pod-resources view (the
  authority on which container holds which real GPU and which spot container holds which
  twin) and the pods (authentic ShadowPods only, :mod:`spotgpu.core.shadow`; forged claims are
  reported). Devices nobody holds belong to IDLE_SPACE.
* :func:`twin_health`: a twin is Healthy when its real GPU is healthy and unallocated, held by
  a ShadowPod, or held by an owner that is lent out (idle); otherwise Unhealthy. Unknown is
  Unhealthy ("when in doubt, fail closed").
* :func:`plan_eviction`: every spot pod using any of an owner's GPUs, with every container ID
  the API or the container runtime knows for it.
* :func:`find_violations`: spot users on GPUs whose twin is not Healthy (after a restart, a
  reserved pod taking a GPU, a failed GPU): these must be evicted.
* :func:`allocate_refusal`: whether Allocate gives a twin, and why not: the one rule behind
  Allocate and the twin's health on ListAndWatch (Healthy means Allocate will succeed).
* :func:`allocate_annotations`: the device plugin's Allocate answer, the unsuffixed
  ``container-devices-from`` annotation naming each twin's owner as the sync source.
* :func:`pending_shadows`: unheld GPUs an authentic ShadowPod bound to this node will hold.
* :func:`node_state_annotation`: the per-device state the agent publishes on its node.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from spotgpu.core import keys
from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.codec import (
    DevicesFrom,
    SyncKind,
    SyncSource,
    devices_from_key,
    format_devices_from,
    parse_assigned_devices,
)
from spotgpu.core.errors import PermanentError
from spotgpu.core.holders import ReleaseScope
from spotgpu.core.ids import (
    DeviceID,
    DeviceIDError,
    ResourceName,
    real_of_twin,
    replica_id,
    to_spot_id,
)
from spotgpu.core.lending import LendState
from spotgpu.core.mapping_cache import IDLE_SPACE, DeviceEntry, MappingSnapshot, Owner, OwnerEntry
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.shadow import ShadowCheck, ShadowClaim, check_shadow
from spotgpu.core.types import EvictionReason, Health, OwnerState
from spotgpu.ports.kube import PodInfo
from spotgpu.ports.node import GpuDevice, RuntimeContainer


@dataclass(frozen=True, slots=True)
class MappingBuild:
    """Result of :func:`build_mapping`."""

    snapshot: MappingSnapshot
    shadow_owners: frozenset[ContainerRef]
    problems: tuple[str, ...] = ()
    """Inconsistencies found (logged and counted by the caller; never fatal)."""
    forged_shadows: tuple[PodRef, ...] = ()
    """Pods holding GPUs that claim to be ShadowPods but are not (:func:`spotgpu.core.shadow.check_shadow`):
    treated as ordinary owners; also named in ``problems``."""


def shadow_check(pod: PodInfo, shadow_namespace: str) -> ShadowCheck:
    """Whether ``pod`` is an authentic ShadowPod (the one rule, :mod:`spotgpu.core.shadow`)."""
    return check_shadow(pod.ref.namespace, pod.annotations, pod.labels, shadow_namespace=shadow_namespace)


def build_mapping(
    devices: Sequence[GpuDevice],
    allocations: Iterable[AllocatedDevices],
    pods: Mapping[PodRef, PodInfo],
    *,
    gpu_resource: ResourceName,
    spot_resource: ResourceName,
    extra_spot_resources: Collection[ResourceName] = (),
    shadow_namespace: str = keys.DEFAULT_SHADOW_NAMESPACE,
) -> MappingBuild:
    """The owner -> device -> spot users map this node's state implies.

    Spot users are the holders of twins of ``spot_resource`` and of ``extra_spot_resources``
    (the shared spot resource's replicas). Real devices not in ``devices`` (another backend's,
    or gone) are ignored with a problem noted; a device reported for two containers keeps its
    first holder (sorted by reference). A holder is a ShadowPod only when it is an authentic one
    (:func:`shadow_check`); a forged claim makes it an ordinary owner, noted in ``problems``
    and ``forged_shadows``.
    """
    spot_resources = {spot_resource, *extra_spot_resources}
    known = {d.id for d in devices}
    problems: list[str] = []
    owner_of: dict[DeviceID, Owner] = {}
    users: dict[DeviceID, set[PodRef]] = {d.id: set() for d in devices}
    shadow: set[ContainerRef] = set()
    forged: dict[PodRef, str] = {}
    ordered = sorted(allocations, key=lambda a: (a.pod.format(), a.container, a.resource))
    for alloc in ordered:
        if alloc.resource != gpu_resource:
            continue
        owner = ContainerRef(alloc.pod.namespace, alloc.pod.name, alloc.container)
        info = pods.get(alloc.pod)
        check = shadow_check(info, shadow_namespace) if info is not None else None
        if check is not None and check.authentic:
            shadow.add(owner)
        elif check is not None and check.claim is ShadowClaim.FORGED:
            forged[alloc.pod] = check.reason
        for device in alloc.device_ids:
            if device not in known:
                problems.append(f"{owner} holds {gpu_resource} device {device!r}, which this node's GPU backend lacks")
                continue
            holder = owner_of.setdefault(device, owner)
            if holder != owner:
                problems.append(f"device {device!r} is reported for both {holder} and {owner}; keeping {holder}")
    for alloc in ordered:
        if alloc.resource not in spot_resources:
            continue
        for twin in alloc.device_ids:
            real = real_of_twin(twin, known)
            if real is None:
                problems.append(f"{alloc.pod}/{alloc.container} holds unknown twin {twin!r}")
                continue
            users[real].add(alloc.pod)
    table: dict[Owner, list[DeviceEntry]] = {}
    for device in sorted(known):
        device_owner: Owner = owner_of.get(device, IDLE_SPACE)
        table.setdefault(device_owner, []).append(DeviceEntry(device, tuple(sorted(users[device]))))
    entries = [OwnerEntry(o, tuple(ds)) for o, ds in table.items()]
    entries.sort(key=lambda e: (0, "") if e.owner is IDLE_SPACE else (1, e.owner.format()))
    problems += [f"pod {ref} {reason}: treated as an ordinary owner" for ref, reason in sorted(forged.items())]
    return MappingBuild(MappingSnapshot(tuple(entries)), frozenset(shadow), tuple(problems), tuple(sorted(forged)))


def owners_of(snapshot: MappingSnapshot) -> dict[ContainerRef, tuple[DeviceID, ...]]:
    """Container owners (not IDLE_SPACE) and their devices."""
    return {e.owner: tuple(d.device for d in e.devices) for e in snapshot.owners if isinstance(e.owner, ContainerRef)}


def device_index(snapshot: MappingSnapshot) -> dict[DeviceID, tuple[Owner, tuple[PodRef, ...]]]:
    """``{device: (owner, users)}``."""
    return {d.device: (e.owner, d.users) for e in snapshot.owners for d in e.devices}


def twin_health(
    devices: Sequence[GpuDevice],
    snapshot: MappingSnapshot,
    lend_states: Mapping[ContainerRef, LendState],
    shadow_owners: frozenset[ContainerRef],
) -> dict[DeviceID, Health]:
    """Health of each real device's twin (keyed by the *real* ID; see module docstring)."""
    index = device_index(snapshot)
    result: dict[DeviceID, Health] = {}
    for device in devices:
        owner = index.get(device.id, (None, ()))[0]
        healthy = device.healthy and (
            owner is IDLE_SPACE
            or (
                isinstance(owner, ContainerRef) and (owner in shadow_owners or lend_states.get(owner) is LendState.LENT)
            )
        )
        result[device.id] = Health.HEALTHY if healthy else Health.UNHEALTHY
    return result


@dataclass(frozen=True, slots=True)
class Victim:
    """A spot pod to evict: the owner's devices it uses and its containers' runtime IDs."""

    pod: PodRef
    devices: tuple[DeviceID, ...]
    container_ids: tuple[str, ...]


NO_SCOPE: Final = ReleaseScope()
"""The release scope of a plan made without one (tests): nobody known, nothing judged."""


@dataclass(frozen=True, slots=True)
class EvictionPlan:
    """Take ``devices`` back from every spot user; ``owner`` is released (guard) afterwards."""

    owner: Owner
    devices: tuple[DeviceID, ...]
    reason: EvictionReason
    victims: tuple[Victim, ...]
    at: float
    """When the trigger happened (monotonic seconds): the start of eviction latency."""
    scope: ReleaseScope = NO_SCOPE
    """Who may still hold these devices at the release (:func:`release_scope`)."""

    @property
    def container_ids(self) -> tuple[str, ...]:
        return tuple(sorted({c for v in self.victims for c in v.container_ids}))


def runtime_container_ids(pod: PodRef, runtime: Iterable[RuntimeContainer]) -> tuple[str, ...]:
    """IDs of the application containers (not sandboxes) the runtime labels with ``pod``."""
    found = []
    for container in runtime:
        labels = container.labels
        if labels.get(keys.LABEL_POD_NAMESPACE) != pod.namespace or labels.get(keys.LABEL_POD_NAME) != pod.name:
            continue
        if labels.get(keys.LABEL_CRI_KIND) == keys.CRI_TYPE_SANDBOX:
            continue
        found.append(container.id)
    return tuple(sorted(found))


def victim_container_ids(pod: PodRef, info: PodInfo | None, runtime: Iterable[RuntimeContainer]) -> tuple[str, ...]:
    """Every container ID of ``pod``: those the API reports (containers, init containers, native
    sidecars, ephemeral containers) and those the runtime labels with it."""
    ids = set(runtime_container_ids(pod, runtime))
    if info is not None:
        ids.update(info.container_ids)
    return tuple(sorted(ids))


def plan_eviction(
    snapshot: MappingSnapshot,
    owner: Owner,
    devices: Sequence[DeviceID],
    pods: Mapping[PodRef, PodInfo],
    runtime: Sequence[RuntimeContainer],
    *,
    reason: EvictionReason,
    at: float,
    exempt_namespaces: Collection[str] = (),
) -> EvictionPlan:
    """Every spot user of ``devices`` (the owner's), with all its container IDs, and the scope of
    the release check (:func:`release_scope`)."""
    wanted = set(devices)
    uses: dict[PodRef, set[DeviceID]] = {}
    for device, (_, users) in device_index(snapshot).items():
        if device in wanted:
            for user in users:
                uses.setdefault(user, set()).add(device)
    victims = tuple(
        Victim(pod, tuple(sorted(devs)), victim_container_ids(pod, pods.get(pod), runtime))
        for pod, devs in sorted(uses.items())
    )
    scope = release_scope(snapshot, owner, wanted, victims, pods, runtime, exempt_namespaces)
    return EvictionPlan(owner, tuple(sorted(wanted)), reason, victims, at, scope)


def release_scope(  # noqa: PLR0917 -- the plan's inputs, in plan_eviction's order
    snapshot: MappingSnapshot,
    owner: Owner,
    devices: Collection[DeviceID],
    victims: Sequence[Victim],
    pods: Mapping[PodRef, PodInfo],
    runtime: Sequence[RuntimeContainer],
    exempt_namespaces: Collection[str] = (),
    *,
    users_allowed: bool = False,
) -> ReleaseScope:
    """Who may hold ``devices`` when ``owner`` is released (:mod:`spotgpu.core.holders`): the
    pods pod-resources says hold them (the owner's), pods holding other GPUs of the node (the
    shared control nodes), the victims (a holder of theirs dies in whatever container it runs).
    ``users_allowed`` (the holder watch, between returns): the devices' spot users hold them by
    right (they are lent now)."""
    uids = {ref: info.uid for ref, info in pods.items() if info.uid}
    owner_refs: set[PodRef] = set()
    gpu_refs: set[PodRef] = set()
    for device, (holder, users) in device_index(snapshot).items():
        if isinstance(holder, ContainerRef):
            (owner_refs if device in devices else gpu_refs).add(holder.pod_ref)
        if device not in devices:
            gpu_refs.update(users)
        elif users_allowed:
            owner_refs.update(users)
    if isinstance(owner, ContainerRef):
        owner_refs.add(owner.pod_ref)
    victim_refs = {v.pod for v in victims}
    owner_cids = {cid for ref in owner_refs for cid in victim_container_ids(ref, pods.get(ref), runtime)}
    return ReleaseScope(
        owner_pods=frozenset(uids[r] for r in owner_refs if r in uids),
        owner_containers=frozenset(owner_cids),
        victim_pods=frozenset(uids[r] for r in victim_refs if r in uids),
        gpu_pods=frozenset(uids[r] for r in gpu_refs - victim_refs if r in uids),
        known_pods=frozenset(uids.values()),
        exempt_pods=frozenset(uid for ref, uid in uids.items() if ref.namespace in set(exempt_namespaces)),
    )


WatchScope = tuple[ContainerRef, tuple[DeviceID, ...], ReleaseScope]
"""An owner, its devices, and who may hold them (:func:`watch_scopes`)."""


def watch_scopes(  # noqa: PLR0917 -- the solver's state, as plan_eviction takes it
    snapshot: MappingSnapshot,
    owners: Collection[ContainerRef],
    lent: Collection[ContainerRef],
    pods: Mapping[PodRef, PodInfo],
    runtime: Sequence[RuntimeContainer],
    spot_resources: Collection[str],
    exempt_namespaces: Collection[str] = (),
) -> list[WatchScope]:
    """The holder watch's scopes (:mod:`spotgpu.agent.holderwatch`): for each of ``owners``
    (lent now or lately), its devices and who may hold them now: the owner's pod, the devices'
    spot users and, for an owner in ``lent``, every spot pod (one that just started is not in
    pod-resources yet); only pods the agent knows are judged."""
    groups: dict[ContainerRef, list[DeviceID]] = {}
    for device, (holder, _) in sorted(device_index(snapshot).items()):
        if isinstance(holder, ContainerRef) and holder in owners:
            groups.setdefault(holder, []).append(device)
    spot_uids = frozenset(
        info.uid
        for info in pods.values()
        if info.uid and any(set(c.requests) & set(spot_resources) for c in info.containers)
    )
    scopes = []
    for owner, devs in sorted(groups.items(), key=lambda g: g[0].format()):
        scope = release_scope(snapshot, owner, devs, (), pods, runtime, exempt_namespaces, users_allowed=True)
        allowed = scope.owner_pods | spot_uids if owner in lent else scope.owner_pods
        scopes.append((owner, tuple(devs), replace(scope, owner_pods=allowed, only_known=True)))
    return scopes


@dataclass(frozen=True, slots=True)
class Violation:
    """Spot users found on devices whose twins are not Healthy."""

    owner: Owner
    devices: tuple[DeviceID, ...]
    reason: EvictionReason


def find_violations(
    devices: Sequence[GpuDevice],
    snapshot: MappingSnapshot,
    health: Mapping[DeviceID, Health],
    *,
    skip_owners: frozenset[Owner] = frozenset(),
    default_reason: EvictionReason,
) -> list[Violation]:
    """Devices with spot users whose twin is Unhealthy, grouped by owner.

    A failed GPU gives :attr:`EvictionReason.DEVICE_UNHEALTHY`; anything else
    ``default_reason`` (``Recovery`` after a restart, ``ReservedPreempt`` when a reserved
    container received a GPU that spot work still used). Owners in ``skip_owners`` (an
    eviction is already running for them) are left out.
    """
    failed = {d.id for d in devices if not d.healthy}
    grouped: dict[tuple[Owner, EvictionReason], list[DeviceID]] = {}
    for device, (owner, users) in sorted(device_index(snapshot).items()):
        if not users or health.get(device) is Health.HEALTHY or owner in skip_owners:
            continue
        reason = EvictionReason.DEVICE_UNHEALTHY if device in failed else default_reason
        grouped.setdefault((owner, reason), []).append(device)
    return [Violation(owner, tuple(devs), reason) for (owner, reason), devs in grouped.items()]


class AllocateRefused(PermanentError):
    """The kubelet asked for twins we cannot give; the message says which and why."""


@dataclass(frozen=True, slots=True)
class TwinView:
    """What Allocate needs to know about one twin."""

    real: DeviceID
    health: Health
    """Whether the GPU is lendable now (:func:`twin_health`)."""
    owner: Owner | None
    pending: ContainerRef | None = None
    """An authentic ShadowPod bound to this node that the scheduler created for this unheld GPU,
    not yet admitted by the kubelet (:func:`pending_shadows`)."""
    conflict: str | None = None
    """Why the kind rule refuses the twin (:func:`spotgpu.agent.steer.kind_conflict`), if it does."""

    @property
    def source(self) -> ContainerRef | None:
        """The container Allocate names as the sync source: the holder, else the announced ShadowPod."""
        if isinstance(self.owner, ContainerRef):
            return self.owner
        return self.pending if self.owner is IDLE_SPACE else None


def allocate_refusal(twin: str, view: TwinView | None) -> str | None:
    """Why Allocate refuses ``twin`` now; None when it succeeds.

    The one rule behind both answers the device plugin gives: ``Allocate`` and each twin's health
    on ``ListAndWatch`` (Healthy exactly when this returns None, :func:`spotgpu.agent.steer.pool_health`),
    so a kubelet that does not follow ``GetPreferredAllocation`` (multi-device requests, the
    topology manager) never picks a twin that Allocate then refuses. A twin must be one we serve,
    its GPU lendable, a container to sync from (the owner, a ShadowPod, or a ShadowPod announced
    for an unheld GPU), and the other kind of spot use must not hold its GPU."""
    if view is None:
        return f"device {twin!r} is not a twin this plugin serves"
    if view.health is not Health.HEALTHY:
        return f"twin {twin!r} is {view.health.value}: its GPU's owner is using it"
    if view.source is None:
        return (
            f"twin {twin!r}: real device {view.real!r} is not held by any container (no ShadowPod yet); "
            "nothing to sync it from"
        )
    return view.conflict


def allocate_annotations(
    twin_ids: Sequence[str], lookup: Callable[[str], TwinView | None], *, gpu_resource: ResourceName
) -> dict[str, str]:
    """The annotations of one ContainerAllocateResponse for ``twin_ids``: every twin must pass
    :func:`allocate_refusal`; each GPU is synced from :attr:`TwinView.source` (an unallocated GPU
    has no source until a ShadowPod holds it or is announced for it). Raises
    :class:`AllocateRefused` naming the twin."""
    if not twin_ids:
        raise AllocateRefused("Allocate request names no device")
    by_owner: dict[ContainerRef, list[DeviceID]] = {}
    for twin in twin_ids:
        view = lookup(twin)
        refusal = allocate_refusal(twin, view)
        if refusal is not None:
            raise AllocateRefused(refusal)
        assert view is not None and view.source is not None
        reals = by_owner.setdefault(view.source, [])
        if view.real not in reals:  # two replicas of one GPU sync it once
            reals.append(view.real)
    sources = [
        SyncSource(SyncKind.CONTAINER, owner, ((gpu_resource, tuple(devs)),)) for owner, devs in by_owner.items()
    ]
    return {devices_from_key(): format_devices_from(DevicesFrom.of(sources))}


@dataclass(frozen=True, slots=True)
class Sources:
    """Whom Allocate would name as the source of each GPU: its holder (``owners``; IDLE_SPACE for
    an unheld GPU) and, for unheld GPUs, the authentic ShadowPod announced for it (``pending``)."""

    owners: Mapping[DeviceID, Owner]
    pending: Mapping[DeviceID, ContainerRef]


def pending_shadows(
    pods: Iterable[PodInfo],
    snapshot: MappingSnapshot,
    *,
    node: str,
    shadow_namespace: str,
) -> dict[DeviceID, ContainerRef]:
    """Unheld GPUs of this node an authentic ShadowPod was created for and will hold once the kubelet
    admits it: ``{real: its container}``. Only ShadowPods bound to ``node``, not being deleted, not
    finished, that hold nothing yet; only GPUs that no container holds (IDLE_SPACE)."""
    index = device_index(snapshot)
    holders = {e.owner for e in snapshot.owners}
    out: dict[DeviceID, ContainerRef] = {}
    for pod in pods:
        if pod.node != node or pod.deleting or pod.phase in ("Succeeded", "Failed") or not pod.containers:
            continue
        if not shadow_check(pod, shadow_namespace).authentic:
            continue
        container = ContainerRef(pod.ref.namespace, pod.ref.name, pod.containers[0].name)
        if container in holders:
            continue
        assigned = parse_assigned_devices(pod.annotations.get(keys.ASSIGNED_DEVICES) or "{}", strict=False)
        for device in (DeviceID(d) for ids in assigned.values() for d in ids):
            if index.get(device, (None, ()))[0] is IDLE_SPACE:
                out.setdefault(device, container)
    return out


def node_state_annotation(
    devices: Sequence[GpuDevice],
    snapshot: MappingSnapshot,
    lend_states: Mapping[ContainerRef, LendState],
    health: Mapping[DeviceID, Health],
    shadow_owners: frozenset[ContainerRef] = frozenset(),
    *,
    replicas: int = 0,
) -> str:
    """JSON for :data:`~spotgpu.core.keys.NODE_SPOT_GPU_STATE`: per real device, its owner,
    the owner's state, the twin's health (whether the GPU is lendable) and the number of spot
    users (sorted keys); when it has spot users, ``pods``: who they are (``ns/name``, as
    pod-resources reports them: the truth, also when the kubelet chose another GPU than the
    scheduler); when the node serves shared replicas, ``replicas``: how many per GPU."""
    index = device_index(snapshot)
    out: dict[str, dict[str, object]] = {}
    for device in devices:
        owner, users = index.get(device.id, (IDLE_SPACE, ()))
        if owner is IDLE_SPACE:
            state = OwnerState.UNALLOCATED
        elif isinstance(owner, ContainerRef) and owner in shadow_owners:
            state = OwnerState.IDLE
        else:
            assert isinstance(owner, ContainerRef)
            state = lend_states.get(owner, LendState.ACTIVE).owner_state
        entry: dict[str, object] = {
            "owner": owner.format(),
            "state": state.value,
            "health": health.get(device.id, Health.UNHEALTHY).value,
            "users": len(users),
        }
        if users:
            entry["pods"] = [u.format() for u in users]
        if replicas:
            entry["replicas"] = replicas
        out[device.id] = entry
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def twin_ids(
    devices: Sequence[GpuDevice], replicas: int = 1, *, suffixed: bool | None = None
) -> dict[DeviceID, DeviceID]:
    """``{twin: real}`` for every device whose twin IDs fit the kubelet's limit.

    ``replicas`` 1: one twin ``spot-X`` per GPU. More: ``spot-X::0`` .. ``spot-X::<replicas-1>``
    (shared spot: the kubelet hands each replica to one container, so that many containers can
    share the GPU; the runtime's twin rule accepts either form). ``suffixed`` forces the replica
    form even for one replica (default: only for more than one). Every name served parses back
    to its device with :func:`~spotgpu.core.ids.real_of_twin` (a GPU whose replica names are
    ambiguous serves none of them).
    """
    result: dict[DeviceID, DeviceID] = {}
    with_suffix = replicas > 1 if suffixed is None else suffixed
    known = {d.id for d in devices}
    for device in devices:
        try:
            twin = to_spot_id(device.id)
            names = [replica_id(device.id, k, known) for k in range(replicas)] if with_suffix else [twin]
        except DeviceIDError:
            continue  # too long, or a replica name another device's twin already is: never served
        for name in names:
            result[name] = device.id
    return result


__all__ = [
    "AllocateRefused",
    "EvictionPlan",
    "MappingBuild",
    "TwinView",
    "Victim",
    "Violation",
    "allocate_annotations",
    "allocate_refusal",
    "build_mapping",
    "device_index",
    "find_violations",
    "node_state_annotation",
    "owners_of",
    "pending_shadows",
    "plan_eviction",
    "shadow_check",
    "runtime_container_ids",
    "twin_health",
    "twin_ids",
    "release_scope",
    "victim_container_ids",
    "WatchScope",
    "watch_scopes",
]
