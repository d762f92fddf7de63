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
  ``restart(wipe=False)`` re-creates only ``kubelet.sock`` (a kubelet that keeps the plugins'
  sockets), ``restart(gap=...)`` leaves the directory without ``kubelet.sock`` for a while;
  :attr:`KubeletDouble.served_at` says when ``kubelet.sock`` last appeared.
* :class:`~spotgpu.testing.podresources.PodResourcesDouble`: the pod-resources API v1 (``List``,
  ``Get``, ``GetAllocatableResources``) serving a table the test sets.
* :class:`~spotgpu.testing.vendorplugin.VendorPluginDouble`: a vendor device plugin such as
  NVIDIA's for ``nvidia.com/gpu``.

Side effects: gRPC servers and client channels on unix sockets, background threads; all are
stopped by ``stop()`` (or the context manager).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc

from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2 as dp
from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from spotgpu.testing.grpcserver import Server

# The other kubelet-side doubles have their own modules; re-exported here for existing callers.

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"


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


class KubeletDouble(Server):
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
        self.served_at = 0.0
        """When ``kubelet.sock`` last appeared (monotonic seconds)."""

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
        except ValueError:  # the channel was closed (a restart) before the stream started
            log.debug("ListAndWatch of %s: channel closed before it started", endpoint.resource)
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
    def restart(self, *, wipe: bool = True, gap: float = 0.0) -> None:
        """Stop and forget every plugin; delete every socket in the plugin directory (as a new
        kubelet does; ``wipe=False``: only ``kubelet.sock``, a kubelet that keeps the plugins'
        sockets); leave ``kubelet.sock`` absent for ``gap`` seconds; serve a fresh one."""
        self.close()
        for entry in self.plugin_dir.iterdir():
            if entry.is_socket() and (wipe or entry == self.socket):
                entry.unlink(missing_ok=True)
        if gap > 0:
            time.sleep(gap)
        self.start()

    def start(self) -> Self:
        super().start()
        self.served_at = time.monotonic()
        return self

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


__all__ = [
    "Admission",
    "AdmissionError",
    "DeviceState",
    "KubeletDouble",
    "Registration",
]
