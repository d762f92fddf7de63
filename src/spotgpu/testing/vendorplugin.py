"""A vendor device plugin (such as NVIDIA's for ``nvidia.com/gpu``) as a protocol-level double
over real gRPC on a unix socket: ``Allocate`` answers with env, device nodes and mounts and
rejects IDs it does not own the way NVIDIA's plugin does. Side effects: a gRPC server, threads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2 as dp
from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from spotgpu.testing.grpcserver import Server

API_VERSION = "v1beta1"


@dataclass(frozen=True, slots=True)
class VendorDevice:
    """One real device of the vendor plugin: its ID, host device node and NUMA node."""

    id: str
    host_path: str
    container_path: str
    numa: int | None = None


class VendorPluginDouble(Server):
    """An NVIDIA-like device plugin for ``resource`` on ``<plugin_dir>/<socket_name>``.

    ``Allocate`` answers each container request with ``NVIDIA_VISIBLE_DEVICES`` (or
    ``env_name``) listing the IDs, one ``DeviceSpec`` per device (``rw``), the extra ``mounts``,
    and ``annotations``; an unknown ID fails the call with NVIDIA's message. ``cdi_devices`` adds
    each device's CDI name (``nvidia.com/gpu=<id>``); ``cdi_only`` answers with the CDI names
    alone (NVIDIA's plugin with ``DEVICE_LIST_STRATEGY=cdi-cri``). ``register`` sends
    a registration to the kubelet double, as a real plugin does.
    """

    def __init__(
        self,
        plugin_dir: Path,
        resource: str,
        devices: Sequence[VendorDevice],
        *,
        socket_name: str | None = None,
        env_name: str = "NVIDIA_VISIBLE_DEVICES",
        mounts: Sequence[tuple[str, str, bool]] = (),
        annotations: Mapping[str, str] | None = None,
        cdi_devices: bool = False,
        cdi_only: bool = False,
        extra_devices: Sequence[tuple[str, str]] = (),
    ) -> None:
        domain, _, short = resource.partition("/")
        name = socket_name or f"{domain.partition('.')[0]}-{short}.sock"
        super().__init__(plugin_dir / name)
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.devices = {d.id: d for d in devices}
        self.env_name = env_name
        self.mounts = list(mounts)
        self.annotations = dict(annotations or {})
        self.cdi_devices = cdi_devices or cdi_only
        self.cdi_only = cdi_only
        self.extra_devices = list(extra_devices)
        """(container path, host path) given with every allocation (NVIDIA's control devices)."""
        self.allocate_calls: list[list[list[str]]] = []
        self._lock = threading.Lock()

    def _add_servicers(self, server: grpc.Server) -> None:
        dp_grpc.add_DevicePluginServicer_to_server(_VendorServicer(self), server)

    def register(self, kubelet_socket: Path | None = None) -> None:
        target = kubelet_socket or (self.plugin_dir / "kubelet.sock")
        with grpc.insecure_channel(f"unix://{target}") as channel:
            dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket.name,
                    resource_name=self.resource,
                    options=dp.DevicePluginOptions(get_preferred_allocation_available=False),
                ),
                timeout=10,
            )

    def cdi_name(self, device_id: str) -> str:
        """The fully qualified CDI name of a device (``<vendor>/<class>=<id>``, the resource's)."""
        return f"{self.resource}={device_id}"

    def container_response(self, ids: Sequence[str]) -> dp.ContainerAllocateResponse:
        unknown = [i for i in ids if i not in self.devices]
        if unknown:
            raise KeyError(f'invalid allocation request for "{self.resource}": unknown device: {unknown[0]}')
        cdi = [dp.CDIDevice(name=self.cdi_name(i)) for i in ids] if self.cdi_devices else []
        if self.cdi_only:
            return dp.ContainerAllocateResponse(cdi_devices=cdi)
        return dp.ContainerAllocateResponse(
            cdi_devices=cdi,
            envs={self.env_name: ",".join(ids)},
            devices=[
                dp.DeviceSpec(
                    container_path=self.devices[i].container_path, host_path=self.devices[i].host_path, permissions="rw"
                )
                for i in ids
            ]
            + [dp.DeviceSpec(container_path=c, host_path=h, permissions="rw") for c, h in self.extra_devices],
            mounts=[dp.Mount(container_path=c, host_path=h, read_only=ro) for c, h, ro in self.mounts],
            annotations=self.annotations,
        )


class _VendorServicer(dp_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, plugin: VendorPluginDouble) -> None:
        self._p = plugin

    def GetDevicePluginOptions(self, request: dp.Empty, context: grpc.ServicerContext) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions()

    def ListAndWatch(self, request: dp.Empty, context: grpc.ServicerContext) -> Iterator[dp.ListAndWatchResponse]:
        yield dp.ListAndWatchResponse(
            devices=[
                dp.Device(
                    ID=d.id,
                    health="Healthy",
                    topology=dp.TopologyInfo(nodes=[dp.NUMANode(ID=d.numa)]) if d.numa is not None else None,
                )
                for d in self._p.devices.values()
            ]
        )
        stop = threading.Event()
        context.add_callback(stop.set)
        stop.wait()

    def Allocate(self, request: dp.AllocateRequest, context: grpc.ServicerContext) -> dp.AllocateResponse:
        requested = [list(c.devices_ids) for c in request.container_requests]
        with self._p._lock:
            self._p.allocate_calls.append(requested)
        try:
            return dp.AllocateResponse(container_responses=[self._p.container_response(ids) for ids in requested])
        except KeyError as exc:
            context.abort(grpc.StatusCode.UNKNOWN, str(exc.args[0]))
            raise AssertionError("unreachable") from None

    def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()


__all__ = ["VendorDevice", "VendorPluginDouble"]
