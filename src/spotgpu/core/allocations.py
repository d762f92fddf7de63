"""What the kubelet allocated: :class:`AllocatedDevices`, one container's devices of one resource.

Plain data, no side effects. The kubelet adapter (:mod:`spotgpu.adapters.kubelet`) produces it
for the agent's :class:`~spotgpu.ports.node.PodResourcesPort`; it lives in the core so
that the adapter, which spotgpu-runtime uses too, imports nothing of the agent (the runtime
must not reach the agent, not even through an adapter: import-linter's layers contract).
"""

from __future__ import annotations

from dataclasses import dataclass

from spotgpu.core.ids import DeviceID, ResourceName
from spotgpu.core.refs import PodRef


@dataclass(frozen=True, slots=True)
class AllocatedDevices:
    """One container's devices of one resource, as the kubelet's pod-resources API reports."""

    pod: PodRef
    container: str
    resource: ResourceName
    device_ids: tuple[DeviceID, ...]


__all__ = ["AllocatedDevices"]
