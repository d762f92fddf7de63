"""spotgpu's custom resources: their lightkube classes, names, and typed views of their JSON.

Pure apart from class creation at import (lightkube's resource registry). The CRD manifests
(schemas and validation) are in :mod:`spotgpu.kube.crds`; this module reads objects that passed
that validation and still checks every field it uses, raising
:class:`~spotgpu.core.errors.ValidationError` subclasses that name the object and the field.

* ``Queue`` (cluster-scoped): ``spec.type`` reserved|spot, ``spec.weight``, ``spec.capacity``
  (GPUs, whole or fractional like ``"2.5"``); status: pending/running gang counts.
* ``PodGroup`` (namespaced): ``spec.minMember``, ``spec.queue``, ``spec.priorityClassName``,
  ``spec.pool``, ``spec.minLease``, ``spec.checkpointInterval`` (durations); status: ``phase``,
  counts and conditions, written by the scheduler.
* ``GangJob`` (namespaced): ``spec.template`` (a pod template, refused as
  :class:`TemplateRefused` when it carries what only the scheduler writes:
  :mod:`spotgpu.kube.template_check`), ``replicas``, ``minAvailable``,
  ``queue``, ``priorityClassName`` (spothigh|spotmid|spotlow), ``retryLimit``,
  ``requeueBackoffSeconds``, ``gpus`` (twins per pod), ``minLease`` and ``checkpointInterval``
  (durations like ``"1h30m"`` or whole seconds; copied onto its PodGroups and pods); status
  written by the GangJob controller.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any, Final

from lightkube.generic_resource import create_global_resource, create_namespaced_resource

from spotgpu.core import keys
from spotgpu.core.configfile import parse_duration
from spotgpu.core.errors import ValidationError
from spotgpu.core.types import GPU_MILLI, QueueType, SpotPriority
from spotgpu.kube.template_check import template_refusals

JSON = dict[str, Any]

GROUP: Final = keys.API_GROUP
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

QueueResource = create_global_resource(GROUP, VERSION, "Queue", "queues")
PodGroupResource = create_namespaced_resource(GROUP, VERSION, "PodGroup", "podgroups")
GangJobResource = create_namespaced_resource(GROUP, VERSION, "GangJob", "gangjobs")

MAX_GANGJOB_NAME: Final = 50
"""GangJob names are at most 50 characters: ``<job>-<attempt>`` names its PodGroup and is a label value (63)."""
DEFAULT_QUEUE: Final = "spot-queue"
DEFAULT_RETRY_LIMIT: Final = 3
DEFAULT_REQUEUE_BACKOFF: Final = 10
MAX_REQUEUE_BACKOFF: Final = 600


class ObjectError(ValidationError):
    """An API object lacks a field or has a malformed one; the message names object and field."""


class TemplateRefused(ObjectError):
    """A GangJob's pod template says what its tenant may not write through the GangJob controller
    (:func:`spotgpu.kube.template_check.template_refusals`); ``refusals`` names each key or field."""

    def __init__(self, message: str, refusals: tuple[str, ...]) -> None:
        super().__init__(message)
        self.refusals = refusals


class GangJobPhase(StrEnum):
    PENDING = "Pending"
    """Pods created, not all placed yet."""
    RUNNING = "Running"
    """At least ``minAvailable`` pods are running."""
    REQUEUED = "Requeued"
    """Evicted; torn down and waiting for the backoff before the next attempt."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    """Evicted more often than ``retryLimit`` allows, or a pod failed, or the spec is invalid."""


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


def _where(obj: Mapping[str, Any]) -> str:
    kind = obj.get("kind", "object")
    ns = namespace_of(obj)
    return f"{kind} {ns + '/' if ns else ''}{name_of(obj)}"


def _int(obj: Mapping[str, Any], spec: Mapping[str, Any], key: str, default: int | None, minimum: int) -> int:
    value = spec.get(key, default)
    if value is None:
        raise ObjectError(f"{_where(obj)}: spec.{key} is required")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ObjectError(f"{_where(obj)}: spec.{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _str(obj: Mapping[str, Any], spec: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = spec.get(key, default)
    if not isinstance(value, str) or not value:
        raise ObjectError(f"{_where(obj)}: spec.{key} must be a non-empty string, got {value!r}")
    return value


def duration_field(obj: Mapping[str, Any], spec: Mapping[str, Any], key: str) -> float | None:
    """``spec.<key>`` as seconds (a duration like ``"1h30m"`` or whole seconds >= 0), or None if absent.

    A malformed or negative value raises :class:`ObjectError` naming the object and the field."""
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, float):
        raise ObjectError(f"{_where(obj)}: spec.{key}: {value!r} is not a duration; use e.g. '30m' or whole seconds")
    try:
        return float(parse_duration(value, f"spec.{key}"))
    except ValidationError as exc:
        raise ObjectError(f"{_where(obj)}: {exc}") from None


def gpu_quantity_milli(value: object, where: str) -> int:
    """``2``, ``"2"``, ``"2.5"``, ``"500m"`` GPUs -> GPU milli."""
    text = str(value).strip() if isinstance(value, int | float | str) and not isinstance(value, bool) else ""
    try:
        amount = Decimal(text[:-1]) / 1000 if text.endswith("m") else Decimal(text)
    except InvalidOperation:
        amount = Decimal(-1)
    if not text or not amount.is_finite() or amount < 0:
        raise ObjectError(f"{where}: {value!r} is not a GPU quantity like 4, '2.5' or '500m'")
    return int(amount * GPU_MILLI)


@dataclass(frozen=True, slots=True)
class QueueView:
    name: str
    type: QueueType
    weight: int
    capacity_milli: int | None

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> QueueView:
        spec = obj.get("spec") or {}
        try:
            qtype = QueueType(spec.get("type", QueueType.RESERVED.value))
        except ValueError:
            raise ObjectError(f"{_where(obj)}: spec.type must be reserved or spot, got {spec.get('type')!r}") from None
        cap = spec.get("capacity")
        return cls(
            name=name_of(obj),
            type=qtype,
            weight=_int(obj, spec, "weight", 1, 1),
            capacity_milli=None if cap is None else gpu_quantity_milli(cap, f"{_where(obj)}: spec.capacity"),
        )


@dataclass(frozen=True, slots=True)
class PodGroupView:
    namespace: str
    name: str
    queue: str
    min_member: int
    priority_class: str | None
    pool: str | None
    phase: str
    created_at: float
    min_lease: float | None = None
    checkpoint_interval: float | None = None

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> PodGroupView:
        spec = obj.get("spec") or {}
        pcn = spec.get("priorityClassName")
        pool = spec.get("pool")
        return cls(
            namespace=namespace_of(obj),
            name=name_of(obj),
            queue=_str(obj, spec, "queue"),
            min_member=_int(obj, spec, "minMember", 1, 1),
            priority_class=str(pcn) if pcn else None,
            pool=str(pool) if pool else None,
            phase=str((obj.get("status") or {}).get("phase") or "Pending"),
            created_at=parse_time((obj.get("metadata") or {}).get("creationTimestamp")) or 0.0,
            min_lease=duration_field(obj, spec, "minLease"),
            checkpoint_interval=duration_field(obj, spec, "checkpointInterval"),
        )


@dataclass(frozen=True, slots=True)
class GangJobView:
    namespace: str
    name: str
    uid: str
    generation: int
    template: JSON
    replicas: int
    min_available: int
    queue: str
    priority: SpotPriority
    retry_limit: int
    requeue_backoff: int
    gpus: int
    min_lease: float | None = None
    checkpoint_interval: float | None = None

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> GangJobView:
        spec = obj.get("spec") or {}
        meta = obj.get("metadata") or {}
        name = name_of(obj)
        if len(name) > MAX_GANGJOB_NAME:
            raise ObjectError(f"{_where(obj)}: name is {len(name)} characters; GangJob names allow {MAX_GANGJOB_NAME}")
        template = spec.get("template")
        if not isinstance(template, dict) or not isinstance((template.get("spec") or {}).get("containers"), list):
            raise ObjectError(f"{_where(obj)}: spec.template must be a pod template with spec.containers")
        if not template["spec"]["containers"]:
            raise ObjectError(f"{_where(obj)}: spec.template.spec.containers must not be empty")
        refusals = template_refusals(template)
        if refusals:
            raise TemplateRefused(f"{_where(obj)}: spec.template refused: {'; '.join(refusals)}", refusals)
        replicas = _int(obj, spec, "replicas", None, 1)
        min_available = _int(obj, spec, "minAvailable", replicas, 1)
        if min_available > replicas:
            raise ObjectError(f"{_where(obj)}: spec.minAvailable ({min_available}) exceeds spec.replicas ({replicas})")
        try:
            priority = SpotPriority.parse(spec.get("priorityClassName", SpotPriority.SPOTMID.value))
        except ValidationError as exc:
            raise ObjectError(f"{_where(obj)}: spec.priorityClassName: {exc}") from None
        backoff = _int(obj, spec, "requeueBackoffSeconds", DEFAULT_REQUEUE_BACKOFF, 0)
        return cls(
            namespace=namespace_of(obj),
            name=name,
            uid=str(meta.get("uid") or ""),
            generation=int(meta.get("generation") or 1),
            template=template,
            replicas=replicas,
            min_available=min_available,
            queue=_str(obj, spec, "queue", DEFAULT_QUEUE),
            priority=priority,
            retry_limit=_int(obj, spec, "retryLimit", DEFAULT_RETRY_LIMIT, 0),
            requeue_backoff=min(backoff, MAX_REQUEUE_BACKOFF),
            gpus=_int(obj, spec, "gpus", 0, 0),
            min_lease=duration_field(obj, spec, "minLease"),
            checkpoint_interval=duration_field(obj, spec, "checkpointInterval"),
        )


def parse_time(value: object) -> float | None:
    """An RFC 3339 timestamp (``2026-01-02T03:04:05Z``, fractions allowed) as epoch seconds."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def format_time(epoch: float) -> str:
    """Epoch seconds as RFC 3339 UTC with seconds precision (Kubernetes ``Time``)."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(epoch: float) -> str:
    """Epoch seconds as RFC 3339 UTC with microseconds (Kubernetes ``MicroTime``, used by Leases)."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


__all__ = [
    "API_VERSION",
    "DEFAULT_QUEUE",
    "DEFAULT_REQUEUE_BACKOFF",
    "DEFAULT_RETRY_LIMIT",
    "GROUP",
    "MAX_GANGJOB_NAME",
    "MAX_REQUEUE_BACKOFF",
    "VERSION",
    "GangJobPhase",
    "GangJobResource",
    "GangJobView",
    "ObjectError",
    "PodGroupResource",
    "PodGroupView",
    "QueueResource",
    "QueueView",
    "TemplateRefused",
    "format_micro_time",
    "gangjob_manifest",
    "format_time",
    "duration_field",
    "gpu_quantity_milli",
    "name_of",
    "namespace_of",
    "parse_time",
]


def gangjob_manifest(
    *,
    namespace: str,
    name: str | None,
    queue: str,
    replicas: int,
    gpus: int,
    priority: str,
    image: str,
    command: list[str],
    min_available: int | None = None,
    retry_limit: int = DEFAULT_RETRY_LIMIT,
    requeue_backoff: int = DEFAULT_REQUEUE_BACKOFF,
    env: Mapping[str, str] | None = None,
) -> JSON:
    """A GangJob as ``spotgpu gangjob submit`` builds it, checked with :meth:`GangJobView.parse`.

    Without ``name`` the API server generates one (``gangjob-xxxxx``)."""
    container: JSON = {"name": "main", "image": image}
    if command:
        container["command"] = list(command)
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in sorted(env.items())]
    spec: JSON = {
        "replicas": replicas,
        "minAvailable": replicas if min_available is None else min_available,
        "queue": queue,
        "priorityClassName": priority,
        "gpus": gpus,
        "retryLimit": retry_limit,
        "requeueBackoffSeconds": requeue_backoff,
        "template": {"spec": {"containers": [container]}},
    }
    meta: JSON = {"namespace": namespace}
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = "gangjob-"
    obj: JSON = {"apiVersion": API_VERSION, "kind": "GangJob", "metadata": meta, "spec": spec}
    GangJobView.parse({**obj, "metadata": {**meta, "name": name or "gangjob-xxxxx"}})
    return obj
