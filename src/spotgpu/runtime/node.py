"""The real node behind the modifier chain's ports: kubelet gRPC, owner records, device nodes, sysfs.

Decides nothing. Side effects: the gRPC calls of :mod:`spotgpu.adapters.kubelet`; ``stat`` and
directory walks of device nodes; reads of ``/sys/devices/system/node/node<N>/cpulist``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from spotgpu.adapters.kubelet import DevicePlugins, PodResourcesView
from spotgpu.core.errors import PermanentError
from spotgpu.core.ids import DeviceID, ResourceName
from spotgpu.core.mapping_cache import Owner
from spotgpu.ports.lookup import Allocation, HostDevice, PodAssignment
from spotgpu.runtime.config import RuntimeConfig

MAX_NODES_PER_PATH: Final = 256
"""A directory a device plugin names may hold at most this many device nodes."""

OwnerOf = Callable[[DeviceID], Owner | None]
LendableOf = Callable[[DeviceID], bool | None]


class KubeletNodeLookup:
    """:class:`~spotgpu.ports.lookup.NodeLookup` on the kubelet's sockets and an owner record.

    ``owner_of`` is the agent's :meth:`MappingCache.get_device_owner` (agent-hosted service) or
    :meth:`spotgpu.runtime.ownerstate.OwnerStateFile.owner_of` (local fallback); ``lendable`` the
    agent's twin health (agent-hosted service; None in the local fallback: unknown).
    """

    def __init__(
        self,
        pod_resources: PodResourcesView,
        plugins: DevicePlugins,
        owner_of: OwnerOf,
        lendable: LendableOf | None = None,
    ) -> None:
        self.pod_resources = pod_resources
        self.plugins = plugins
        self._owner_of = owner_of
        self._lendable = lendable

    @classmethod
    def from_config(
        cls,
        config: RuntimeConfig,
        owner_of: OwnerOf,
        *,
        exclude_sockets: Sequence[str] = (),
        lendable: LendableOf | None = None,
    ) -> KubeletNodeLookup:
        """Clients on the configured sockets; ``exclude_sockets``: our own plugin's socket name."""
        return cls(
            PodResourcesView(config.pod_resources_socket, timeout=config.kubelet_timeout),
            DevicePlugins(
                config.device_plugin_dir,
                sockets=config.device_plugin_sockets,
                probe=config.probe_device_plugins,
                exclude=exclude_sockets,
                timeout=config.kubelet_timeout,
            ),
            owner_of,
            lendable,
        )

    def close(self) -> None:
        self.pod_resources.close()
        self.plugins.close()

    def pod(self, namespace: str, name: str) -> PodAssignment | None:
        return self.pod_resources.pod(namespace, name)

    def device_owner(self, device: DeviceID) -> Owner | None:
        return self._owner_of(device)

    def device_lendable(self, device: DeviceID) -> bool | None:
        return self._lendable(device) if self._lendable is not None else None

    def allocate(self, resource: ResourceName, devices: Sequence[DeviceID]) -> Allocation:
        return self.plugins.allocate(resource, devices)

    def device_numa(self, resource: ResourceName) -> Mapping[DeviceID, tuple[int, ...]]:
        return self.pod_resources.device_numa(resource)


def _host_device(path: str, container_path: str, st: os.stat_result) -> HostDevice:
    return HostDevice(
        container_path,
        "c" if stat.S_ISCHR(st.st_mode) else "b",
        os.major(st.st_rdev),
        os.minor(st.st_rdev),
        stat.S_IMODE(st.st_mode),
        st.st_uid,
        st.st_gid,
    )


def _is_device(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)


class LinuxHost:
    """:class:`~spotgpu.ports.lookup.HostPort` on this machine's ``/dev`` and ``/sys``."""

    def __init__(self, sys_root: Path = Path("/sys")) -> None:
        self.sys_root = sys_root

    def device_nodes(self, host_path: str, container_path: str) -> tuple[HostDevice, ...]:
        try:
            st = os.stat(host_path)
        except OSError as exc:
            raise PermanentError(f"device {host_path}: {exc.strerror}") from None
        if _is_device(st):
            return (_host_device(host_path, container_path, st),)
        if not stat.S_ISDIR(st.st_mode):
            raise PermanentError(f"device {host_path} is neither a device node nor a directory of them")
        found: list[HostDevice] = []
        for root, dirs, files in os.walk(host_path, followlinks=False):
            dirs.sort()
            for name in sorted(files):
                full = os.path.join(root, name)
                try:
                    sub = os.stat(full)
                except OSError:
                    continue
                if _is_device(sub):
                    rel = os.path.relpath(full, host_path)
                    found.append(_host_device(full, os.path.join(container_path, rel), sub))
                    if len(found) > MAX_NODES_PER_PATH:
                        raise PermanentError(f"device directory {host_path} holds more than {MAX_NODES_PER_PATH} nodes")
        return tuple(found)

    def numa_cpus(self, node: int) -> str | None:
        try:
            text = (self.sys_root / "devices" / "system" / "node" / f"node{int(node)}" / "cpulist").read_text()
        except (OSError, ValueError):
            return None
        return text.strip() or None


__all__ = ["MAX_NODES_PER_PATH", "KubeletNodeLookup", "LendableOf", "LinuxHost", "OwnerOf"]
