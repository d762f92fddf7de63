"""The services the agent hosts: spotgpu-runtime's (or NRI mode's) and the twin host (DRA).

Protocols only; no side effects. The agent starts and stops them and hands them what it
publishes; they are built around the agent's lookups (the factories in
:mod:`spotgpu.agent.service`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from spotgpu.core.ids import DeviceID, ResourceName
from spotgpu.core.types import Health


class RuntimeHost(Protocol):
    """spotgpu-runtime's service as the agent hosts it: :class:`~spotgpu.runtime.service.RuntimeService`, or
    in NRI mode :class:`spotgpu.nri.service.NriRuntimeService`."""

    def start(self) -> object: ...

    def stop(self) -> None: ...

    def counts(self) -> dict[str, int]: ...

    def status(self) -> dict[str, Any]: ...


class TwinHost(Protocol):
    """What receives every twin list the agent publishes besides its device plugins: in
    ``agent.mode: dra`` the DRA driver (:class:`spotgpu.dra.host.DraHost`)."""

    def twins_changed(self, resource: ResourceName, twins: Sequence[tuple[DeviceID, Health, int | None]]) -> None:
        """Called under the solver's lock: record and return."""
        ...

    def start(self) -> object: ...

    def stop(self) -> None: ...


__all__ = ["RuntimeHost", "TwinHost"]
