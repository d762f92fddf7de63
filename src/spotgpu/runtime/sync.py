"""Device sync: which real devices a spot container gets, and whether the kubelet granted them.

Pure decision code; the only inputs are the parsed ``container-devices-from`` request, the
target container, the kubelet's device view and the agent's owner record, all passed in
(through a :class:`~spotgpu.ports.lookup.NodeLookup`); the result is a :class:`SyncPlan`
or a :class:`SyncRefused` naming the reason. No I/O happens here beyond those lookups.

Resolution: each source of the request is resolved by its provider
(:mod:`spotgpu.runtime.providers`: ContainerSync, PodSync, Direct) into concrete devices;
the results are merged (a device named by two different sources is refused).

Authorization (the security rule; every check must pass, else the container is not created):

1. The target is a Kubernetes container whose namespace, pod and container name the CRI
   annotations give (containers outside Kubernetes cannot prove a grant).
2. A source outside the target's namespace must be in ``cross_namespace_sources`` (``"*"``:
   any namespace; the default, since rules 4 and 5 already bind every synced device to a grant
   the kubelet made and to the owner the agent lent it for; a list narrows which namespaces'
   owners may lend across namespaces).
3. The source must hold the named devices now (pod-resources); an empty list means "all it
   holds of that resource", and holding none of it is refused.
4. Twin rule: for every synced real device ``X`` the kubelet allocated ``spot-X`` (or a shared
   replica ``spot-X::<n>``) of the spot resource, or a replica of the shared spot resource
   (``platform/spot-gpu-shared``, :func:`~spotgpu.core.ids.shared_resource_of`), to *this*
   container. Twin IDs are read with :func:`~spotgpu.core.ids.real_of_twin` against the real
   devices the agent records, exactly as the agent reads them, so ``spot-X::0`` never grants a
   real ``X::1`` (nor a real ``X`` when ``X::0`` is itself a real device).
5. Owner rule: the agent's record names the source container as ``X``'s owner (for PodSync,
   the pod's container that holds ``X``). Direct names no source, so it is accepted only for
   devices the agent records as unallocated (IDLE_SPACE): there is no owner to disturb.
6. The spot resources themselves are never synced, and only ``gpu_resources`` are.
7. Lend rule: ``X`` is lendable *now* (its twin is Healthy: the owner is lent out, or ``X`` is
   unallocated or held by a ShadowPod). A grant the kubelet made while the owner was away does
   not outlive the loan: once the owner is back, a spot container the kubelet (re)starts with
   that old grant, e.g. a restart after the eviction killed it, is refused. Fails closed: when
   the agent cannot say (a device it does not serve, or no agent to ask: the ``local``
   fallback), the sync is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from enum import StrEnum

from spotgpu.core.codec import DevicesFrom, SyncKind, SyncSource
from spotgpu.core.errors import PermanentError
from spotgpu.core.ids import SPOT_PREFIX, DeviceID, ResourceName, real_of_twin, shared_resource_of
from spotgpu.core.mapping_cache import IDLE_SPACE, Owner
from spotgpu.core.refs import ContainerRef
from spotgpu.ports.lookup import NodeLookup, PodAssignment

ANY_NAMESPACE = "*"
"""In ``cross_namespace_sources``: sources may live in any namespace."""


class RefusalReason(StrEnum):
    """Why a sync was refused (also the label of the agent's refusal metric)."""

    UNKNOWN_CONTAINER = "unknown-container"
    CROSS_NAMESPACE = "cross-namespace"
    RESOURCE_NOT_SYNCABLE = "resource-not-syncable"
    SOURCE_NOT_FOUND = "source-not-found"
    SOURCE_LACKS_DEVICE = "source-lacks-device"
    CONFLICT = "conflict"
    TWIN_NOT_ALLOCATED = "twin-not-allocated"
    OWNER_MISMATCH = "owner-mismatch"
    NOT_LENT = "not-lent"


class SyncRefused(PermanentError):
    """The sync is not granted; creating the container must fail with this message."""

    def __init__(self, reason: RefusalReason, message: str) -> None:
        super().__init__(f"device sync refused ({reason.value}): {message}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SyncPolicy:
    spot_resource: ResourceName
    gpu_resources: frozenset[ResourceName]
    cross_namespace_sources: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ResolvedDevice:
    """One real device to sync, where it comes from and its NUMA nodes (when known)."""

    resource: ResourceName
    device: DeviceID
    source: ContainerRef | None
    """The container holding it; None for Direct."""
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """The granted devices, in request order (which decides e.g. CUDA's device order)."""

    devices: tuple[ResolvedDevice, ...]

    def by_resource(self) -> tuple[tuple[ResourceName, tuple[DeviceID, ...]], ...]:
        """``(resource, ids)`` sorted by resource; IDs keep their order."""
        out: dict[ResourceName, list[DeviceID]] = {}
        for d in self.devices:
            out.setdefault(d.resource, []).append(d.device)
        return tuple((r, tuple(ids)) for r, ids in sorted(out.items()))


PodView = Callable[[str, str], PodAssignment | None]
"""``(namespace, pod) -> the pod's device assignments`` (None: the kubelet has no such active pod)."""


class Provider:
    """Resolves one kind of source into devices. Subclasses: one module each in :mod:`providers`."""

    kind: SyncKind

    def resolve(self, source: SyncSource, pods: PodView) -> list[ResolvedDevice]:
        raise NotImplementedError


def pick(
    source: SyncSource,
    resource: ResourceName,
    wanted: Sequence[DeviceID],
    held: Sequence[tuple[DeviceID, ContainerRef, tuple[int, ...]]],
) -> list[ResolvedDevice]:
    """The ``wanted`` devices (all ``held`` when empty) among those a source ``held``, or refuse."""
    by_id = {device: (ref, numa) for device, ref, numa in held}
    if not wanted:
        if not held:
            raise SyncRefused(
                RefusalReason.SOURCE_LACKS_DEVICE, f"source {source.key!r} holds no devices of {resource!r}"
            )
        return [ResolvedDevice(resource, device, ref, numa) for device, ref, numa in held]
    missing = [d for d in wanted if d not in by_id]
    if missing:
        raise SyncRefused(
            RefusalReason.SOURCE_LACKS_DEVICE,
            f"source {source.key!r} does not hold {resource!r} device(s) {', '.join(missing)} "
            f"(it holds: {', '.join(by_id) or 'none'})",
        )
    return [ResolvedDevice(resource, d, by_id[d][0], by_id[d][1]) for d in wanted]


class _KnownDevices:
    """What twin IDs are parsed against: the real devices the agent records (an owner or
    IDLE_SPACE) and those a source holds per pod-resources (``also``); an unknown one is then
    refused by the owner rule, with that reason."""

    def __init__(self, owner_of: Callable[[DeviceID], Owner | None], also: Container[str]) -> None:
        self._owner_of = owner_of
        self._also = also

    def __contains__(self, device: object) -> bool:
        return isinstance(device, str) and (device in self._also or self._owner_of(DeviceID(device)) is not None)


def granted_twins(target: PodAssignment | None, container: str, spot_resource: str) -> tuple[str, ...]:
    """The twin IDs the kubelet allocated to ``container``: of ``spot_resource`` and replicas of
    its shared resource, as the kubelet reports them (parsed with :func:`real_of_twin` only)."""
    if target is None:
        return ()
    assignment = target.container(container)
    if assignment is None:
        return ()
    return (*assignment.ids(spot_resource), *assignment.ids(shared_resource_of(spot_resource)))


def granted_reals(twins: Sequence[str], known: Container[str]) -> set[DeviceID]:
    """The real devices ``twins`` stand for among ``known`` (the one twin parser, core.ids)."""
    return {real for t in twins if (real := real_of_twin(t, known)) is not None}


def resolve(
    request: DevicesFrom,
    target: ContainerRef,
    pods: PodView,
    policy: SyncPolicy,
    providers: dict[SyncKind, Provider],
) -> list[ResolvedDevice]:
    """Resolve every source (rules 2, 3 and 6 of the module docstring); merge; refuse conflicts."""
    assert target.namespace is not None
    merged: dict[tuple[str, str], ResolvedDevice] = {}
    for source in request.resolve(target.namespace).sources:
        for resource, _ in source.resources:
            spot = (policy.spot_resource, shared_resource_of(policy.spot_resource))
            if resource in spot or resource not in policy.gpu_resources:
                raise SyncRefused(
                    RefusalReason.RESOURCE_NOT_SYNCABLE,
                    f"source {source.key!r} names resource {resource!r}; only "
                    f"{', '.join(sorted(policy.gpu_resources))} can be synced",
                )
        if source.ref is not None:
            namespace = source.ref.namespace
            allowed = policy.cross_namespace_sources
            if namespace != target.namespace and namespace not in allowed and ANY_NAMESPACE not in allowed:
                raise SyncRefused(
                    RefusalReason.CROSS_NAMESPACE,
                    f"source {source.key!r} is outside namespace {target.namespace!r}, and {namespace!r} is not "
                    "an allowed source namespace (runtime.crossNamespaceSources)",
                )
        for device in providers[source.kind].resolve(source, pods):
            key = (device.resource, device.device)
            seen = merged.get(key)
            if seen is not None and seen.source != device.source:
                raise SyncRefused(
                    RefusalReason.CONFLICT,
                    f"{device.resource!r} device {device.device!r} is named by two sources "
                    f"({seen.source or 'direct'} and {device.source or 'direct'})",
                )
            merged.setdefault(key, device)
    return list(merged.values())


def authorize(
    devices: Sequence[ResolvedDevice],
    target: ContainerRef,
    target_pod: PodAssignment | None,
    owner_of: Callable[[DeviceID], Owner | None],
    policy: SyncPolicy,
    *,
    lendable: Callable[[DeviceID], bool | None] | None = None,
) -> SyncPlan:
    """Apply the twin, owner and lend rules (4, 5 and 7) to resolved devices."""
    twins = granted_twins(target_pod, target.name, policy.spot_resource)
    reals = granted_reals(twins, _KnownDevices(owner_of, {d.device for d in devices}))
    for d in devices:
        if d.device not in reals:
            raise SyncRefused(
                RefusalReason.TWIN_NOT_ALLOCATED,
                f"the kubelet did not allocate {SPOT_PREFIX}{d.device} ({policy.spot_resource}) to {target}; "
                f"its twins: {', '.join(sorted(twins)) or 'none'}"
                + (f" (standing for {', '.join(sorted(reals))})" if reals else ""),
            )
        owner = owner_of(d.device)
        if d.source is None:
            if owner is not IDLE_SPACE:
                raise SyncRefused(
                    RefusalReason.OWNER_MISMATCH,
                    f"direct sync of {d.device!r} needs a device no container holds, but its recorded owner is "
                    f"{owner if owner is not None else 'unknown'}",
                )
        elif owner != d.source:
            raise SyncRefused(
                RefusalReason.OWNER_MISMATCH,
                f"{d.device!r} comes from {d.source}, but the agent records "
                f"{owner if owner is not None else 'no owner'} as its owner",
            )
        require_lent(d.device, owner, lendable)
    return SyncPlan(tuple(devices))


def require_lent(device: DeviceID, owner: Owner | None, lendable: Callable[[DeviceID], bool | None] | None) -> None:
    """The lend rule (7): ``device`` is lendable now, else :class:`SyncRefused` (``NOT_LENT``).
    Asked at every sync, and again by NRI mode at StartContainer (:mod:`spotgpu.nri.host`)."""
    lent = lendable(device) if lendable is not None else None
    if lent is not True:  # fails closed: "cannot say" (None) refuses like "no" (False)
        raise SyncRefused(
            RefusalReason.NOT_LENT,
            f"{device!r} is not lent out now: its owner {owner if owner is not None else 'unknown'} "
            "is using it or it is being taken back"
            if lent is False
            else f"{device!r}: the agent cannot say whether it is lent out now (a device it does not "
            "serve, or no agent to ask); refused",
        )


def plan_sync(
    request: DevicesFrom,
    target: ContainerRef,
    lookup: NodeLookup,
    policy: SyncPolicy,
    providers: dict[SyncKind, Provider],
) -> SyncPlan:
    """Resolve and authorize ``request`` for ``target``: the whole decision, or :class:`SyncRefused`."""
    assert target.namespace is not None

    def pods(namespace: str, name: str) -> PodAssignment | None:
        return lookup.pod(namespace, name)

    devices = resolve(request, target, pods, policy, providers)
    return authorize(
        devices,
        target,
        pods(target.namespace, target.pod),
        lookup.device_owner,
        policy,
        lendable=lookup.device_lendable,
    )


__all__ = [
    "PodView",
    "Provider",
    "RefusalReason",
    "ResolvedDevice",
    "SyncPlan",
    "SyncPolicy",
    "SyncRefused",
    "authorize",
    "granted_reals",
    "granted_twins",
    "pick",
    "require_lent",
    "plan_sync",
    "resolve",
]
