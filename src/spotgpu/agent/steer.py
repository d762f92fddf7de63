"""Steering the kubelet's twin choice to the scheduler's GPU, and keeping exclusive and shared
spot use of one GPU apart.

Pure functions over plain data; no I/O, no clock reads, no locks. The solver
(:mod:`spotgpu.agent.solver`) calls them from the device plugin's ``GetPreferredAllocation`` and
``Allocate`` and on every refresh, and applies what they return (the answer, the twin list, the
metrics). One of the agent's pure modules (``model``, ``steer``, ``detect``, ``settings``,
``ports``): an import-linter contract keeps adapters, gRPC, protobuf, Prometheus and NVML out of
it and of everything it imports.

The gap they close: the kubelet gives each device ID to one container and chooses *which* IDs
itself, while the scheduler already chose the real GPU (and accounted its share) and wrote it on
the pod (``spotgpu.io/assigned-devices``). ``GetPreferredAllocation`` carries no pod, so the pod
being admitted is inferred: the kubelet admits one pod at a time, and the candidates are the pods
bound to this node that request the resource, have not started, and hold no twin yet, in binding
order (the order the agent's pod watch first saw them).

Decisions made here:

* :func:`twin_pools`: the resources the agent serves. ``platform/spot-gpu`` carries one
  *exclusive* twin ``spot-X`` per GPU; with ``sharedReplicas: N`` the second resource
  ``platform/spot-gpu-shared`` carries *shared* replicas ``spot-X::0`` .. ``::N-1``. (Legacy
  ``twinReplicas: N``: the spot resource itself carries N shared replicas and nothing is
  exclusive.)
* :func:`device_use` and :func:`pool_health`: the kind rule. While any replica of GPU X is in
  use, X's exclusive twin is Unhealthy; while X's exclusive twin is in use, its replicas are
  Unhealthy. Otherwise a twin is Healthy exactly when Allocate would give it
  (:func:`spotgpu.agent.model.allocate_refusal`: its GPU lendable and held by a container).
  "In use" = allocated according to pod-resources or granted by an ``Allocate`` the kubelet
  has not reported yet.
* :func:`admission_candidates`: the pods the kubelet may be admitting now.
* :func:`prefer`: the ``GetPreferredAllocation`` answer: twins of the GPUs the scheduler
  assigned to the first candidate that fits; otherwise a deterministic choice (documented on
  :func:`prefer`) that never mixes the two kinds on a GPU.
* :func:`check_kinds`: ``Allocate`` refuses a twin whose GPU is in use by the other kind.
* :func:`match_allocation`: which candidate an ``Allocate`` served and whether it got the GPUs
  the scheduler assigned (else: a mismatch, logged and counted; the answer names the truth).
* :func:`steering_mismatches`: pods whose twins, as pod-resources reports them, are not on the
  GPUs the scheduler assigned.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from spotgpu.agent.model import AllocateRefused, TwinView, allocate_refusal, twin_ids
from spotgpu.core import keys
from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.codec import AssignmentError, parse_assigned_devices
from spotgpu.core.ids import DeviceID, NodeName, ResourceName, is_spot_id, real_of_twin, shared_resource_of
from spotgpu.core.mapping_cache import Owner
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import Health
from spotgpu.ports.kube import PodInfo
from spotgpu.ports.node import GpuDevice


class TwinKind(StrEnum):
    """How the containers holding a pool's twins use the GPU behind them."""

    EXCLUSIVE = "exclusive"
    """One spot container per GPU (``spot-X``)."""
    SHARED = "shared"
    """Up to ``replicas`` spot containers per GPU (``spot-X::<n>``)."""


@dataclass(frozen=True, slots=True)
class TwinPool:
    """One resource the agent's device plugins serve, and how its IDs map to real GPUs."""

    resource: ResourceName
    kind: TwinKind
    replicas: int = 1
    """IDs per GPU."""
    suffixed: bool = False
    """IDs are ``spot-X::<n>`` (replicas) rather than ``spot-X``."""

    def twins(self, devices: Sequence[GpuDevice]) -> dict[DeviceID, DeviceID]:
        """``{twin: real}`` for every device whose IDs fit the kubelet's 63 characters."""
        return twin_ids(devices, self.replicas, suffixed=self.suffixed)


def twin_pools(
    spot_resource: ResourceName, *, twin_replicas: int = 1, shared_replicas: int = 0
) -> tuple[TwinPool, ...]:
    """The pools for a configuration; the first one is ``spot_resource``'s."""
    if twin_replicas > 1:  # legacy: every spot container shares; no exclusive twins
        return (TwinPool(spot_resource, TwinKind.SHARED, twin_replicas, suffixed=True),)
    pools = [TwinPool(spot_resource, TwinKind.EXCLUSIVE)]
    if shared_replicas > 0:
        pools.append(TwinPool(shared_resource_of(spot_resource), TwinKind.SHARED, shared_replicas, suffixed=True))
    return tuple(pools)


# --- the kind rule --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """Twins of one real GPU in use, by kind."""

    exclusive: frozenset[DeviceID] = frozenset()
    shared: frozenset[DeviceID] = frozenset()

    def of(self, kind: TwinKind) -> frozenset[DeviceID]:
        return self.exclusive if kind is TwinKind.EXCLUSIVE else self.shared

    def blocks(self, kind: TwinKind) -> bool:
        """The other kind uses the GPU: ``kind`` may not."""
        return bool(self.shared if kind is TwinKind.EXCLUSIVE else self.exclusive)


NO_USE = DeviceUse()

PoolTwins = Mapping[ResourceName, Mapping[DeviceID, DeviceID]]
"""``{resource: {twin: real}}``: the served IDs of every pool."""


def device_use(
    in_use: Iterable[tuple[ResourceName, DeviceID]], twins: PoolTwins, kinds: Mapping[ResourceName, TwinKind]
) -> dict[DeviceID, DeviceUse]:
    """Per real GPU, its twins in use (``(resource, twin)`` pairs; unknown ones are ignored)."""
    grouped: dict[DeviceID, tuple[set[DeviceID], set[DeviceID]]] = {}
    for resource, twin in in_use:
        real = twins.get(resource, {}).get(twin)
        if real is None:
            continue
        exclusive, shared = grouped.setdefault(real, (set(), set()))
        (exclusive if kinds[resource] is TwinKind.EXCLUSIVE else shared).add(twin)
    return {real: DeviceUse(frozenset(e), frozenset(s)) for real, (e, s) in grouped.items()}


def in_use_of(allocations: Iterable[AllocatedDevices], twins: PoolTwins) -> set[tuple[ResourceName, DeviceID]]:
    """The served twins pod-resources reports allocated."""
    return {(a.resource, t) for a in allocations if a.resource in twins for t in a.device_ids if t in twins[a.resource]}


def pool_health(
    twins: PoolTwins,
    kinds: Mapping[ResourceName, TwinKind],
    lendable: Mapping[DeviceID, Health],
    use: Mapping[DeviceID, DeviceUse],
    *,
    owners: Mapping[DeviceID, Owner],
    pending: Mapping[DeviceID, ContainerRef] | None = None,
) -> dict[ResourceName, dict[DeviceID, Health]]:
    """Each twin's health as ListAndWatch shows it: Healthy exactly when ``Allocate`` would give it
    now (:func:`~spotgpu.agent.model.allocate_refusal` on :func:`twin_view`): its GPU is lendable,
    held by a container (``owners``; or announced for a ShadowPod, ``pending``) and not in use by
    the other kind. A GPU missing from ``owners`` is Unhealthy (fail closed)."""
    out: dict[ResourceName, dict[DeviceID, Health]] = {}
    for resource, table in twins.items():
        kind = kinds[resource]
        out[resource] = {
            twin: Health.HEALTHY
            if allocate_refusal(twin, twin_view(twin, real, kind, lendable, use, owners=owners, pending=pending))
            is None
            else Health.UNHEALTHY
            for twin, real in table.items()
        }
    return out


def twin_view(
    twin: str,
    real: DeviceID,
    kind: TwinKind,
    lendable: Mapping[DeviceID, Health],
    use: Mapping[DeviceID, DeviceUse],
    *,
    owners: Mapping[DeviceID, Owner],
    pending: Mapping[DeviceID, ContainerRef] | None = None,
) -> TwinView:
    """What Allocate (and the twin's health) is decided on, for one served twin of GPU ``real``."""
    return TwinView(
        real,
        lendable.get(real, Health.UNHEALTHY),
        owners.get(real),
        (pending or {}).get(real),
        kind_conflict(twin, kind, real, use),
    )


def kind_conflict(twin: str, kind: TwinKind, real: DeviceID, use: Mapping[DeviceID, DeviceUse]) -> str | None:
    """Why the kind rule refuses ``twin`` (its GPU is in use by the other kind), or None."""
    current = use.get(real, NO_USE)
    if not current.blocks(kind):
        return None
    other = TwinKind.SHARED if kind is TwinKind.EXCLUSIVE else TwinKind.EXCLUSIVE
    users = ", ".join(sorted(current.of(other)))
    return (
        f"twin {twin!r} ({kind.value}): GPU {real!r} is in {other.value} spot use ({users}); "
        "a GPU is lent to one kind at a time"
    )


def check_kinds(
    requested: Sequence[str],
    resource: ResourceName,
    kind: TwinKind,
    twins: PoolTwins,
    use: Mapping[DeviceID, DeviceUse],
) -> None:
    """Refuse (:class:`AllocateRefused`) twins whose GPU the other kind uses (:func:`kind_conflict`)."""
    table = twins.get(resource, {})
    for twin in requested:
        real = table.get(DeviceID(twin))
        if real is None:
            continue  # unknown twins are refused by allocate_annotations, with its message
        conflict = kind_conflict(twin, kind, real, use)
        if conflict is not None:
            raise AllocateRefused(conflict)


# --- which pod is being admitted ----------------------------------------------------------------


def assigned_gpus(annotations: Mapping[str, str], known: Collection[str]) -> tuple[DeviceID, ...]:
    """The real GPUs of this node the scheduler assigned to a pod, in its order (``()``: none).

    Twin and replica IDs (``spot-X``, ``spot-X::n``) and real IDs are accepted under any
    resource key; IDs of GPUs this node does not have are left out.
    """
    raw = annotations.get(keys.ASSIGNED_DEVICES)
    if not raw:
        return ()
    found: dict[DeviceID, None] = {}
    for ids in parse_assigned_devices(raw).values():
        for item in ids:
            real = real_of_twin(item, known) if is_spot_id(item) else (DeviceID(item) if item in known else None)
            if real is not None:
                found.setdefault(real)
    return tuple(found)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A container the kubelet may be admitting now, with what the scheduler decided for it."""

    pod: PodRef
    container: str
    size: int
    """How many IDs of the resource it requests (the kubelet's ``allocation_size``)."""
    assigned: tuple[DeviceID, ...] = ()
    """The real GPUs the scheduler assigned (empty: no decision known)."""

    @property
    def key(self) -> tuple[PodRef, str]:
        return (self.pod, self.container)


def admission_candidates(
    pods: Iterable[PodInfo],
    resource: ResourceName,
    *,
    node: NodeName,
    admitted: Collection[tuple[PodRef, str]],
    known: Collection[str],
) -> tuple[list[Candidate], list[str]]:
    """Containers requesting ``resource`` that the kubelet may be admitting, in ``pods``' order
    (binding order), and the problems met (unreadable assignments: such a pod stays a
    candidate without an assignment).

    A candidate's pod is bound to ``node``, Pending, not being deleted, has no started
    container, and the container holds no twin yet (``admitted``: per pod-resources, or granted
    by an Allocate already). The scheduler's assignment applies to the pod's first container
    requesting a spot resource (its GPU container).
    """
    out: list[Candidate] = []
    problems: list[str] = []
    for pod in pods:
        if pod.node != node or pod.deleting or pod.phase != "Pending":
            continue
        if any(c.container_id for c in pod.containers):
            continue
        assigned: tuple[DeviceID, ...] | None = None
        for container in pod.containers:
            size = container.requests.get(resource, 0)
            if size <= 0 or (pod.ref, container.name) in admitted:
                continue
            if assigned is None:
                try:
                    assigned = assigned_gpus(pod.annotations, known)
                except AssignmentError as exc:
                    problems.append(f"pod {pod.ref}: {exc}")
                    assigned = ()
                out.append(Candidate(pod.ref, container.name, size, assigned))
            else:
                out.append(Candidate(pod.ref, container.name, size))
    return out, problems


# --- GetPreferredAllocation -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Preference:
    """The answer for one container request, and why."""

    ids: tuple[DeviceID, ...]
    candidate: Candidate | None
    steered: bool
    """Every GPU the candidate was assigned is in the answer."""
    reason: str


def prefer(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    pool: TwinPool,
    twins: Mapping[DeviceID, DeviceID],
    use: Mapping[DeviceID, DeviceUse],
    candidates: Sequence[Candidate],
    numa: Mapping[DeviceID, int | None],
    lendable: Collection[DeviceID] | None = None,
    held: Collection[DeviceID] | None = None,
) -> Preference:
    """``GetPreferredAllocation`` for one container request of ``pool``'s resource.

    The answer holds ``must_include`` (the kubelet requires it), then twins of the GPUs assigned
    to the first candidate (binding order) that asks for ``size`` IDs and whose every assigned
    GPU is offered (one replica per GPU per round, lowest replica first), then, up to ``size``,
    the deterministic choice. Only twins of ``lendable`` GPUs (all when None) that the other
    kind does not use count as offered (the kubelet's list may lag behind ours). The choice
    takes GPUs a container holds (``held``: an owner or a ShadowPod; all when None) before
    those nobody holds (Allocate refuses these until a ShadowPod holds them); then exclusive
    twins on the NUMA node(s) already chosen first, then in GPU order; shared replicas on the
    GPU with the most shared users first (bin-packing, as the scheduler does, keeps whole GPUs
    free for exclusive spot), then in GPU and replica order. It never holds an ID the kubelet
    did not offer, and may hold fewer than ``size`` when too few usable twins are offered (the
    kubelet then fills up itself and ``Allocate`` refuses a conflicting twin).
    """
    order = {twin: i for i, twin in enumerate(twins)}
    offered = [DeviceID(t) for t in dict.fromkeys([*must_include, *available])]
    chosen: list[DeviceID] = list(dict.fromkeys(DeviceID(t) for t in must_include))

    def usable(twin: DeviceID) -> bool:
        real = twins.get(twin)
        if real is None or twin in chosen or (lendable is not None and real not in lendable):
            return False
        return not use.get(real, NO_USE).blocks(pool.kind)

    def fallback_key(twin: DeviceID) -> tuple[int, int, int]:
        real = twins[twin]
        unheld = 0 if held is None or real in held else 1
        if pool.kind is TwinKind.SHARED:  # the busiest GPU first (bin-packing)
            users = len(use.get(real, NO_USE).shared) + sum(1 for t in chosen if twins.get(t) == real)
            return (unheld, -users, order[twin])
        nodes = {numa.get(twins[t]) for t in chosen if t in twins}  # the NUMA node(s) already chosen first
        return (unheld, 0 if not nodes or numa.get(real) in nodes else 1, order[twin])

    def offered_of(real: DeviceID) -> list[DeviceID]:
        return sorted((t for t in offered if twins.get(t) == real and usable(t)), key=order.__getitem__)

    def fits(c: Candidate) -> bool:
        return (
            c.size == size and bool(c.assigned) and all(offered_of(g) or _covers(chosen, g, twins) for g in c.assigned)
        )

    candidate = next((c for c in candidates if fits(c)), None)
    steered = False
    if candidate is not None:
        progress = True
        while len(chosen) < size and progress:
            progress = False
            for gpu in candidate.assigned:
                free = offered_of(gpu)
                if free and len(chosen) < size:
                    chosen.append(free[0])
                    progress = True
        steered = all(_covers(chosen, g, twins) for g in candidate.assigned)
    while len(chosen) < size:
        rest = [t for t in offered if usable(t)]
        if not rest:
            break
        chosen.append(min(rest, key=fallback_key))
    return Preference(tuple(chosen[:size]), candidate, steered, _why(candidate, steered, candidates, size))


def _why(candidate: Candidate | None, steered: bool, candidates: Sequence[Candidate], size: int) -> str:
    """The reason a :class:`Preference` gives for its answer."""
    if candidate is None:
        waiting = [c for c in candidates if c.size == size]
        return (
            f"no pod being admitted asks for {size} with assigned GPUs offered "
            f"({len(waiting)} candidate(s) of that size); deterministic choice"
        )
    if steered:
        return f"steered to {', '.join(candidate.assigned)} assigned to {candidate.pod}/{candidate.container}"
    return f"{candidate.pod}/{candidate.container} asks for more than its assigned GPUs offer; filled up"


def _covers(chosen: Sequence[DeviceID], real: DeviceID, twins: Mapping[DeviceID, DeviceID]) -> bool:
    return any(twins.get(t) == real for t in chosen)


# --- Allocate ---------------------------------------------------------------------------------------


class MatchResult(StrEnum):
    """What an Allocate did relative to the scheduler's decision (the metric's ``result`` label)."""

    ASSIGNED = "assigned"
    """The twins are on exactly the GPUs the scheduler assigned to the pod being admitted."""
    MISMATCH = "mismatch"
    """They are not (the kubelet did not follow the preference); the answer names the truth."""
    UNASSIGNED = "unassigned"
    """No admitted pod with an assignment could be identified."""


@dataclass(frozen=True, slots=True)
class AllocationMatch:
    candidate: Candidate | None
    allocated: tuple[DeviceID, ...]
    """The real GPUs behind the requested twins, in request order."""
    result: MatchResult


def match_allocation(
    requested: Sequence[str],
    twins: Mapping[DeviceID, DeviceID],
    candidates: Sequence[Candidate],
    preferred: Candidate | None,
) -> AllocationMatch:
    """The candidate an Allocate of ``requested`` serves: the one the preceding
    ``GetPreferredAllocation`` chose (the kubelet calls both for the same container, back to
    back), else the first (binding order) of the same size assigned exactly these GPUs, else
    the first of the same size."""
    allocated = tuple(dict.fromkeys(r for t in requested if (r := twins.get(DeviceID(t))) is not None))
    size = len(requested)
    same_size = [c for c in candidates if c.size == size]
    candidate = preferred if preferred is not None and preferred.key in {c.key for c in same_size} else None
    if candidate is None:
        candidate = next((c for c in same_size if c.assigned and set(c.assigned) == set(allocated)), None)
    if candidate is None and same_size:
        candidate = same_size[0]
    if candidate is None or not candidate.assigned:
        return AllocationMatch(candidate, allocated, MatchResult.UNASSIGNED)
    same = set(candidate.assigned) == set(allocated)
    return AllocationMatch(candidate, allocated, MatchResult.ASSIGNED if same else MatchResult.MISMATCH)


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A container whose twins (per pod-resources) are not on the GPUs the scheduler assigned."""

    pod: PodRef
    container: str
    resource: ResourceName
    assigned: tuple[DeviceID, ...]
    allocated: tuple[DeviceID, ...]


def steering_mismatches(
    allocations: Iterable[AllocatedDevices],
    pods: Mapping[PodRef, PodInfo],
    twins: PoolTwins,
    known: Collection[str],
) -> list[Mismatch]:
    """Every spot container holding twins of GPUs other than its pod's assigned ones (pods
    without a readable assignment are left out: nothing to compare with)."""
    out = []
    for alloc in allocations:
        table = twins.get(alloc.resource)
        info = pods.get(alloc.pod)
        if table is None or info is None:
            continue
        try:
            assigned = assigned_gpus(info.annotations, known)
        except AssignmentError:
            continue
        allocated = tuple(dict.fromkeys(r for t in alloc.device_ids if (r := table.get(t)) is not None))
        if assigned and allocated and set(assigned) != set(allocated):
            out.append(Mismatch(alloc.pod, alloc.container, alloc.resource, assigned, allocated))
    return out


__all__ = [
    "NO_USE",
    "AllocationMatch",
    "Candidate",
    "DeviceUse",
    "MatchResult",
    "Mismatch",
    "PoolTwins",
    "Preference",
    "TwinKind",
    "TwinPool",
    "admission_candidates",
    "assigned_gpus",
    "check_kinds",
    "kind_conflict",
    "device_use",
    "in_use_of",
    "match_allocation",
    "pool_health",
    "prefer",
    "steering_mismatches",
    "twin_pools",
    "twin_view",
]
