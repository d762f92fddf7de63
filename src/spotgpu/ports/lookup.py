"""What the modifier chain asks of the node: the kubelet's device view, device plugins, owners, host.

Protocols and plain data only; no side effects here. Used by :mod:`spotgpu.runtime`; it lives in
:mod:`spotgpu.ports`, below both the runtime and :mod:`spotgpu.adapters.kubelet` (which returns
these types), so the adapter never imports the runtime. Implementations:

* :class:`NodeLookup`: :class:`spotgpu.runtime.node.KubeletNodeLookup` (kubelet pod-resources
  and device plugins over gRPC, owners from the agent's MappingCache or its state file), and
  in-memory fakes in tests.
* :class:`HostPort`: :class:`spotgpu.runtime.node.LinuxHost` (``stat`` of device nodes, NUMA
  CPU lists from sysfs).

Errors: implementations raise :class:`~spotgpu.core.errors.TemporaryError` for failures that
may pass (kubelet socket down, rate limit, timeout) and
:class:`~spotgpu.core.errors.PermanentError` otherwise (a device plugin refusing the IDs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from spotgpu.core.ids import DeviceID, ResourceName
from spotgpu.core.mapping_cache import Owner


@dataclass(frozen=True, slots=True)
class DeviceGroup:
    """Devices of one resource held by one container, with their NUMA nodes (pod-resources ``ContainerDevices``)."""

    resource: ResourceName
    ids: tuple[DeviceID, ...]
    numa_nodes: tuple[int, ...] = ()
    """Empty when the kubelet reports no topology."""


@dataclass(frozen=True, slots=True)
class ContainerAssignment:
    """One container's devices as the kubelet allocated them."""

    name: str
    devices: tuple[DeviceGroup, ...] = ()

    def ids(self, resource: str) -> tuple[DeviceID, ...]:
        """Every device of ``resource`` this container holds, in the kubelet's order."""
        return tuple(i for g in self.devices if g.resource == resource for i in g.ids)

    def numa_of(self, resource: str, device: str) -> tuple[int, ...]:
        for group in self.devices:
            if group.resource == resource and device in group.ids:
                return group.numa_nodes
        return ()


@dataclass(frozen=True, slots=True)
class PodAssignment:
    """One pod's containers and their devices (pod-resources ``PodResources``)."""

    namespace: str
    name: str
    containers: tuple[ContainerAssignment, ...] = ()

    def container(self, name: str) -> ContainerAssignment | None:
        return next((c for c in self.containers if c.name == name), None)


@dataclass(frozen=True, slots=True)
class MountSpec:
    """A device plugin's ``Mount``."""

    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class DeviceNodeSpec:
    """A device plugin's ``DeviceSpec``: a host device node (or a directory of them)."""

    container_path: str
    host_path: str
    permissions: str = "rwm"


@dataclass(frozen=True, slots=True)
class Allocation:
    """A device plugin's ``ContainerAllocateResponse`` for one request."""

    envs: tuple[tuple[str, str], ...] = ()
    """Sorted by name."""
    mounts: tuple[MountSpec, ...] = ()
    devices: tuple[DeviceNodeSpec, ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    """Sorted by key."""
    cdi_devices: tuple[str, ...] = ()
    """Fully qualified CDI device names (``vendor.com/class=name``)."""


@dataclass(frozen=True, slots=True)
class HostDevice:
    """A device node as it must appear in the container (``linux.devices`` entry)."""

    container_path: str
    type: str
    """``c`` or ``b``."""
    major: int
    minor: int
    file_mode: int
    """Permission bits of the host node."""
    uid: int
    gid: int


class NodeLookup(Protocol):
    """The node's view of devices: who holds what, who owns what, and how to expose it."""

    def pod(self, namespace: str, name: str) -> PodAssignment | None:
        """The pod's device assignments (pod-resources ``Get`` or ``List``); None: no such active pod."""
        ...

    def device_owner(self, device: DeviceID) -> Owner | None:
        """The owner the agent recorded for real ``device`` (a container or IDLE_SPACE); None if unknown."""
        ...

    def device_lendable(self, device: DeviceID) -> bool | None:
        """Whether real ``device`` may be given to spot work *now* (its twin is Healthy: unallocated,
        held by a ShadowPod, or its owner is lent out); None when unknown (no agent to ask)."""
        ...

    def allocate(self, resource: ResourceName, devices: Sequence[DeviceID]) -> Allocation:
        """The answer of ``resource``'s device plugin ``Allocate`` for ``devices`` (one container request)."""
        ...

    def device_numa(self, resource: ResourceName) -> Mapping[DeviceID, tuple[int, ...]]:
        """NUMA nodes of every allocatable device of ``resource`` (pod-resources ``GetAllocatableResources``)."""
        ...


class HostPort(Protocol):
    """Facts about the host the spec is for."""

    def device_nodes(self, host_path: str, container_path: str) -> tuple[HostDevice, ...]:
        """The device node at ``host_path`` (symlinks followed), or every node under a directory.

        Raises :class:`~spotgpu.core.errors.PermanentError` when the path is missing or not a device.
        """
        ...

    def numa_cpus(self, node: int) -> str | None:
        """The CPU list (``0-7,16-23``) of NUMA node ``node``; None when unknown."""
        ...


__all__ = [
    "Allocation",
    "ContainerAssignment",
    "DeviceGroup",
    "DeviceNodeSpec",
    "HostDevice",
    "HostPort",
    "MountSpec",
    "NodeLookup",
    "PodAssignment",
]
