"""Reading core Kubernetes objects (pods, nodes) from their API JSON into spotgpu's plain data.

Pure functions; no side effects. Every reader tolerates what the API may omit (no status yet,
no annotations) and raises :class:`~spotgpu.core.errors.ValidationError` (via
:class:`ObjectError`) naming the object and field when something present is malformed.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from spotgpu.core import keys
from spotgpu.core.ids import NodeName
from spotgpu.core.refs import PodRef
from spotgpu.kube.resources import ObjectError, name_of, namespace_of, parse_time
from spotgpu.ports.kube import ContainerInfo, PodInfo

JSON = dict[str, Any]

_SUFFIXES: Final = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(value: object, where: str) -> Decimal:
    """A Kubernetes quantity (``2``, ``"500m"``, ``"1Gi"``) as a Decimal."""
    text = str(value).strip() if isinstance(value, int | float | str) and not isinstance(value, bool) else ""
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            number, factor = text[: -len(suffix)], Decimal(_SUFFIXES[suffix])
            break
    else:
        if text.endswith("m"):
            number, factor = text[:-1], Decimal("0.001")
        else:
            number, factor = text, Decimal(1)
    try:
        amount = Decimal(number) * factor
    except InvalidOperation:
        raise ObjectError(f"{where}: {value!r} is not a Kubernetes quantity") from None
    if not amount.is_finite() or amount < 0:
        raise ObjectError(f"{where}: {value!r} is not a non-negative quantity")
    return amount


def container_requests(container: Mapping[str, Any], where: str) -> dict[str, int]:
    """Extended-resource requests of a container (those with a ``/`` in the name), as integers.

    Extended resources may be given as limits only (requests then default to limits)."""
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    out: dict[str, int] = {}
    for name, value in merged.items():
        if "/" not in name or name.startswith("requests."):
            continue
        amount = quantity(value, f"{where}: resources {name}")
        if amount != amount.to_integral_value():
            raise ObjectError(f"{where}: extended resource {name} must be a whole number, got {value!r}")
        out[name] = int(amount)
    return out


def strip_scheme(container_id: str | None) -> str | None:
    """``containerd://abc`` -> ``abc``."""
    if not container_id:
        return None
    return container_id.split("://", 1)[1] if "://" in container_id else container_id


def pod_ref(obj: Mapping[str, Any]) -> PodRef:
    return PodRef(namespace_of(obj), name_of(obj))


def is_deleting(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def disruption(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's ``DisruptionTarget=True`` condition (it is being evicted), if any."""
    cond = condition(obj, keys.DISRUPTION_CONDITION)
    return cond if cond is not None and cond.get("status") == "True" else None


def pod_phase(obj: Mapping[str, Any]) -> str:
    return str((obj.get("status") or {}).get("phase") or "Pending")


def pod_start_time(obj: Mapping[str, Any]) -> float | None:
    return parse_time((obj.get("status") or {}).get("startTime"))


def pod_info(obj: Mapping[str, Any]) -> PodInfo:
    """The agent's view of a pod."""
    where = f"pod {namespace_of(obj)}/{name_of(obj)}"
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    ids = {
        str(s.get("name")): strip_scheme(s.get("containerID"))
        for s in (obj.get("status") or {}).get("containerStatuses") or ()
        if isinstance(s, Mapping)
    }
    containers = tuple(
        ContainerInfo(
            name=str(c.get("name")),
            container_id=ids.get(str(c.get("name"))),
            requests=container_requests(c, f"{where} container {c.get('name')}"),
        )
        for c in spec.get("containers") or ()
    )
    status = obj.get("status") or {}
    others = sorted(
        {
            cid
            for kind in ("initContainerStatuses", "ephemeralContainerStatuses")
            for s in status.get(kind) or ()
            if isinstance(s, Mapping) and (cid := strip_scheme(s.get("containerID")))
        }
    )
    node = spec.get("nodeName")
    return PodInfo(
        ref=pod_ref(obj),
        uid=str(meta.get("uid") or ""),
        node=NodeName(node) if node else None,
        phase=pod_phase(obj),
        annotations=dict(meta.get("annotations") or {}),
        labels=dict(meta.get("labels") or {}),
        containers=containers,
        deleting=is_deleting(obj),
        other_container_ids=tuple(others),
    )


def node_ready(obj: Mapping[str, Any]) -> bool:
    cond = condition(obj, "Ready")
    return cond is not None and cond.get("status") == "True"


def node_schedulable(obj: Mapping[str, Any]) -> bool:
    return node_ready(obj) and not (obj.get("spec") or {}).get("unschedulable", False)


__all__ = [
    "condition",
    "container_requests",
    "disruption",
    "is_deleting",
    "node_ready",
    "node_schedulable",
    "pod_info",
    "pod_phase",
    "pod_ref",
    "pod_start_time",
    "quantity",
    "strip_scheme",
]
