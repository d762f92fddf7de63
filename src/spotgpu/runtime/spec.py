"""An OCI spec as the modifiers see it: whose container it is, and safe access to its parts.

Pure; no side effects. The spec stays a plain JSON ``dict`` so that every field we do not know
survives a modification untouched. Helpers here create missing objects on demand and refuse,
with :class:`SpecError`, a spec whose shape is wrong where we need to write (``"linux": 3``).

Container identity comes from the annotations the CRI runtime writes into every spec
(protocols.md 3.3): containerd's ``io.kubernetes.cri.*`` keys, or CRI-O's container type plus
the ``io.kubernetes.pod.*`` / ``io.kubernetes.container.name`` keys. Users cannot set these
through the pod-annotation allow-list unless an operator allow-lists ``io.kubernetes.*``, which
docs/runtime.md forbids.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from spotgpu.core import keys
from spotgpu.core.errors import ValidationError
from spotgpu.core.refs import ContainerRef, RefError

Spec = dict[str, Any]


class SpecError(ValidationError):
    """The spec (``config.json``) is malformed where spotgpu-runtime must read or write it."""


class ContainerKind(StrEnum):
    CONTAINER = "container"
    SANDBOX = "sandbox"
    UNKNOWN = "unknown"
    """No CRI annotations: a container created outside Kubernetes (``ctr run``)."""


@dataclass(frozen=True, slots=True)
class ContainerIdentity:
    """Which Kubernetes container a spec belongs to, as the CRI runtime annotated it."""

    kind: ContainerKind
    ref: ContainerRef | None = None
    """``namespace/pod/container``; None for sandboxes and unknown containers."""
    problem: str = ""
    """Why ``ref`` is None for a CRI container (malformed or missing names)."""

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, Any]) -> ContainerIdentity:
        def text(key: str) -> str | None:
            value = annotations.get(key)
            return value if isinstance(value, str) and value else None

        if (kind := text(keys.CRI_CONTAINER_TYPE)) is not None:
            names = (text(keys.CRI_SANDBOX_NAMESPACE), text(keys.CRI_SANDBOX_NAME), text(keys.CRI_CONTAINER_NAME))
            origin = "containerd CRI"
        elif (kind := text(keys.CRIO_CONTAINER_TYPE)) is not None:
            container = text(keys.CRIO_CONTAINER_NAME) or text(keys.LABEL_CONTAINER_NAME)
            names = (text(keys.LABEL_POD_NAMESPACE), text(keys.LABEL_POD_NAME), container)
            origin = "CRI-O"
        else:
            return cls(ContainerKind.UNKNOWN, problem="the spec has no CRI container annotations")
        if kind == keys.CRI_TYPE_SANDBOX:
            return cls(ContainerKind.SANDBOX)
        if kind != keys.CRI_TYPE_CONTAINER:
            return cls(ContainerKind.UNKNOWN, problem=f"unknown {origin} container type {kind!r}")
        namespace, pod, container = names
        if namespace is None or pod is None or container is None:
            return cls(
                ContainerKind.CONTAINER, problem=f"{origin} annotations lack the pod namespace, pod or container name"
            )
        try:
            return cls(ContainerKind.CONTAINER, ContainerRef(namespace, pod, container))
        except RefError as exc:
            return cls(ContainerKind.CONTAINER, problem=f"{origin} annotations name no valid container: {exc}")

    @property
    def container_name(self) -> str | None:
        return self.ref.name if self.ref is not None else None

    def describe(self) -> str:
        if self.ref is not None:
            return f"container {self.ref}"
        return f"{self.kind.value} container ({self.problem})" if self.problem else f"{self.kind.value} container"


# --- access helpers --------------------------------------------------------------------------


def obj(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """``parent[key]`` as an object, created empty when missing or null."""
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    if not isinstance(value, dict):
        raise SpecError(f"config.json: {where}{key} must be an object, got {type(value).__name__}")
    return value


def array(parent: dict[str, Any], key: str, where: str) -> list[Any]:
    """``parent[key]`` as an array, created empty when missing or null."""
    value = parent.get(key)
    if value is None:
        value = parent[key] = []
    if not isinstance(value, list):
        raise SpecError(f"config.json: {where}{key} must be an array, got {type(value).__name__}")
    return value


def annotations_of(spec: Spec) -> dict[str, Any]:
    return obj(spec, "annotations", "")


def string_annotations(spec: Mapping[str, Any]) -> dict[str, str]:
    """The spec's annotations that are strings (others are ignored: OCI requires strings)."""
    raw = spec.get("annotations")
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}


def set_annotation(spec: Spec, key: str, value: str | None) -> None:
    """Set ``key`` (None removes it)."""
    if value is None:
        raw = spec.get("annotations")
        if isinstance(raw, dict):
            raw.pop(key, None)
        return
    annotations_of(spec)[key] = value


def set_env(spec: Spec, name: str, value: str) -> None:
    """Set ``name=value`` in ``process.env``: the first existing entry is replaced, later duplicates dropped."""
    env = array(obj(spec, "process", ""), "env", "process.")
    prefix = name + "="
    entry = prefix + value
    first = True
    kept: list[Any] = []
    for item in env:
        if isinstance(item, str) and (item.startswith(prefix) or item == name):
            if first:
                kept.append(entry)
                first = False
            continue
        kept.append(item)
    if first:
        kept.append(entry)
    env[:] = kept


def env_names(spec: Mapping[str, Any]) -> set[str]:
    process = spec.get("process")
    env = process.get("env") if isinstance(process, dict) else None
    if not isinstance(env, list):
        return set()
    return {e.split("=", 1)[0] for e in env if isinstance(e, str)}


__all__ = [
    "ContainerIdentity",
    "ContainerKind",
    "Spec",
    "SpecError",
    "annotations_of",
    "array",
    "env_names",
    "obj",
    "set_annotation",
    "set_env",
    "string_annotations",
]
