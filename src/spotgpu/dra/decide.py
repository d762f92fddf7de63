"""Whether a claim may be prepared: the claim checks, then the runtime's own authorization.

Pure; no I/O. :func:`decide_prepare` takes the claim as the API returned it (or None), the
kubelet's (namespace, name, UID) and what the node knows (:class:`NodeView`), and returns a
:class:`PrepareGrant` or raises :class:`PrepareRefused` with the reason. Every check must pass
(fails closed):

1. The claim exists, parses (:func:`~spotgpu.dra.claim.parse_claim`), and is the one the kubelet
   named (same namespace, name and UID: a deleted and re-created claim is refused).
2. It is allocated, reserved for at least one pod, and has at least one result of our driver;
   none of them asks for ``adminAccess`` (which would reach a device other claims use).
3. Each of our results names this node's pool and a device of our publication (an allocation
   naming a device we never published, or another node's, is refused).
4. The runtime's :func:`spotgpu.runtime.sync.authorize` (one home for the twin, owner and lend
   rules, the same call the runtime wrapper and NRI mode make): the claim's devices are the grant
   (the twins its allocation names, read with the one twin parser), the source of each real GPU
   is the owner the agent records for it (a device no container holds: none, which the owner rule
   accepts only for unallocated GPUs; an unknown owner is refused), and the GPU must be lent right
   now (``lendable`` says True; unknown refuses).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from spotgpu.core.errors import PermanentError
from spotgpu.core.ids import DeviceID, NodeName, ResourceName
from spotgpu.core.mapping_cache import Owner
from spotgpu.core.refs import ContainerRef, RefError
from spotgpu.dra.claim import Claim, ClaimError, ClaimKey, DriverName, parse_claim
from spotgpu.dra.slices import Publication
from spotgpu.ports.lookup import ContainerAssignment, DeviceGroup, PodAssignment
from spotgpu.runtime.sync import RefusalReason, ResolvedDevice, SyncPolicy, SyncRefused, authorize

CLAIM_CONSUMER = "claim"
"""The container name the claim's grant is filed under for :func:`authorize` (a claim is
granted as a whole; the kubelet hands its CDI devices to the containers that reference it)."""


class ClaimRefusal(StrEnum):
    NOT_FOUND = "claim-not-found"
    MALFORMED = "claim-malformed"
    REPLACED = "claim-replaced"
    NOT_ALLOCATED = "not-allocated"
    NOT_RESERVED = "not-reserved"
    NO_DEVICES = "no-devices"
    ADMIN_ACCESS = "admin-access"
    OTHER_POOL = "other-pool"
    UNKNOWN_DEVICE = "unknown-device"


class PrepareRefused(PermanentError):
    """The claim is not prepared; the kubelet gets this message as the claim's error."""

    def __init__(self, reason: ClaimRefusal | RefusalReason, message: str) -> None:
        super().__init__(f"claim refused ({reason.value}): {message}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the decision asks of the node (the agent's view; :class:`~spotgpu.ports.lookup.NodeLookup`'s
    ``device_owner`` and ``device_lendable``)."""

    driver: DriverName
    node: NodeName
    publication: Publication
    owner_of: Callable[[DeviceID], Owner | None]
    lendable: Callable[[DeviceID], bool | None]
    policy: SyncPolicy
    gpu_resource: ResourceName
    """The real GPUs' resource (what the vendor's device plugin serves)."""


@dataclass(frozen=True, slots=True)
class GrantedDevice:
    request: str
    pool: str
    device: str
    twin: DeviceID
    real: DeviceID
    source: ContainerRef | None
    """The owner container the GPU is lent from; None for an unallocated GPU."""


@dataclass(frozen=True, slots=True)
class PrepareGrant:
    key: ClaimKey
    devices: tuple[GrantedDevice, ...]


def _check_claim(key: ClaimKey, obj: Mapping[str, Any] | None, view: NodeView) -> Claim:
    if obj is None:
        raise PrepareRefused(ClaimRefusal.NOT_FOUND, f"ResourceClaim {key.namespace}/{key.name} does not exist")
    try:
        claim = parse_claim(obj, view.driver)
    except ClaimError as exc:
        raise PrepareRefused(ClaimRefusal.MALFORMED, f"{key.namespace}/{key.name}: {exc}") from None
    if claim.key != key:
        raise PrepareRefused(
            ClaimRefusal.REPLACED,
            f"the kubelet asked for {key.namespace}/{key.name} UID {key.uid}, the API has "
            f"{claim.key.namespace}/{claim.key.name} UID {claim.key.uid} (claim got replaced)",
        )
    if not claim.allocated:
        raise PrepareRefused(ClaimRefusal.NOT_ALLOCATED, f"{key.namespace}/{key.name} is not allocated")
    if not claim.reserved_pods:
        raise PrepareRefused(ClaimRefusal.NOT_RESERVED, f"{key.namespace}/{key.name} is reserved for no pod")
    if not claim.devices:
        raise PrepareRefused(
            ClaimRefusal.NO_DEVICES,
            f"{key.namespace}/{key.name} has no device of driver {view.driver} "
            f"({claim.other_drivers} of other drivers)",
        )
    return claim


def decide_prepare(key: ClaimKey, obj: Mapping[str, Any] | None, view: NodeView) -> PrepareGrant:
    """The whole Prepare decision for one claim, or :class:`PrepareRefused`."""
    claim = _check_claim(key, obj, view)
    granted: list[tuple[str, str, str, DeviceID, DeviceID]] = []
    for d in claim.devices:
        if d.admin_access:
            raise PrepareRefused(ClaimRefusal.ADMIN_ACCESS, f"device {d.device} is allocated with adminAccess")
        if d.pool != view.node:
            raise PrepareRefused(
                ClaimRefusal.OTHER_POOL, f"device {d.device} is in pool {d.pool!r}, not this node's ({view.node})"
            )
        twin = view.publication.twin_of(d.device)
        if twin is None:
            raise PrepareRefused(
                ClaimRefusal.UNKNOWN_DEVICE, f"device {d.device} is not one this node publishes in pool {view.node}"
            )
        granted.append((d.request, d.pool, d.device, twin.twin, twin.real))
    resolved: dict[DeviceID, ResolvedDevice] = {}
    for *_, real in granted:
        owner = view.owner_of(real)
        source = owner if isinstance(owner, ContainerRef) else None
        resolved.setdefault(real, ResolvedDevice(view.gpu_resource, real, source))
    try:
        target = ContainerRef(key.namespace, key.name, CLAIM_CONSUMER)
    except RefError as exc:  # parse_claim checked both names already
        raise PrepareRefused(ClaimRefusal.MALFORMED, str(exc)) from None
    grant = PodAssignment(
        key.namespace,
        key.name,
        (ContainerAssignment(CLAIM_CONSUMER, (DeviceGroup(view.policy.spot_resource, tuple(g[3] for g in granted)),)),),
    )
    try:
        authorize(tuple(resolved.values()), target, grant, view.owner_of, view.policy, lendable=view.lendable)
    except SyncRefused as exc:
        raise PrepareRefused(exc.reason, str(exc)) from None
    return PrepareGrant(
        key, tuple(GrantedDevice(r, p, dev, t, real, resolved[real].source) for r, p, dev, t, real in granted)
    )


__all__ = [
    "CLAIM_CONSUMER",
    "ClaimRefusal",
    "GrantedDevice",
    "NodeView",
    "PrepareGrant",
    "PrepareRefused",
    "decide_prepare",
]
