"""What the DRA driver asks of the Kubernetes API: claims to read, the node's slices to write.

Protocols only; no side effects here. Implemented above the agent by
:class:`spotgpu.kube.dra_port.KubeDraApi` (the real API; the tests run it against the API
double). Errors: :class:`~spotgpu.core.errors.TemporaryError` when retrying may help (5xx,
timeouts, 409 Conflict), :class:`~spotgpu.core.errors.PermanentError` otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from spotgpu.core.ids import NodeName
from spotgpu.dra.claim import DriverName


class DraApi(Protocol):
    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The ResourceClaim as the API has it now (no cache); None when it does not exist."""
        ...

    def node_uid(self, node: NodeName) -> str:
        """The Node object's UID (the slices' owner)."""
        ...

    def list_slices(self, driver: DriverName, node: NodeName) -> Sequence[Mapping[str, Any]]:
        """Our driver's ResourceSlices of ``node`` (field selectors ``spec.driver``, ``spec.nodeName``)."""
        ...

    def create_slice(self, obj: Mapping[str, Any]) -> None: ...

    def update_slice(self, obj: Mapping[str, Any]) -> None:
        """PUT with the object's resourceVersion (409 Conflict when it changed)."""
        ...

    def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        """Delete with UID and resourceVersion preconditions; an object already gone is success."""
        ...


__all__ = ["DraApi"]
