"""Codec of the ``platform.k8s.io/container-devices-from`` annotation.

Pure parsing and formatting; no side effects. The annotation tells spotgpu-runtime where a
container's devices come from. Its value is a JSON object; each entry is one source::

    {"<ns or _>/<pod>/<container>": {"<resource>": ["<id>", ...]}}   ContainerSync
    {"<ns or _>/<pod>":             {"<resource>": ["<id>", ...]}}   PodSync (every container of the pod)
    {"direct":                      {"<resource>": ["<id>", ...]}}   Direct (IDs given outright)

``_`` is the namespace of the pod that carries the annotation. For ContainerSync and PodSync an
empty ID list means "every device of that resource the source holds"; Direct needs IDs.

Which annotation applies to which container (the one rule, see docs/architecture.md):

* ``platform.k8s.io/container-devices-from`` (no suffix) applies to the container whose OCI
  spec carries it. This is the form the agent's device plugin ``Allocate`` returns, and the
  kubelet puts it on exactly the container that requested the twins.
* ``platform.k8s.io/container-devices-from.<container>`` applies only to the container named
  ``<container>`` (matched against the CRI container-name annotation). This is the form to
  set at pod level. Kubernetes limits the key's name part to 63 characters, so the suffix can
  name containers of at most 40 characters; longer names must use the unsuffixed form.
* When both apply, their sources are merged; a device claimed by two different sources is a
  :class:`ConflictingSources` error.

Strictness: every malformed input raises a specific :class:`DevicesFromError` subclass (all
are :class:`ValueError`) whose message names the problem; nothing is silently dropped. The
canonical form (:func:`format_devices_from`) is compact JSON with sorted keys, and
``parse(format(x)) == x`` for every valid value.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from spotgpu.core import keys
from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import (
    DeviceID,
    DeviceIDError,
    ResourceName,
    ResourceNameError,
    validate_device_id,
    validate_resource_name,
)
from spotgpu.core.refs import ContainerRef, PodRef, RefError

DIRECT_KEY: Final = "direct"
MAX_VALUE_BYTES: Final = 32 * 1024
"""Largest annotation value we accept (Kubernetes allows 256 KiB for all annotations together)."""
MAX_SOURCES: Final = 64
MAX_DEVICES_PER_RESOURCE: Final = 256
MAX_SUFFIXED_CONTAINER_LEN: Final = 63 - len(keys.DEVICES_FROM_PREFIX.split("/", 1)[1]) - 1


class DevicesFromError(ValidationError):
    """Base of every error of this codec."""


class AnnotationTooLarge(DevicesFromError):
    """The value exceeds :data:`MAX_VALUE_BYTES`, or has too many sources or devices."""


class InvalidJSON(DevicesFromError):
    """The value is not valid JSON, or has a duplicate key."""


class NotAnObject(DevicesFromError):
    """The value, or a source's entry, is not a JSON object."""


class EmptyAnnotation(DevicesFromError):
    """The value names no source, or a source names no resource."""


class InvalidSourceKey(DevicesFromError):
    """A source key is neither ``direct`` nor a valid pod or container reference."""


class InvalidResource(DevicesFromError):
    """A resource name is not an extended resource name."""


class InvalidDeviceList(DevicesFromError):
    """A device list is not a list of strings, or is empty where IDs are required."""


class InvalidDeviceID(DevicesFromError):
    """A device ID breaks the device ID rules (see :mod:`spotgpu.core.ids`)."""


class DuplicateDevice(DevicesFromError):
    """A device ID appears twice in one resource list."""


class ConflictingSources(DevicesFromError):
    """The same device of the same resource is claimed by two different sources."""


class InvalidAnnotationKey(DevicesFromError):
    """An annotation key is not a ``container-devices-from`` key, or its suffix is invalid."""


class SyncKind(StrEnum):
    CONTAINER = "ContainerSync"
    POD = "PodSync"
    DIRECT = "Direct"


@dataclass(frozen=True, slots=True)
class SyncSource:
    """One entry of the annotation: where some devices come from.

    ``resources`` is sorted by resource name; each device tuple keeps the order given.
    """

    kind: SyncKind
    ref: ContainerRef | PodRef | None
    resources: tuple[tuple[ResourceName, tuple[DeviceID, ...]], ...]

    def __post_init__(self) -> None:
        expected = {SyncKind.CONTAINER: ContainerRef, SyncKind.POD: PodRef, SyncKind.DIRECT: type(None)}[self.kind]
        if not isinstance(self.ref, expected):
            raise InvalidSourceKey(f"{self.kind} source needs a {expected.__name__} reference, got {self.ref!r}")
        if not self.resources:
            raise EmptyAnnotation(f"source {self.key!r} names no resource")
        names = [name for name, _ in self.resources]
        if names != sorted(set(names)):
            raise InvalidResource(f"source {self.key!r}: resources must be unique and sorted, got {names}")
        for name, ids in self.resources:
            if self.kind is SyncKind.DIRECT and not ids:
                raise InvalidDeviceList(f"direct source: resource {name!r} needs at least one device ID")
            if len(set(ids)) != len(ids):
                dup = next(i for i in ids if ids.count(i) > 1)
                raise DuplicateDevice(f"source {self.key!r}: device {dup!r} of {name!r} is listed twice")

    @property
    def key(self) -> str:
        """The JSON key of this source."""
        return DIRECT_KEY if self.ref is None else self.ref.format()

    def devices(self, resource: str) -> tuple[DeviceID, ...]:
        for name, ids in self.resources:
            if name == resource:
                return ids
        return ()

    def resolve(self, namespace: str) -> SyncSource:
        """Replace a ``_`` namespace with ``namespace``."""
        if self.ref is None or not self.ref.is_relative:
            return self
        return SyncSource(self.kind, self.ref.resolve(namespace), self.resources)


@dataclass(frozen=True, slots=True)
class DevicesFrom:
    """A parsed annotation value: its sources, sorted by key."""

    sources: tuple[SyncSource, ...]

    def __post_init__(self) -> None:
        if not self.sources:
            raise EmptyAnnotation("devices-from annotation names no source")
        if len(self.sources) > MAX_SOURCES:
            raise AnnotationTooLarge(f"devices-from annotation has {len(self.sources)} sources; at most {MAX_SOURCES}")
        skeys = [s.key for s in self.sources]
        if skeys != sorted(set(skeys)):
            raise InvalidSourceKey(f"sources must have unique keys in sorted order, got {skeys}")
        _check_no_conflicts(self.sources)

    @classmethod
    def of(cls, sources: list[SyncSource] | tuple[SyncSource, ...]) -> DevicesFrom:
        """Build from sources in any order (sorted here)."""
        return cls(tuple(sorted(sources, key=lambda s: s.key)))

    def merge(self, other: DevicesFrom) -> DevicesFrom:
        """Union of two annotations; a source key present in both must carry identical entries."""
        by_key = {s.key: s for s in self.sources}
        for source in other.sources:
            mine = by_key.get(source.key)
            if mine is not None and mine != source:
                raise ConflictingSources(
                    f"source {source.key!r} is given twice with different devices: "
                    f"{dict(mine.resources)} and {dict(source.resources)}"
                )
            by_key[source.key] = source
        return DevicesFrom.of(list(by_key.values()))

    def resolve(self, namespace: str) -> DevicesFrom:
        return DevicesFrom.of([s.resolve(namespace) for s in self.sources])


def _check_no_conflicts(sources: tuple[SyncSource, ...]) -> None:
    claimed: dict[tuple[str, str], str] = {}
    for source in sources:
        for name, ids in source.resources:
            for device in ids:
                other = claimed.setdefault((name, device), source.key)
                if other != source.key:
                    raise ConflictingSources(
                        f"device {device!r} of {name!r} is claimed by two sources: {other!r} and {source.key!r}"
                    )


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            raise InvalidJSON(f"duplicate JSON key {key!r}")
        result[key] = value
    return result


def _parse_source(key: str, entry: object) -> SyncSource:
    ref: ContainerRef | PodRef | None
    if key == DIRECT_KEY:
        kind, ref = SyncKind.DIRECT, None
    else:
        try:
            if key.count("/") == 2:
                kind, ref = SyncKind.CONTAINER, ContainerRef.parse(key)
            elif key.count("/") == 1:
                kind, ref = SyncKind.POD, PodRef.parse(key)
            else:
                raise InvalidSourceKey(
                    f"source key {key!r} must be 'ns/pod/container' (ContainerSync), 'ns/pod' (PodSync)"
                    f" or {DIRECT_KEY!r}; use '_' for the same namespace"
                )
        except RefError as exc:
            raise InvalidSourceKey(f"source key {key!r}: {exc}") from None
    if not isinstance(entry, dict):
        raise NotAnObject(f"source {key!r} must map resource names to device lists, got {type(entry).__name__}")
    if not entry:
        raise EmptyAnnotation(f"source {key!r} names no resource")
    resources: list[tuple[ResourceName, tuple[DeviceID, ...]]] = []
    for resource, ids in entry.items():
        try:
            name = validate_resource_name(resource)
        except ResourceNameError as exc:
            raise InvalidResource(f"source {key!r}: {exc}") from None
        if not isinstance(ids, list):
            raise InvalidDeviceList(f"source {key!r}: devices of {name!r} must be a list, got {type(ids).__name__}")
        if len(ids) > MAX_DEVICES_PER_RESOURCE:
            raise AnnotationTooLarge(
                f"source {key!r}: {len(ids)} devices of {name!r}; at most {MAX_DEVICES_PER_RESOURCE}"
            )
        devices: list[DeviceID] = []
        for raw in ids:
            try:
                devices.append(validate_device_id(raw))
            except DeviceIDError as exc:
                raise InvalidDeviceID(f"source {key!r}, resource {name!r}: {exc}") from None
        resources.append((name, tuple(devices)))
    resources.sort(key=lambda r: r[0])
    return SyncSource(kind, ref, tuple(resources))


def parse_devices_from(value: object) -> DevicesFrom:
    """Parse an annotation value; raise a :class:`DevicesFromError` subclass on any defect."""
    if not isinstance(value, str):
        raise NotAnObject(f"annotation value must be a string, got {type(value).__name__}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_VALUE_BYTES:
        raise AnnotationTooLarge(f"annotation value is {size} bytes; at most {MAX_VALUE_BYTES}")
    if not value.strip():
        raise EmptyAnnotation("annotation value is empty")
    try:
        data = json.loads(value, object_pairs_hook=_no_duplicate_keys)
    except DevicesFromError:
        raise
    except (ValueError, RecursionError) as exc:
        raise InvalidJSON(f"annotation value is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise NotAnObject(f"annotation value must be a JSON object of sources, got {type(data).__name__}")
    if len(data) > MAX_SOURCES:
        raise AnnotationTooLarge(f"annotation value has {len(data)} sources; at most {MAX_SOURCES}")
    return DevicesFrom.of([_parse_source(k, v) for k, v in data.items()])


def format_devices_from(value: DevicesFrom) -> str:
    """Canonical text: compact JSON, keys sorted, device order kept."""
    obj = {s.key: {name: list(ids) for name, ids in s.resources} for s in value.sources}
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def devices_from_key(container: str | None = None) -> str:
    """The annotation key: unsuffixed, or suffixed with a container name (pod-level form)."""
    if container is None:
        return keys.DEVICES_FROM_PREFIX
    _check_suffix(container, keys.DEVICES_FROM_PREFIX + "." + container)
    return keys.DEVICES_FROM_PREFIX + "." + container


def _check_suffix(container: str, key: str) -> None:
    try:
        ContainerRef("x", "x", container)
    except RefError:
        raise InvalidAnnotationKey(f"annotation key {key!r}: {container!r} is not a valid container name") from None
    if len(container) > MAX_SUFFIXED_CONTAINER_LEN:
        raise InvalidAnnotationKey(
            f"annotation key {key!r}: container name {container!r} is {len(container)} characters, but the key's "
            f"name part allows at most {MAX_SUFFIXED_CONTAINER_LEN}; use the unsuffixed key on the container"
        )


def container_of_key(key: str, prefix: str = keys.DEVICES_FROM_PREFIX) -> str | None:
    """For a key of ``prefix``: ``None`` when unsuffixed, else the target container name.

    Raises :class:`InvalidAnnotationKey` for a key that is not of this family or whose suffix
    is not a valid container name.
    """
    if key == prefix:
        return None
    if not key.startswith(prefix + "."):
        raise InvalidAnnotationKey(f"annotation key {key!r} is not {prefix!r} or {prefix + '.<container>'!r}")
    container = key[len(prefix) + 1 :]
    _check_suffix(container, key)
    return container


def annotation_values_for(annotations: Mapping[str, str], container: str, prefix: str) -> list[tuple[str, str]]:
    """The ``(key, value)`` pairs of the ``prefix`` family that apply to ``container``.

    The unsuffixed key first, then ``prefix.<container>``; keys of the family with a malformed
    suffix raise :class:`InvalidAnnotationKey` rather than being ignored.
    """
    found: list[tuple[str, str]] = []
    for key, value in annotations.items():
        if key != prefix and not key.startswith(prefix + "."):
            continue
        target = container_of_key(key, prefix)
        if target is None or target == container:
            found.append((key, value))
    found.sort(key=lambda kv: (kv[0] != prefix, kv[0]))
    return found


def devices_from_for_container(annotations: Mapping[str, str], container: str) -> DevicesFrom | None:
    """The merged devices-from request for ``container``, or ``None`` when no key applies."""
    merged: DevicesFrom | None = None
    for key, value in annotation_values_for(annotations, container, keys.DEVICES_FROM_PREFIX):
        try:
            parsed = parse_devices_from(value)
        except DevicesFromError as exc:
            raise type(exc)(f"annotation {key!r}: {exc}") from None
        merged = parsed if merged is None else merged.merge(parsed)
    return merged


# --- spotgpu.io/assigned-devices -----------------------------------------------------------


class AssignmentError(ValidationError):
    """A pod's ``spotgpu.io/assigned-devices`` annotation cannot be read."""


def format_assigned_devices(resource: str, devices: Iterable[str]) -> str:
    """``spotgpu.io/assigned-devices`` as the scheduler writes it: ``{"<resource>": ["<id>", ...]}``."""
    return json.dumps({resource: list(devices)}, separators=(",", ":"), sort_keys=True)


def parse_assigned_devices(raw: str, *, strict: bool = True) -> dict[str, list[str]]:
    """``spotgpu.io/assigned-devices`` as a dict. ``strict``: :class:`AssignmentError` when it is
    not JSON or not a map of resources to lists of IDs; otherwise what is malformed is left out
    (a view for operators, a hint no decision rests on)."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        if strict:
            raise AssignmentError(f"annotation {keys.ASSIGNED_DEVICES} is not JSON: {exc}") from None
        return {}
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        if strict:
            raise AssignmentError(f"annotation {keys.ASSIGNED_DEVICES} must map a resource to a list of IDs")
        data = {k: v for k, v in data.items() if isinstance(v, list)} if isinstance(data, dict) else {}
    if strict:
        return {str(k): [str(i) for i in v] for k, v in data.items()}
    return {str(k): [i for i in v if isinstance(i, str)] for k, v in data.items()}


__all__ = [
    "DIRECT_KEY",
    "MAX_DEVICES_PER_RESOURCE",
    "MAX_SOURCES",
    "MAX_VALUE_BYTES",
    "AnnotationTooLarge",
    "AssignmentError",
    "ConflictingSources",
    "DevicesFrom",
    "DevicesFromError",
    "DuplicateDevice",
    "EmptyAnnotation",
    "InvalidAnnotationKey",
    "InvalidDeviceID",
    "InvalidDeviceList",
    "InvalidJSON",
    "InvalidResource",
    "InvalidSourceKey",
    "NotAnObject",
    "SyncKind",
    "SyncSource",
    "annotation_values_for",
    "container_of_key",
    "devices_from_for_container",
    "devices_from_key",
    "format_assigned_devices",
    "format_devices_from",
    "parse_assigned_devices",
    "parse_devices_from",
]
