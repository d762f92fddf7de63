"""Device IDs, resource names and the real <-> spot twin ID conversion.

Pure validation; no side effects. Every real GPU ``GPU-x`` of a vendor resource (for example
``nvidia.com/gpu``) has exactly one twin ``spot-GPU-x`` of resource ``platform/spot-gpu``
served by the agent's device plugin.

Rules enforced here (the kubelet's and ours):

* A device ID is 1..63 characters (kubelet's ``Device.ID`` limit), starts with an ASCII letter
  or digit and contains only ASCII letters, digits, ``-``, ``_``, ``.`` and ``:`` (``:`` for
  NVIDIA's time-slicing replicas ``<uuid>::<n>``). ``/`` and whitespace are refused: IDs end
  up in annotation JSON, environment variables and file names.
* A twin ID is ``spot-`` + the real ID and must itself fit in 63 characters, so a real ID
  longer than 58 characters cannot be lent: :class:`TwinIDTooLong`, never a silent truncation.
* Twin <-> real IDs have one parser, :func:`real_of_twin`, used by the agent (mapping, steering,
  Allocate), the runtime's twin rule and the scheduler alike. ``spot-X`` is the exclusive twin
  of real ``X``; ``spot-X::<n>`` is either the exclusive twin of a real ``X::<n>`` (a vendor's
  own time-slicing replica) or shared replica ``n`` of real ``X``. The known real IDs decide,
  exact match first: a real ``X::<n>`` that exists always owns the name ``spot-X::<n>``, and the
  agent never serves a replica name that would parse back to another device
  (:func:`replica_id` with ``known``). No caller may cut an ID at ``::`` itself.
* A resource name must be a Kubernetes *extended resource name*: it contains ``/``, is not in
  the ``kubernetes.io/`` domain, does not start with ``requests.``, and ``requests.<name>`` is
  a qualified name.
"""

from __future__ import annotations

import re
from collections.abc import Container
from typing import Final, NewType

from spotgpu.core.errors import ValidationError

DeviceID = NewType("DeviceID", str)
"""A device ID as a device plugin reports it (a real GPU's or a twin's)."""

ResourceName = NewType("ResourceName", str)
"""An extended resource name such as ``nvidia.com/gpu``."""

NodeName = NewType("NodeName", str)
"""A Kubernetes node name."""

MAX_DEVICE_ID_LEN: Final = 63
SPOT_PREFIX: Final = "spot-"
SPOT_GPU_RESOURCE: Final = ResourceName("platform/spot-gpu")
SHARED_SUFFIX: Final = "-shared"
SPOT_GPU_SHARED_RESOURCE: Final = ResourceName("platform/spot-gpu-shared")
"""Shared spot: replicas ``spot-<id>::<n>`` of lent GPUs, one per shared spot container (the
agent's ``sharedReplicas``); always the spot resource's name + :data:`SHARED_SUFFIX`."""
NVIDIA_GPU_RESOURCE: Final = ResourceName("nvidia.com/gpu")
REPLICA_SEP: Final = "::"
"""Between a twin and its shared replica index (``spot-X::3``); also inside vendors' replica IDs."""

_DEVICE_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_QUALIFIED_NAME_RE: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUBDOMAIN_RE: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class DeviceIDError(ValidationError):
    """A device ID is empty, too long or contains a character we do not allow."""


class TwinIDTooLong(DeviceIDError):
    """``spot-`` + the real ID would exceed the kubelet's 63-character limit."""


class NotASpotID(DeviceIDError):
    """A twin ID was expected but the ID lacks the ``spot-`` prefix."""


class ResourceNameError(ValidationError):
    """A resource name is not a valid Kubernetes extended resource name."""


def validate_device_id(value: object) -> DeviceID:
    """Return ``value`` as a :data:`DeviceID`, or raise :class:`DeviceIDError` naming the problem."""
    if not isinstance(value, str):
        raise DeviceIDError(f"device ID must be a string, got {type(value).__name__} {value!r}")
    if not value:
        raise DeviceIDError("device ID must not be empty")
    if len(value) > MAX_DEVICE_ID_LEN:
        raise DeviceIDError(
            f"device ID {value[:70]!r} is {len(value)} characters; the kubelet allows at most {MAX_DEVICE_ID_LEN}"
        )
    if _DEVICE_ID_RE.fullmatch(value) is None:
        bad = next((c for c in value if not (c.isascii() and (c.isalnum() or c in "._:-"))), value[0])
        raise DeviceIDError(
            f"device ID {value!r} has character {bad!r} at position {value.index(bad)}; allowed are ASCII "
            "letters, digits, '-', '_', '.', ':' and the first character must be a letter or digit"
        )
    return DeviceID(value)


def is_spot_id(device_id: str) -> bool:
    """True when ``device_id`` is spelled like a twin (``spot-...``)."""
    return device_id.startswith(SPOT_PREFIX) and len(device_id) > len(SPOT_PREFIX)


def to_spot_id(real_id: str) -> DeviceID:
    """``GPU-x`` -> ``spot-GPU-x``. Raises :class:`TwinIDTooLong` instead of truncating."""
    real = validate_device_id(real_id)
    if is_spot_id(real):
        raise DeviceIDError(f"device ID {real!r} is already a twin ID; twins of twins do not exist")
    twin = SPOT_PREFIX + real
    if len(twin) > MAX_DEVICE_ID_LEN:
        raise TwinIDTooLong(
            f"twin of device {real!r} would be {len(twin)} characters ({SPOT_PREFIX!r} + {len(real)}); "
            f"the kubelet allows at most {MAX_DEVICE_ID_LEN}, so real IDs longer than "
            f"{MAX_DEVICE_ID_LEN - len(SPOT_PREFIX)} characters cannot be lent"
        )
    return DeviceID(twin)


def shared_resource_of(spot_resource: str) -> ResourceName:
    """The shared spot resource that goes with ``spot_resource`` (``platform/spot-gpu`` ->
    ``platform/spot-gpu-shared``): derived, never configured, so the agent, the runtime's twin
    rule and the scheduler's snapshot cannot disagree on it."""
    return ResourceName(spot_resource + SHARED_SUFFIX)


def from_spot_id(spot_id: str) -> DeviceID:
    """``spot-GPU-x`` -> ``GPU-x``. Raises :class:`NotASpotID` when the prefix is missing."""
    twin = validate_device_id(spot_id)
    if twin == SPOT_PREFIX:
        raise NotASpotID(f"twin ID {twin!r} names no real device after the {SPOT_PREFIX!r} prefix")
    if not is_spot_id(twin):
        raise NotASpotID(f"device ID {twin!r} is not a twin ID: it must start with {SPOT_PREFIX!r}")
    return validate_device_id(twin[len(SPOT_PREFIX) :])


def replica_id(real_id: str, index: int, known: Container[str] | None = None) -> DeviceID:
    """Shared replica ``index`` of real ``real_id``: ``spot-<real>::<index>``.

    Raises :class:`TwinIDTooLong` beyond 63 characters, and :class:`DeviceIDError` when the name
    would not parse back to ``real_id`` among ``known`` (it is the exclusive twin of another real
    device, e.g. ``X::0`` beside ``X``): such a name is never served, so no parser can disagree.
    """
    if index < 0:
        raise DeviceIDError(f"replica index {index} must not be negative")
    twin = to_spot_id(real_id)
    name = twin + REPLICA_SEP + str(index)
    if len(name) > MAX_DEVICE_ID_LEN:
        raise TwinIDTooLong(f"replica {index} of device {real_id!r} would be {len(name)} characters; at most 63")
    if known is not None and real_of_twin(name, known) != real_id:
        raise DeviceIDError(
            f"replica name {name!r} of {real_id!r} is the twin of another real device on this node; not served"
        )
    return DeviceID(name)


def real_of_twin(twin: str, known: Container[str]) -> DeviceID | None:
    """The real device among ``known`` behind ``twin`` (``spot-X`` or a shared replica
    ``spot-X::<n>``); None when it is no twin ID or names no known device.

    The exact rest is tried first (``X`` may itself contain ``::``: a vendor's replica ID), then
    the replica form, split at the *last* ``::`` with a decimal index. The only twin parser.
    """
    if not isinstance(twin, str) or not is_spot_id(twin):
        return None
    try:
        real = from_spot_id(twin)
    except DeviceIDError:
        return None
    if real in known:
        return real
    base, sep, index = real.rpartition(REPLICA_SEP)
    if sep and base and index.isascii() and index.isdigit() and base in known:
        return DeviceID(base)
    return None


def validate_resource_name(value: object) -> ResourceName:
    """Return ``value`` as a :data:`ResourceName` if it is a Kubernetes extended resource name."""
    if not isinstance(value, str):
        raise ResourceNameError(f"resource name must be a string, got {type(value).__name__} {value!r}")
    if "/" not in value:
        raise ResourceNameError(f"resource name {value!r} must have a domain prefix, like 'nvidia.com/gpu'")
    if "kubernetes.io/" in value:
        raise ResourceNameError(f"resource name {value!r} is in the kubernetes.io domain, which is reserved")
    if value.startswith("requests."):
        raise ResourceNameError(f"resource name {value!r} must not start with 'requests.'")
    prefix, _, name = ("requests." + value).partition("/")
    if len(prefix) > 253 or _DNS1123_SUBDOMAIN_RE.fullmatch(prefix) is None:
        raise ResourceNameError(
            f"resource name {value!r}: domain {prefix.removeprefix('requests.')!r} is not a lowercase DNS subdomain"
        )
    if len(name) > 63 or _QUALIFIED_NAME_RE.fullmatch(name) is None:
        raise ResourceNameError(
            f"resource name {value!r}: name part {name!r} must be 1-63 characters of letters, digits, '-', '_', '.',"
            " starting and ending with a letter or digit"
        )
    return ResourceName(value)


__all__ = [
    "MAX_DEVICE_ID_LEN",
    "NVIDIA_GPU_RESOURCE",
    "REPLICA_SEP",
    "SHARED_SUFFIX",
    "SPOT_GPU_RESOURCE",
    "SPOT_GPU_SHARED_RESOURCE",
    "SPOT_PREFIX",
    "DeviceID",
    "DeviceIDError",
    "NodeName",
    "NotASpotID",
    "ResourceName",
    "ResourceNameError",
    "TwinIDTooLong",
    "from_spot_id",
    "shared_resource_of",
    "is_spot_id",
    "real_of_twin",
    "replica_id",
    "to_spot_id",
    "validate_device_id",
    "validate_resource_name",
]
