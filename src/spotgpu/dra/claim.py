"""A ResourceClaim (``resource.k8s.io/v1``) as plain data: only what Prepare decides on.

Pure; no I/O. Everything in a claim is treated as hostile: :func:`parse_claim` checks each field
it keeps (types, lengths, DNS names) and raises :class:`ClaimError` naming the field, never
guessing. Only results of *our* driver are kept; others belong to other drivers on the node
(shared/reference/dra.md section 10, gotcha 5). ``request`` names are cut to the base request
(``req/sub`` -> ``req``), as the kubelet matches them (gotcha 7).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, NewType

from spotgpu.core.errors import ValidationError

ClaimUID = NewType("ClaimUID", str)
DriverName = NewType("DriverName", str)

_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UID: Final = re.compile(r"[A-Za-z0-9][-A-Za-z0-9]{0,127}")
MAX_RESULTS: Final = 32
MAX_RESERVED: Final = 256


class ClaimError(ValidationError):
    """The claim object is malformed; the message names the field."""


@dataclass(frozen=True, slots=True)
class ClaimKey:
    """What the kubelet names in NodePrepareResources: namespace, name and UID."""

    namespace: str
    name: str
    uid: ClaimUID


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One ``status.allocation.devices.results[]`` entry of our driver."""

    request: str
    """The base request name (``req`` of ``req/sub``)."""
    pool: str
    device: str
    admin_access: bool = False


@dataclass(frozen=True, slots=True)
class Consumer:
    """One ``status.reservedFor[]`` entry."""

    api_group: str
    resource: str
    name: str
    uid: str

    @property
    def is_pod(self) -> bool:
        return self.api_group == "" and self.resource == "pods"


@dataclass(frozen=True, slots=True)
class Claim:
    key: ClaimKey
    allocated: bool
    """``status.allocation`` is set."""
    devices: tuple[AllocatedDevice, ...]
    """Our driver's results only, in the allocation's order."""
    other_drivers: int
    """How many results belong to other drivers."""
    reserved_for: tuple[Consumer, ...]

    @property
    def reserved_pods(self) -> tuple[Consumer, ...]:
        return tuple(c for c in self.reserved_for if c.is_pod)


def _obj(parent: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ClaimError(f"{where}.{key} must be an object, got {type(value).__name__}")
    return value


def _list(parent: Mapping[str, Any], key: str, where: str, limit: int) -> list[Any]:
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ClaimError(f"{where}.{key} must be a list, got {type(value).__name__}")
    if len(value) > limit:
        raise ClaimError(f"{where}.{key} has {len(value)} entries; at most {limit}")
    return value


def _text(parent: Mapping[str, Any], key: str, where: str, pattern: re.Pattern[str] | None, limit: int) -> str:
    value = parent.get(key)
    if not isinstance(value, str):
        raise ClaimError(f"{where}.{key} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise ClaimError(f"{where}.{key} is {len(value)} characters; at most {limit}")
    if pattern is not None and pattern.fullmatch(value) is None:
        raise ClaimError(f"{where}.{key} {value!r} is not a valid name")
    return value


def _result(entry: Any, where: str) -> tuple[str, AllocatedDevice]:
    if not isinstance(entry, Mapping):
        raise ClaimError(f"{where} must be an object")
    driver = _text(entry, "driver", where, _SUBDOMAIN, 63)
    request = _text(entry, "request", where, None, 127)
    base = request.split("/", 1)[0]
    if _LABEL.fullmatch(base) is None or len(base) > 63:
        raise ClaimError(f"{where}.request {request!r} does not start with a DNS label")
    pool = _text(entry, "pool", where, None, 253)
    if not pool or any(_SUBDOMAIN.fullmatch(p) is None for p in pool.split("/")):
        raise ClaimError(f"{where}.pool {pool!r} is not a pool name")
    device = _text(entry, "device", where, _LABEL, 63)
    admin = entry.get("adminAccess")
    if admin is not None and not isinstance(admin, bool):
        raise ClaimError(f"{where}.adminAccess must be a boolean")
    return driver, AllocatedDevice(base, pool, device, admin is True)


def _consumer(entry: Any, where: str) -> Consumer:
    if not isinstance(entry, Mapping):
        raise ClaimError(f"{where} must be an object")
    group = entry.get("apiGroup", "")
    if not isinstance(group, str) or len(group) > 253:
        raise ClaimError(f"{where}.apiGroup must be a string")
    return Consumer(
        group,
        _text(entry, "resource", where, None, 253),
        _text(entry, "name", where, _SUBDOMAIN, 253),
        _text(entry, "uid", where, _UID, 128),
    )


def parse_claim(obj: Any, driver: DriverName) -> Claim:
    """The claim ``obj`` (a decoded ``ResourceClaim``) as far as ``driver`` is concerned."""
    if not isinstance(obj, Mapping):
        raise ClaimError("a ResourceClaim must be an object")
    meta = _obj(obj, "metadata", "")
    key = ClaimKey(
        _text(meta, "namespace", "metadata", _LABEL, 63),
        _text(meta, "name", "metadata", _SUBDOMAIN, 253),
        ClaimUID(_text(meta, "uid", "metadata", _UID, 128)),
    )
    status = _obj(obj, "status", "")
    allocation = status.get("allocation")
    if allocation is not None and not isinstance(allocation, Mapping):
        raise ClaimError("status.allocation must be an object")
    ours: list[AllocatedDevice] = []
    others = 0
    if allocation is not None:
        devices = _obj(allocation, "devices", "status.allocation")
        for i, entry in enumerate(_list(devices, "results", "status.allocation.devices", MAX_RESULTS)):
            name, device = _result(entry, f"status.allocation.devices.results[{i}]")
            if name == driver:
                ours.append(device)
            else:
                others += 1
    reserved = tuple(
        _consumer(entry, f"status.reservedFor[{i}]")
        for i, entry in enumerate(_list(status, "reservedFor", "status", MAX_RESERVED))
    )
    return Claim(key, allocation is not None, tuple(ours), others, reserved)


__all__ = [
    "AllocatedDevice",
    "Claim",
    "ClaimError",
    "ClaimKey",
    "ClaimUID",
    "Consumer",
    "DriverName",
    "parse_claim",
]
