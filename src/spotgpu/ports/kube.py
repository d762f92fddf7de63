"""The agent's ports: the narrow interfaces through which its decisions reach the world.

Protocols and plain data only; no side effects here. One of the agent's pure modules
(``model``, ``steer``, ``detect``, ``settings``, ``ports``): an import-linter contract keeps
adapters, gRPC, protobuf, Prometheus and NVML out of it and of everything it imports.
Implementations live at the edges:

* :class:`KubePort`: the Kubernetes API (real adapter in :mod:`spotgpu.kube`, an in-memory
  fake in tests, the HTTP API double in the node end-to-end harness).
* :class:`GuardPort`: the return guard (:mod:`spotgpu.guard`), armed while an owner's GPUs
  are lent; it calls the agent's :data:`OwnerBackHandler` when it catches the owner. Both are
  defined in :mod:`spotgpu.ports.guard` (so the guard needs no agent import) and re-exported here.

Contract for every port method: idempotent where the docstring says so, raises
:class:`~spotgpu.core.errors.TemporaryError` for failures worth retrying (connection refused,
timeouts, 409/429/5xx) and :class:`~spotgpu.core.errors.PermanentError` otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from spotgpu.core.ids import NodeName
from spotgpu.core.refs import PodRef
from spotgpu.core.types import EvictionReason


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """One container of a pod as the API reports it."""

    name: str
    container_id: str | None
    """The runtime's ID without the ``containerd://`` scheme; None before it started."""
    requests: Mapping[str, int] = field(default_factory=dict)
    """Extended-resource requests (e.g. ``{"nvidia.com/gpu": 2}``)."""


@dataclass(frozen=True, slots=True)
class PodInfo:
    """The parts of a pod the agent needs."""

    ref: PodRef
    uid: str
    node: NodeName | None
    phase: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    containers: tuple[ContainerInfo, ...] = ()
    deleting: bool = False
    """A deletion timestamp is set."""
    other_container_ids: tuple[str, ...] = ()
    """Runtime IDs of the pod's init containers (native sidecars among them) and ephemeral
    containers, as their statuses report them: they share the pod's fate on an eviction."""

    @property
    def container_ids(self) -> tuple[str, ...]:
        """Every runtime ID the API reports for the pod's containers of any kind."""
        ids = {c.container_id for c in self.containers if c.container_id}
        return tuple(sorted(ids.union(self.other_container_ids)))


class PodEventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True, slots=True)
class PodEvent:
    type: PodEventType
    pod: PodInfo


class KubePort(Protocol):
    """What the agent asks of the Kubernetes API."""

    def patch_node_annotations(self, node: NodeName, annotations: Mapping[str, str | None]) -> None:
        """Merge-patch the node's annotations; ``None`` removes a key. Idempotent."""
        ...

    def delete_pod(self, pod: PodRef, *, reason: EvictionReason, message: str, grace_seconds: int = 0) -> None:
        """Delete a pod, first marking it with a ``DisruptionTarget`` condition carrying ``reason``.

        Idempotent: a pod that is already gone is success.
        """
        ...

    def record_node_event(self, node: NodeName, *, reason: str, message: str) -> None:
        """Record a Warning event about ``node`` (best effort: never raises; repeats within a
        few minutes may be dropped)."""
        ...

    def list_node_pods(self, node: NodeName) -> list[PodInfo]:
        """Every pod bound to ``node``."""
        ...

    def watch_node_pods(self, node: NodeName, handler: Callable[[PodEvent], None], stop: Callable[[], bool]) -> None:
        """Call ``handler`` for each pod change on ``node`` until ``stop()`` is true.

        Blocks; relists and resumes by itself after expired watches or dropped connections.
        """
        ...


__all__ = [
    "ContainerInfo",
    "KubePort",
    "PodEvent",
    "PodEventType",
    "PodInfo",
]
