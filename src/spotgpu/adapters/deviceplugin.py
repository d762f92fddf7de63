"""The ``platform/spot-gpu`` device plugin: kubelet device plugin API v1beta1 over a unix socket.

Decides nothing itself: the twin list and health come from the agent (:meth:`set_devices`),
and Allocate's answer from a callable the agent supplies. Side effects: a gRPC server on
``<device_plugin_dir>/<socket_name>``, a gRPC client call to the kubelet's ``kubelet.sock``
(Register), and a watcher thread that stats both sockets.

Life cycle (protocols.md 1.5/1.6, the order real kubelets require):

1. serve on a fresh socket, 2. Register with the kubelet (which dials us back and calls
   GetDevicePluginOptions before answering), 3. stream the full device list on ListAndWatch
   at once and again on every change.
4. A starting kubelet deletes every socket in the directory, ours included: the watcher sees
   our socket gone, stops the old server, serves on a fresh socket and registers again. A
   kubelet that restarts without deleting our socket only re-creates ``kubelet.sock``: the
   watcher registers again whenever it sees ``kubelet.sock`` missing, or a different file there
   than the one it registered with. A file is known by device, inode *and* change time
   (nanoseconds), because a re-created socket may get the freed inode number back.
   While ``kubelet.sock`` is missing the watcher looks every ``watch_interval`` (no backoff: a
   ``stat`` is cheap) and registers as soon as it is back; only failing Register calls back
   off, to at most :data:`MAX_REGISTER_BACKOFF`.
5. :meth:`stop` ends every ListAndWatch stream, stops the server and removes our socket.

Allocate: each ContainerAllocateRequest is answered with the annotations the agent's
callable returns (the unsuffixed ``container-devices-from`` annotation); a refused twin
fails the whole call with the reason and re-sends the device list, as the API asks.

GetPreferredAllocation (advertised in the options only when the agent supplies a callable):
each ContainerPreferredAllocationRequest is answered with the IDs the callable prefers, kept to
the offered ones (``available`` and ``must_include``) and to ``allocation_size``. It never
fails: the kubelet fails the pod's admission when this call does, so a callable that raises is
logged and answered with no preference (the kubelet then chooses itself and Allocate still
checks what it chose).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import grpc

from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2 as dp
from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from spotgpu.core.errors import PermanentError
from spotgpu.core.types import Health

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
MAX_SOCKET_PATH = 107
"""Longest unix socket path (``sun_path`` holds 108 bytes with the terminating NUL)."""
MAX_REGISTER_BACKOFF = 1.0
"""Longest wait between two failing Register calls while ``kubelet.sock`` exists (seconds)."""

FileIdentity = tuple[int, int, int]
"""``(st_dev, st_ino, st_ctime_ns)``: which file a path names."""


@dataclass(frozen=True, slots=True)
class TwinDevice:
    id: str
    health: Health
    numa_node: int | None = None


AllocateFn = Callable[[Sequence[str]], dict[str, str]]
PreferredFn = Callable[[Sequence[str], Sequence[str], int], Sequence[str]]
"""``(available, must_include, allocation_size) -> preferred IDs`` for one container request."""


def _identity(path: Path) -> FileIdentity | None:
    """Which file ``path`` is now (None: none). The change time tells a re-created socket that got
    the old inode number back from the old one."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class DevicePluginServer:
    """Serves one extended resource's device plugin and keeps it registered."""

    def __init__(
        self,
        plugin_dir: Path,
        resource: str,
        allocate: AllocateFn,
        *,
        socket_name: str = "spotgpu-spot-gpu.sock",
        watch_interval: float = 0.2,
        register_timeout: float = 10.0,
        preferred: PreferredFn | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.socket = plugin_dir / socket_name
        if len(os.fsencode(self.socket)) > MAX_SOCKET_PATH:
            raise PermanentError(
                f"device plugin socket {self.socket} is {len(os.fsencode(self.socket))} bytes long; "
                f"unix sockets allow at most {MAX_SOCKET_PATH}"
            )
        self.kubelet_socket = plugin_dir / "kubelet.sock"
        self._allocate = allocate
        self._preferred = preferred
        self._watch_interval = watch_interval
        self._register_timeout = register_timeout
        self._cond = threading.Condition()
        self._devices: tuple[TwinDevice, ...] = ()
        self._version = 0
        self._stopping = False
        self._server: grpc.Server | None = None
        self._served: FileIdentity | None = None
        self._kubelet_file: FileIdentity | None = None
        self._registered = False
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self.registrations = 0
        self.allocations = 0
        self.refusals = 0
        self.preference_errors = 0

    @property
    def options(self) -> dp.DevicePluginOptions:
        """What Register and GetDevicePluginOptions announce (the kubelet only calls
        GetPreferredAllocation when ``get_preferred_allocation_available`` is set)."""
        return dp.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=self._preferred is not None
        )

    # -- devices ---------------------------------------------------------------------------
    def set_devices(self, devices: Sequence[TwinDevice]) -> bool:
        """Publish a new device list; streams get it only if it changed. Returns whether it did."""
        new = tuple(sorted(devices, key=lambda d: d.id))
        with self._cond:
            if new == self._devices:
                return False
            self._devices = new
            self._version += 1
            self._cond.notify_all()
        return True

    def devices(self) -> tuple[TwinDevice, ...]:
        with self._cond:
            return self._devices

    def _resend(self) -> None:
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    @property
    def registered(self) -> bool:
        return self._registered

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Serve, register (retrying in the background if the kubelet is not up), then watch."""
        self._stop_event.clear()
        with self._cond:
            self._stopping = False
        self._serve()
        self._try_register()
        self._thread = threading.Thread(target=self._watch, name="deviceplugin-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop_event.set()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._shutdown_server()
        if self._served is not None and _identity(self.socket) == self._served:
            self.socket.unlink(missing_ok=True)
        self._served = None
        self._registered = False

    def _serve(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="deviceplugin"))
        dp_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        self._served = _identity(self.socket)
        log.info("device plugin for %s serving on %s", self.resource, self.socket)

    def _shutdown_server(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            with self._cond:
                self._cond.notify_all()
            server.stop(grace=0.5).wait(5)

    def _try_register(self) -> bool:
        kubelet_file = _identity(self.kubelet_socket)
        if kubelet_file is None:
            self._registered = False
            return False
        request = dp.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket.name,
            resource_name=self.resource,
            options=self.options,
        )
        try:
            with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                dp_grpc.RegistrationStub(channel).Register(request, timeout=self._register_timeout)
        except grpc.RpcError as exc:
            log.warning("registering %s with the kubelet failed: %s: %s", self.resource, exc.code().name, exc.details())
            self._registered = False
            return False
        self._kubelet_file = kubelet_file
        self._registered = True
        self.registrations += 1
        log.info("registered %s with the kubelet (endpoint %s)", self.resource, self.socket.name)
        return True

    def _watch(self) -> None:
        wait = backoff = self._watch_interval
        while not self._stop_event.wait(wait):
            wait = self._watch_interval
            try:
                if self._check_sockets() and not self._try_register():
                    backoff = min(backoff * 2, MAX_REGISTER_BACKOFF)
                    wait = backoff
                else:
                    backoff = self._watch_interval
            except Exception:  # the watcher must survive anything; the next round retries
                log.exception("device plugin watcher round failed")

    def _check_sockets(self) -> bool:
        """One look at both sockets; True when a registration is due now (``kubelet.sock`` is there
        and we are not registered with the file it is)."""
        ours = _identity(self.socket)
        kubelet = _identity(self.kubelet_socket)
        if ours is None or ours != self._served:
            log.info("our socket %s was removed (kubelet restart): serving again", self.socket)
            self._shutdown_server()
            self._serve()
            self._registered = False
        if kubelet is None:
            if self._registered:
                log.info("kubelet.sock is gone (kubelet restart): registering again once it is back")
            self._registered = False
            return False
        if self._registered and kubelet != self._kubelet_file:
            log.info("kubelet.sock was re-created: registering again")
            self._registered = False
        return not self._registered

    # -- RPC bodies (called from gRPC threads) ----------------------------------------------
    def _list_and_watch(self, context: grpc.ServicerContext) -> Iterator[dp.ListAndWatchResponse]:
        sent = -1
        context.add_callback(self._wake)
        while True:
            with self._cond:
                self._cond.wait_for(partial(self._should_wake, sent, context), 1.0)
                if self._stopping or not context.is_active():
                    return
                if self._version == sent:
                    continue
                sent, devices = self._version, self._devices
            yield dp.ListAndWatchResponse(
                devices=[
                    dp.Device(
                        ID=d.id,
                        health=d.health.value,
                        topology=dp.TopologyInfo(nodes=[dp.NUMANode(ID=d.numa_node)])
                        if d.numa_node is not None
                        else None,
                    )
                    for d in devices
                ]
            )

    def _should_wake(self, sent: int, context: grpc.ServicerContext) -> bool:
        return self._version != sent or self._stopping or not context.is_active()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _answer_allocate(self, request: dp.AllocateRequest) -> dp.AllocateResponse:
        responses = []
        for container in request.container_requests:
            annotations = self._allocate(list(container.devices_ids))
            responses.append(dp.ContainerAllocateResponse(annotations=annotations))
        self.allocations += 1
        return dp.AllocateResponse(container_responses=responses)

    def _answer_preferred(self, request: dp.PreferredAllocationRequest) -> dp.PreferredAllocationResponse:
        responses = []
        for req in request.container_requests:
            available, must = list(req.available_deviceIDs), list(req.must_include_deviceIDs)
            size = req.allocation_size
            offered = dict.fromkeys([*must, *available])
            if self._preferred is None:
                chosen = list(offered)
            else:
                try:
                    chosen = [i for i in dict.fromkeys(self._preferred(available, must, size)) if i in offered]
                except Exception:  # never fail an admission over a preference
                    self.preference_errors += 1
                    log.exception("GetPreferredAllocation for %s failed; answering no preference", self.resource)
                    chosen = []
            responses.append(dp.ContainerPreferredAllocationResponse(deviceIDs=chosen[: max(size, 0)]))
        return dp.PreferredAllocationResponse(container_responses=responses)


class _Servicer(dp_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, plugin: DevicePluginServer) -> None:
        self._p = plugin

    def GetDevicePluginOptions(self, request: dp.Empty, context: grpc.ServicerContext) -> dp.DevicePluginOptions:
        return self._p.options

    def ListAndWatch(self, request: dp.Empty, context: grpc.ServicerContext) -> Iterator[dp.ListAndWatchResponse]:
        yield from self._p._list_and_watch(context)

    def Allocate(self, request: dp.AllocateRequest, context: grpc.ServicerContext) -> dp.AllocateResponse:
        try:
            return self._p._answer_allocate(request)
        except PermanentError as exc:
            self._p.refusals += 1
            self._p._resend()
            log.warning("Allocate refused: %s", exc)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{self._p.resource}: {exc}")
            raise AssertionError("unreachable") from None
        except Exception as exc:
            self._p.refusals += 1
            log.exception("Allocate failed")
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{self._p.resource}: allocation failed: {exc}")
            raise AssertionError("unreachable") from None

    def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> dp.PreferredAllocationResponse:
        return self._p._answer_preferred(request)

    def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()


__all__ = ["API_VERSION", "MAX_REGISTER_BACKOFF", "AllocateFn", "DevicePluginServer", "PreferredFn", "TwinDevice"]
