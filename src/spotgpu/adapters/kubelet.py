"""Kubelet clients: the pod-resources API, and other device plugins' ``Allocate`` for device sync.

Decides nothing. Side effects: gRPC calls on unix sockets (the kubelet's pod-resources socket;
device plugin sockets under the device-plugins directory), a ``stat`` and directory listing of
that directory when a plugin's socket must be found.

* :class:`PodResourcesView`: the one pod-resources v1 client of the node side. For
  spotgpu-runtime's service: one pod's device assignments through ``Get`` (kubelet >= 1.34, or
  the ``KubeletPodResourcesGet`` gate), falling back to ``List`` when ``Get`` is unimplemented
  or disabled (remembered, so the next call goes to ``List`` directly), and the node's
  allocatable devices with their NUMA topology. For the agent
  (:class:`~spotgpu.ports.node.PodResourcesPort`): every active pod's assignments as
  :class:`~spotgpu.core.allocations.AllocatedDevices` rows (``List``). Mount the socket's
  *directory* (a kubelet restart re-creates the socket; protocols.md 2.3); the kubelet
  rate-limits the API to 100 calls/s (burst 10), far above what the agent (one ``List`` per
  detection cycle and per Allocate cache miss) and the runtime (two calls per sync) make.
* :class:`DevicePlugins`: calls the ``Allocate`` of the device plugin serving a resource.
  The kubelet keeps no public record of which socket serves which resource, so the socket is
  found, in order: (1) an explicit ``resource -> socket file`` map (configuration); (2) the
  conventional name ``<first label of the vendor domain>-<name>.sock`` (NVIDIA's plugin serves
  ``nvidia.com/gpu`` on ``nvidia-gpu.sock``); (3) if probing is on, each other socket in the
  directory is asked for its device list (``ListAndWatch``: read the first full list, then
  cancel) and the one listing all wanted IDs wins. The answer is cached per socket inode, so a
  plugin restart (new socket) is probed again. Probing opens one extra ``ListAndWatch`` stream
  on each probed plugin per plugin restart; NVIDIA's plugin shares one health channel among its
  streams, so a probe stream that the plugin has not yet noticed is cancelled can swallow one
  health event. Configure the explicit map on nodes where that matters (docs/runtime.md).

Errors: :class:`~spotgpu.core.errors.TemporaryError` for a socket that is down, a deadline or
the kubelet's rate limit; :class:`~spotgpu.core.errors.PermanentError` for a plugin that refuses
the IDs or an unknown resource.
"""

from __future__ import annotations

import builtins
import logging
import os
import stat
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import grpc

from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2 as dp
from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from spotgpu.adapters.proto import podresources_v1_pb2 as pr
from spotgpu.adapters.proto import podresources_v1_pb2_grpc as pr_grpc
from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.errors import PermanentError, TemporaryError, ValidationError
from spotgpu.core.ids import DeviceID, ResourceName
from spotgpu.core.refs import PodRef
from spotgpu.ports.lookup import (
    Allocation,
    ContainerAssignment,
    DeviceGroup,
    DeviceNodeSpec,
    MountSpec,
    PodAssignment,
)

log = logging.getLogger(__name__)

KUBELET_SOCKET: Final = "kubelet.sock"
LOCAL_CHANNEL_OPTIONS: Final = (("grpc.min_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000))
"""The kubelet re-creates its sockets when it restarts: reconnect within a second, not gRPC's default
minutes of backoff. Pod-resources calls also wait for the connection (``wait_for_ready``) up to
their deadline, so a call made during a kubelet restart waits for the new socket instead of
failing at once."""
_TEMPORARY_CODES: Final = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
    }
)


def rpc_error(what: str, exc: grpc.RpcError) -> TemporaryError | PermanentError:
    """The spotgpu error for a failed call: temporary for transport and rate-limit codes."""
    code = exc.code()
    text = f"{what}: {code.name if code else 'UNKNOWN'}: {exc.details()}"
    return TemporaryError(text) if code in _TEMPORARY_CODES else PermanentError(text)


def _numa(topology: pr.TopologyInfo | dp.TopologyInfo) -> tuple[int, ...]:
    return tuple(sorted({int(n.ID) for n in topology.nodes}))


def pod_assignment(message: pr.PodResources) -> PodAssignment:
    """Our plain-data form of a pod-resources ``PodResources`` message."""
    return PodAssignment(
        message.namespace,
        message.name,
        tuple(
            ContainerAssignment(
                c.name,
                tuple(
                    DeviceGroup(
                        ResourceName(d.resource_name), tuple(DeviceID(i) for i in d.device_ids), _numa(d.topology)
                    )
                    for d in c.devices
                ),
            )
            for c in message.containers
        ),
    )


def allocation(message: dp.ContainerAllocateResponse) -> Allocation:
    """Our plain-data form of a ``ContainerAllocateResponse``."""
    return Allocation(
        envs=tuple(sorted(message.envs.items())),
        mounts=tuple(MountSpec(m.container_path, m.host_path, m.read_only) for m in message.mounts),
        devices=tuple(DeviceNodeSpec(d.container_path, d.host_path, d.permissions) for d in message.devices),
        annotations=tuple(sorted(message.annotations.items())),
        cdi_devices=tuple(c.name for c in message.cdi_devices),
    )


class PodResourcesView:
    """The kubelet's pod-resources API v1 on ``socket`` (see the module docstring)."""

    def __init__(self, socket: Path, *, timeout: float = 5.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self._channel = grpc.insecure_channel(f"unix://{socket}", options=LOCAL_CHANNEL_OPTIONS)
        self._stub = pr_grpc.PodResourcesListerStub(self._channel)
        self._get_works: bool | None = None
        """None until a Get call showed whether the kubelet serves Get."""

    def close(self) -> None:
        self._channel.close()

    def _error(self, call: str, exc: grpc.RpcError) -> TemporaryError | PermanentError:
        where = f"pod-resources {call} on {self.socket}"
        if not self.socket.exists():
            where += " (no such socket: is the kubelet running, and its pod-resources directory mounted?)"
        return rpc_error(where, exc)

    def pod(self, namespace: str, name: str) -> PodAssignment | None:
        """One pod's assignments; None when the kubelet has no such active pod."""
        if self._get_works is not False:
            try:
                response = self._stub.Get(
                    pr.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace),
                    timeout=self.timeout,
                    wait_for_ready=True,
                )
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details() or ""
                if code in _TEMPORARY_CODES:
                    raise self._error(f"Get {namespace}/{name}", exc) from None
                if code == grpc.StatusCode.UNIMPLEMENTED or "disabled via feature gate" in details:
                    log.info("pod-resources Get is not served by this kubelet (%s); using List", details or code.name)
                    self._get_works = False
                # Anything else (e.g. "pod ... not found"): List has the authoritative answer.
            else:
                self._get_works = True
                return pod_assignment(response.pod_resources)
        for pod in self.list_pods():
            if pod.namespace == namespace and pod.name == name:
                return pod
        return None

    def list_pods(self, timeout: float | None = None) -> list[PodAssignment]:
        """Every active pod's assignments (pod-resources ``List``)."""
        try:
            response = self._stub.List(
                pr.ListPodResourcesRequest(), timeout=timeout or self.timeout, wait_for_ready=True
            )
        except grpc.RpcError as exc:
            raise self._error("List", exc) from None
        return [pod_assignment(p) for p in response.pod_resources]

    def allocatable(self) -> list[DeviceGroup]:
        """Every allocatable device group with its NUMA nodes (``GetAllocatableResources``)."""
        try:
            response = self._stub.GetAllocatableResources(
                pr.AllocatableResourcesRequest(), timeout=self.timeout, wait_for_ready=True
            )
        except grpc.RpcError as exc:
            raise self._error("GetAllocatableResources", exc) from None
        return [
            DeviceGroup(ResourceName(d.resource_name), tuple(DeviceID(i) for i in d.device_ids), _numa(d.topology))
            for d in response.devices
        ]

    def device_numa(self, resource: ResourceName) -> dict[DeviceID, tuple[int, ...]]:
        return {i: g.numa_nodes for g in self.allocatable() if g.resource == resource for i in g.ids}

    def list(self, timeout: float | None = None) -> builtins.list[AllocatedDevices]:
        """Every active pod's device assignments, one row per container and resource (the
        agent's :class:`~spotgpu.ports.node.PodResourcesPort`). Pods whose names are not
        valid references are skipped with a warning; they cannot hold our devices."""
        rows: builtins.list[AllocatedDevices] = []
        for pod in self.list_pods(timeout):
            try:
                ref = PodRef(pod.namespace, pod.name)
            except ValidationError as exc:
                log.warning("pod-resources: skipping pod %s/%s: %s", pod.namespace, pod.name, exc)
                continue
            for container in pod.containers:
                rows.extend(AllocatedDevices(ref, container.name, g.resource, g.ids) for g in container.devices)
        return rows


def conventional_socket(resource: str) -> str:
    """NVIDIA's naming: ``nvidia.com/gpu`` -> ``nvidia-gpu.sock``."""
    domain, _, name = resource.partition("/")
    return f"{domain.split('.', 1)[0]}-{name}.sock"


def _inode(path: Path) -> int | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino if stat.S_ISSOCK(st.st_mode) else None


class DevicePlugins:
    """Finds the device plugin serving a resource and calls its ``Allocate`` (module docstring)."""

    def __init__(
        self,
        plugin_dir: Path,
        *,
        sockets: Mapping[str, str] | None = None,
        probe: bool = True,
        exclude: Sequence[str] = (),
        timeout: float = 5.0,
        probe_timeout: float = 2.0,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.sockets = dict(sockets or {})
        self.probe = probe
        self.exclude = frozenset((KUBELET_SOCKET, *exclude))
        self.timeout = timeout
        self.probe_timeout = probe_timeout
        self._lock = threading.Lock()
        self._found: dict[str, tuple[Path, int]] = {}
        """resource -> (socket, inode) found by probing."""
        self._channels: dict[tuple[Path, int], grpc.Channel] = {}

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()

    def _channel(self, socket: Path, inode: int) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get((socket, inode))
            if channel is None:
                for key in [k for k in self._channels if k[0] == socket]:  # the plugin restarted
                    self._channels.pop(key).close()
                channel = self._channels[(socket, inode)] = grpc.insecure_channel(
                    f"unix://{socket}", options=LOCAL_CHANNEL_OPTIONS
                )
            return channel

    def socket_for(self, resource: str, devices: Sequence[str]) -> tuple[Path, int]:
        """The socket (and its inode) of ``resource``'s plugin; raise when none is found."""
        explicit = self.sockets.get(resource)
        if explicit is not None:
            path = self.plugin_dir / explicit
            inode = _inode(path)
            if inode is None:
                raise TemporaryError(
                    f"device plugin socket {path} of {resource} (runtime.devicePluginSockets) is not there"
                )
            return path, inode
        path = self.plugin_dir / conventional_socket(resource)
        inode = _inode(path)
        if inode is not None and path.name not in self.exclude:
            return path, inode
        if not self.probe:
            raise TemporaryError(
                f"no device plugin socket for {resource}: {path} is not there and probing is off "
                "(set runtime.devicePluginSockets)"
            )
        with self._lock:
            cached = self._found.get(resource)
        if cached is not None and _inode(cached[0]) == cached[1]:
            return cached
        return self._probe(resource, devices)

    def _probe(self, resource: str, devices: Sequence[str]) -> tuple[Path, int]:
        wanted = set(devices)
        try:
            entries = sorted(self.plugin_dir.iterdir())
        except OSError as exc:
            raise TemporaryError(f"cannot list device plugin directory {self.plugin_dir}: {exc.strerror}") from None
        for path in entries:
            inode = _inode(path)
            if inode is None or path.name in self.exclude:
                continue
            listed = self._list_devices(path, inode)
            if listed is not None and wanted <= listed:
                log.info("device plugin for %s found by probing: %s", resource, path)
                with self._lock:
                    self._found[resource] = (path, inode)
                return path, inode
        raise TemporaryError(
            f"no device plugin in {self.plugin_dir} lists {resource} devices {', '.join(sorted(wanted))} "
            "(set runtime.devicePluginSockets)"
        )

    def _list_devices(self, socket: Path, inode: int) -> set[str] | None:
        stub = dp_grpc.DevicePluginStub(self._channel(socket, inode))
        stream = stub.ListAndWatch(dp.Empty(), timeout=self.probe_timeout)
        try:
            first = next(iter(stream))
        except (grpc.RpcError, StopIteration) as exc:
            log.debug("probing %s: %s", socket, exc)
            return None
        finally:
            stream.cancel()
        return {d.ID for d in first.devices}

    def allocate(self, resource: ResourceName, devices: Sequence[DeviceID]) -> Allocation:
        """``Allocate`` of ``resource``'s plugin for ``devices`` as one container request."""
        socket, inode = self.socket_for(resource, devices)
        stub = dp_grpc.DevicePluginStub(self._channel(socket, inode))
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=list(devices))])
        try:
            response = stub.Allocate(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise rpc_error(f"Allocate of {resource} devices {', '.join(devices)} on {socket}", exc) from None
        if len(response.container_responses) != 1:
            raise PermanentError(
                f"Allocate on {socket} answered {len(response.container_responses)} container responses for one request"
            )
        return allocation(response.container_responses[0])


__all__ = [
    "DevicePlugins",
    "PodResourcesView",
    "allocation",
    "conventional_socket",
    "pod_assignment",
    "rpc_error",
]
