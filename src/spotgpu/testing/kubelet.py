"""Kubelet-side doubles over real gRPC on unix sockets.

No kubelet can run on a test machine, so these stand in for the parts spotgpu talks to, each
speaking the real wire format (our .proto files, same method paths and field numbers):

* :class:`KubeletDouble`: the kubelet's device manager. Serves ``Registration.Register`` on
  ``<dir>/kubelet.sock``; on a registration it dials the plugin's endpoint and calls
  ``GetDevicePluginOptions`` *before* answering (as the kubelet does, so a plugin that
  registers before serving fails), then keeps a ``ListAndWatch`` stream open and records
  every full device list. :meth:`KubeletDouble.allocate` calls the plugin's ``Allocate`` the
  way container creation does. :meth:`KubeletDouble.admit` chooses the devices the way the
  kubelet's device manager does when it admits a container (healthy and not yet allocated;
  ``GetPreferredAllocation`` first when the plugin's options say it is available; the
  preference taken unless told to ignore it, as a kubelet may) and then calls ``Allocate``.
  :meth:`KubeletDouble.restart` deletes every socket in the directory (as a starting kubelet
  does) and serves a fresh ``kubelet.sock``.
* :class:`PodResourcesDouble`: the pod-resources API v1 (``List``, ``Get``,
  ``GetAllocatableResources``) serving a table the test sets.
* :class:`VendorPluginDouble`: a vendor device plugin such as NVIDIA's for ``nvidia.com/gpu``:
  answers ``Allocate`` with the env, device nodes and mounts of the requested devices, and
  rejects IDs it does not own the way NVIDIA's plugin does.

Side effects: gRPC servers and client channels on unix sockets, background threads; all are
stopped by ``stop()`` (or the context manager).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc

from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2 as dp
from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from spotgpu.adapters.proto import podresources_v1_pb2 as pr
from spotgpu.adapters.proto import podresources_v1_pb2_grpc as pr_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"


class _Server:
    """A gRPC server on one unix socket, as a context manager."""

    def __init__(self, socket: Path, workers: int = 8) -> None:
        self.socket = socket
        self._workers = workers
        self._server: grpc.Server | None = None

    def _add_servicers(self, server: grpc.Server) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._workers))
        self._add_servicers(server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self, grace: float | None = 0) -> None:
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# --- the kubelet's device manager ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceState:
    health: str
    numa_nodes: tuple[int, ...]


@dataclass
class _Endpoint:
    resource: str
    endpoint: str
    options: dp.DevicePluginOptions
    channel: grpc.Channel
    stub: dp_grpc.DevicePluginStub
    devices: dict[str, DeviceState] = field(default_factory=dict)
    updates: int = 0
    stream: Any = None
    thread: threading.Thread | None = None


@dataclass(frozen=True, slots=True)
class Admission:
    """What :meth:`KubeletDouble.admit` did for one container."""

    devices: tuple[str, ...]
    """The IDs allocated, in the order sent to Allocate."""
    preferred: tuple[str, ...] | None
    """The plugin's GetPreferredAllocation answer; None when it was not called."""
    response: dp.ContainerAllocateResponse


class AdmissionError(RuntimeError):
    """The kubelet would fail the pod's admission (too few devices, or a plugin call failed)."""


@dataclass(frozen=True, slots=True)
class Registration:
    resource: str
    endpoint: str
    version: str
    pre_start_required: bool
    get_preferred_allocation_available: bool
    at: float


class KubeletDouble(_Server):
    """The kubelet's side of the device plugin API (see module docstring)."""

    def __init__(self, plugin_dir: Path) -> None:
        super().__init__(plugin_dir / "kubelet.sock")
        self.plugin_dir = plugin_dir
        self._lock = threading.Condition()
        self._endpoints: dict[str, _Endpoint] = {}
        self.registrations: list[Registration] = []
        self.rejections: list[str] = []
        self._allocated: dict[str, set[str]] = {}
        self._admitting = threading.Lock()
        """The kubelet admits one pod at a time."""

    def _add_servicers(self, server: grpc.Server) -> None:
        dp_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self), server)

    # -- registration (called from gRPC threads) --------------------------------------------
    def _register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        if request.version != API_VERSION:
            msg = f"unsupported API version {request.version!r}; supported: {API_VERSION}"
            self.rejections.append(msg)
            context.abort(grpc.StatusCode.UNKNOWN, msg)
        if "/" not in request.resource_name:
            msg = f"invalid extended resource name {request.resource_name!r}"
            self.rejections.append(msg)
            context.abort(grpc.StatusCode.UNKNOWN, msg)
        socket = self.plugin_dir / request.endpoint
        channel = grpc.insecure_channel(f"unix://{socket}")
        stub = dp_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(dp.Empty(), timeout=5)
        except grpc.RpcError as exc:
            channel.close()
            msg = f"failed to get device plugin options from {socket}: {exc.code().name}"
            self.rejections.append(msg)
            context.abort(grpc.StatusCode.UNKNOWN, msg)
        endpoint = _Endpoint(request.resource_name, request.endpoint, options, channel, stub)
        with self._lock:
            old = self._endpoints.get(request.resource_name)
            self._endpoints[request.resource_name] = endpoint
            self.registrations.append(
                Registration(
                    request.resource_name,
                    request.endpoint,
                    request.version,
                    options.pre_start_required,
                    options.get_preferred_allocation_available,
                    time.monotonic(),
                )
            )
            self._lock.notify_all()
        if old is not None:
            self._close_endpoint(old)
        endpoint.thread = threading.Thread(
            target=self._list_and_watch, args=(endpoint,), name=f"lw-{request.resource_name}", daemon=True
        )
        endpoint.thread.start()
        return dp.Empty()

    def _list_and_watch(self, endpoint: _Endpoint) -> None:
        try:
            endpoint.stream = endpoint.stub.ListAndWatch(dp.Empty())
            for response in endpoint.stream:
                devices = {d.ID: DeviceState(d.health, tuple(n.ID for n in d.topology.nodes)) for d in response.devices}
                with self._lock:
                    endpoint.devices = devices
                    endpoint.updates += 1
                    self._lock.notify_all()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                log.debug("ListAndWatch of %s ended: %s", endpoint.resource, exc.code().name)
        finally:
            with self._lock:
                self._lock.notify_all()

    @staticmethod
    def _close_endpoint(endpoint: _Endpoint) -> None:
        if endpoint.stream is not None:
            endpoint.stream.cancel()
        endpoint.channel.close()

    # -- what tests ask ----------------------------------------------------------------------
    def registration_count(self, resource: str) -> int:
        with self._lock:
            return sum(1 for r in self.registrations if r.resource == resource)

    def wait_registered(self, resource: str, count: int = 1, timeout: float = 10.0) -> Registration:
        """Wait until ``resource`` has registered ``count`` times in total; return the last one."""
        with self._lock:
            ok = self._lock.wait_for(lambda: self.registration_count(resource) >= count, timeout)
            if not ok:
                raise TimeoutError(f"{resource} registered {self.registration_count(resource)} times, wanted {count}")
            return [r for r in self.registrations if r.resource == resource][-1]

    def devices(self, resource: str) -> dict[str, DeviceState]:
        with self._lock:
            endpoint = self._endpoints.get(resource)
            return dict(endpoint.devices) if endpoint else {}

    def updates(self, resource: str) -> int:
        with self._lock:
            endpoint = self._endpoints.get(resource)
            return endpoint.updates if endpoint else 0

    def wait_devices(
        self, resource: str, predicate: Callable[[dict[str, DeviceState]], bool], timeout: float = 10.0
    ) -> dict[str, DeviceState]:
        """Wait until the latest ListAndWatch list of ``resource`` satisfies ``predicate``."""
        with self._lock:
            ok = self._lock.wait_for(lambda: predicate(self.devices(resource)), timeout)
            if not ok:
                raise TimeoutError(f"device list of {resource} never matched; last: {self.devices(resource)}")
            return self.devices(resource)

    def healthy(self, resource: str) -> set[str]:
        return {d for d, s in self.devices(resource).items() if s.health == "Healthy"}

    def allocate(self, resource: str, *containers: Sequence[str], timeout: float = 10.0) -> dp.AllocateResponse:
        """Call the plugin's Allocate with one ContainerAllocateRequest per device list."""
        stub = self._stub(resource)
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=list(ids)) for ids in containers]
        )
        response: dp.AllocateResponse = stub.Allocate(request, timeout=timeout)
        return response

    def preferred_allocation(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int, *, timeout: float = 10.0
    ) -> list[str]:
        stub = self._stub(resource)
        request = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available), must_include_deviceIDs=list(must_include), allocation_size=size
                )
            ]
        )
        answer = stub.GetPreferredAllocation(request, timeout=timeout)
        return list(answer.container_responses[0].deviceIDs) if answer.container_responses else []

    def admit(
        self,
        resource: str,
        size: int,
        *,
        must_include: Sequence[str] = (),
        ignore_preference: bool = False,
        timeout: float = 10.0,
    ) -> Admission:
        """Allocate ``size`` devices of ``resource`` to one container as the kubelet's device
        manager does on admission, with no topology hint (topology manager policy ``none``):
        the candidates are the healthy devices not allocated yet (fewer than needed fails the
        admission); when the plugin's options set ``get_preferred_allocation_available``,
        ``GetPreferredAllocation`` is called with them (an error fails the admission, as in
        the kubelet); the preferred IDs among the candidates are taken first, the rest filled
        up in ID order (the kubelet: in map order). ``ignore_preference`` takes the
        non-preferred candidates first instead: a kubelet whose choice differs from the plugin's.
        Then ``Allocate``; on failure the devices are free again. Admissions are serialized."""
        with self._admitting:
            return self._admit(resource, size, must_include, ignore_preference, timeout)

    def _admit(
        self, resource: str, size: int, must_include: Sequence[str], ignore_preference: bool, timeout: float
    ) -> Admission:
        with self._lock:
            endpoint = self._endpoints.get(resource)
            if endpoint is None:
                raise AdmissionError(f"can't allocate unregistered device {resource}")
            healthy = {d for d, s in endpoint.devices.items() if s.health == "Healthy"}
            taken = self._allocated.setdefault(resource, set())
            available = sorted((healthy - taken) | set(must_include))
            if len(available) < size:
                raise AdmissionError(
                    f"requested number of devices unavailable for {resource}. Requested: {size}, "
                    f"Available: {len(available)}"
                )
            options = endpoint.options
        preferred: tuple[str, ...] | None = None
        if options.get_preferred_allocation_available:
            try:
                preferred = tuple(self.preferred_allocation(resource, available, must_include, size, timeout=timeout))
            except grpc.RpcError as exc:
                raise AdmissionError(f"device plugin GetPreferredAllocation rpc failed with err: {exc}") from exc
        liked = [d for d in preferred or () if d in available]
        others = [d for d in available if d not in liked]
        order = [*others, *liked] if ignore_preference else [*liked, *others]
        chosen = tuple(dict.fromkeys([*must_include, *order]))[:size]
        with self._lock:
            self._allocated.setdefault(resource, set()).update(chosen)
        try:
            response = self.allocate(resource, chosen, timeout=timeout)
        except grpc.RpcError:
            self.release(resource, chosen)
            raise
        return Admission(chosen, preferred, response.container_responses[0])

    def release(self, resource: str, devices: Sequence[str]) -> None:
        """The container's pod ended: its devices may be allocated again."""
        with self._lock:
            self._allocated.get(resource, set()).difference_update(devices)

    def allocated(self, resource: str) -> set[str]:
        with self._lock:
            return set(self._allocated.get(resource, ()))

    def _stub(self, resource: str) -> dp_grpc.DevicePluginStub:
        with self._lock:
            endpoint = self._endpoints.get(resource)
        if endpoint is None:
            raise LookupError(f"no device plugin registered for {resource}")
        return endpoint.stub

    # -- kubelet restart -----------------------------------------------------------------------
    def restart(self) -> None:
        """Stop, delete every socket in the plugin directory (as a new kubelet does), serve again."""
        self.stop()
        with self._lock:
            endpoints = list(self._endpoints.values())
            self._endpoints.clear()
        for endpoint in endpoints:
            self._close_endpoint(endpoint)
        for entry in self.plugin_dir.iterdir():
            if entry.is_socket():
                entry.unlink(missing_ok=True)
        self.start()

    def stop(self, grace: float | None = 0) -> None:
        super().stop(grace)

    def close(self) -> None:
        """Stop serving and drop every plugin connection."""
        self.stop()
        with self._lock:
            endpoints = list(self._endpoints.values())
            self._endpoints.clear()
        for endpoint in endpoints:
            self._close_endpoint(endpoint)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _RegistrationServicer(dp_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: KubeletDouble) -> None:
        self._kubelet = kubelet

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        return self._kubelet._register(request, context)


# --- pod-resources ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    resource: str
    device_ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...] = ()
    cpu_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PodResources:
    namespace: str
    name: str
    containers: tuple[ContainerResources, ...] = ()


def _topology(nodes: Sequence[int]) -> pr.TopologyInfo | None:
    return pr.TopologyInfo(nodes=[pr.NUMANode(ID=n) for n in nodes]) if nodes else None


def _pod_message(pod: PodResources) -> pr.PodResources:
    return pr.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=[
            pr.ContainerResources(
                name=c.name,
                cpu_ids=list(c.cpu_ids),
                devices=[
                    pr.ContainerDevices(
                        resource_name=d.resource, device_ids=list(d.device_ids), topology=_topology(d.numa_nodes)
                    )
                    for d in c.devices
                ],
            )
            for c in pod.containers
        ],
    )


class PodResourcesDouble(_Server):
    """The kubelet's pod-resources API v1 on ``socket`` (see module docstring).

    ``get_enabled=False`` behaves like a kubelet older than 1.34 without the
    ``KubeletPodResourcesGet`` gate: ``Get`` fails and clients must fall back to ``List``.
    """

    def __init__(self, socket: Path, *, get_enabled: bool = True) -> None:
        super().__init__(socket)
        self.get_enabled = get_enabled
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], PodResources] = {}
        self._allocatable: list[ContainerDevices] = []
        self.calls: dict[str, int] = {"List": 0, "Get": 0, "GetAllocatableResources": 0}

    def _add_servicers(self, server: grpc.Server) -> None:
        pr_grpc.add_PodResourcesListerServicer_to_server(_PodResourcesServicer(self), server)

    def set_pods(self, pods: Sequence[PodResources]) -> None:
        with self._lock:
            self._pods = {(p.namespace, p.name): p for p in pods}

    def upsert_pod(self, pod: PodResources) -> None:
        with self._lock:
            self._pods[(pod.namespace, pod.name)] = pod

    def remove_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            self._pods.pop((namespace, name), None)

    def set_allocatable(self, devices: Sequence[ContainerDevices]) -> None:
        with self._lock:
            self._allocatable = list(devices)

    def pods(self) -> list[PodResources]:
        with self._lock:
            return list(self._pods.values())

    def _count(self, method: str) -> None:
        with self._lock:
            self.calls[method] += 1


class _PodResourcesServicer(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, double: PodResourcesDouble) -> None:
        self._d = double

    def List(self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext) -> pr.ListPodResourcesResponse:
        self._d._count("List")
        return pr.ListPodResourcesResponse(pod_resources=[_pod_message(p) for p in self._d.pods()])

    def Get(self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext) -> pr.GetPodResourcesResponse:
        self._d._count("Get")
        if not self._d.get_enabled:
            context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled via feature gate")
        for pod in self._d.pods():
            if pod.namespace == request.pod_namespace and pod.name == request.pod_name:
                return pr.GetPodResourcesResponse(pod_resources=_pod_message(pod))
        context.abort(grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} not found in namespace {request.pod_namespace}")
        raise AssertionError("unreachable")  # abort raises

    def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        self._d._count("GetAllocatableResources")
        with self._d._lock:
            devices = list(self._d._allocatable)
        return pr.AllocatableResourcesResponse(
            devices=[
                pr.ContainerDevices(
                    resource_name=d.resource, device_ids=list(d.device_ids), topology=_topology(d.numa_nodes)
                )
                for d in devices
            ]
        )


# --- a vendor device plugin (the real GPUs' plugin) ------------------------------------------


@dataclass(frozen=True, slots=True)
class VendorDevice:
    """One real device of the vendor plugin: its ID, host device node and NUMA node."""

    id: str
    host_path: str
    container_path: str
    numa: int | None = None


class VendorPluginDouble(_Server):
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


def socket_exists(path: Path) -> bool:
    try:
        return path.is_socket()
    except OSError:
        return False


def wait_for_socket(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if socket_exists(path):
            return
        time.sleep(0.01)
    raise TimeoutError(f"socket {path} did not appear within {timeout}s (exists: {os.path.exists(path)})")


__all__ = [
    "Admission",
    "AdmissionError",
    "ContainerDevices",
    "ContainerResources",
    "DeviceState",
    "KubeletDouble",
    "PodResources",
    "PodResourcesDouble",
    "Registration",
    "VendorDevice",
    "VendorPluginDouble",
    "socket_exists",
    "wait_for_socket",
]
