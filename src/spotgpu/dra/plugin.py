"""The kubelet plugin: registration socket, DRA service socket, v1/v1beta1 DRAPlugin and health.

Side effects: two gRPC servers on unix sockets and their threads. Conventions of the kubelet
and the Go helper (shared/reference/dra.md sections 2 and 8):

* Service socket ``<plugins dir>/<driver>/dra.sock`` (``dra-<pod UID>.sock`` with rolling
  updates), registration socket ``<registry dir>/<driver>-reg.sock`` (rolling: the helper's
  names, kept within 107 bytes: :func:`socket_paths`). A stale file is removed before
  listening, the service socket is served *before* the registration socket appears, and both
  files are removed on :meth:`DraPlugin.stop`.
* ``GetInfo``: type ``DRAPlugin``, name = driver, endpoint = the service socket's absolute path
  (no ``unix:`` prefix), supported versions ``v1.DRAPlugin``, ``v1beta1.DRAPlugin``,
  ``v1.DRAResourceHealth``, ``v1alpha1.DRAResourceHealth``; every one is served.
* ``NodePrepareResources``/``NodeUnprepareResources`` answer every claim UID
  (:class:`~spotgpu.dra.driver.DraDriver` does the work, serialized); ``request_names`` carry the
  base request name.
* ``NodeWatchResources`` sends the complete device list at once and again on every
  :meth:`DraPlugin.health_changed`.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import grpc

from spotgpu.adapters.proto import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from spotgpu.core.errors import PermanentError
from spotgpu.dra.claim import ClaimKey, ClaimUID, DriverName
from spotgpu.dra.driver import DraDriver

log = logging.getLogger(__name__)

PLUGIN_TYPE: Final = "DRAPlugin"
SUPPORTED_VERSIONS: Final = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
KUBELET_REGISTRY_DIR: Final = Path("/var/lib/kubelet/plugins_registry")
KUBELET_PLUGINS_DIR: Final = Path("/var/lib/kubelet/plugins")
MAX_SOCKET_PATH: Final = 107


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    pool: str
    device: str
    healthy: bool
    message: str = ""


HealthFn = Callable[[], Sequence[DeviceHealth]]


def _b64(data: bytes, n: int) -> str:
    return base64.urlsafe_b64encode(data[:n]).decode().rstrip("=")


def socket_paths(
    driver: DriverName, registry_dir: Path, plugins_dir: Path, pod_uid: str | None = None
) -> tuple[Path, Path]:
    """``(registration socket, service socket)``; with ``pod_uid`` the rolling-update names."""
    service_dir = plugins_dir / driver
    if pod_uid is None:
        reg, service = registry_dir / f"{driver}-reg.sock", service_dir / "dra.sock"
    else:
        service = service_dir / f"dra-{pod_uid}.sock"
        joined = hashlib.sha256(driver.encode() + b"\0" + pod_uid.encode()).digest()
        candidates = (
            f"{driver}-{pod_uid}-reg.sock",
            f"{driver}-{_b64(hashlib.sha256(pod_uid.encode()).digest(), 8)}-reg.sock",
            f"dra-{_b64(joined, 16)}-reg.sock",
        )
        fitting = [registry_dir / c for c in candidates if len(os.fsencode(registry_dir / c)) <= MAX_SOCKET_PATH]
        reg = fitting[0] if fitting else registry_dir / candidates[-1]
    for path in (reg, service):
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise PermanentError(f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes")
    return reg, service


class _DraService:
    """``DRAPlugin`` of one proto version (v1 and v1beta1 share field names and numbers)."""

    def __init__(self, pb: ModuleType, driver: DraDriver) -> None:
        self._pb = pb
        self._driver = driver

    @staticmethod
    def _keys(request: Any) -> list[ClaimKey]:
        return [ClaimKey(c.namespace, c.name, ClaimUID(c.uid)) for c in request.claims]

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        answers = self._driver.prepare(self._keys(request))
        resp = self._pb.NodePrepareResourcesResponse()
        for uid, a in answers.items():
            entry = resp.claims[uid]
            if a.error:
                entry.error = a.error
                continue
            for d in a.devices:
                entry.devices.add(
                    request_names=[d.request], pool_name=d.pool, device_name=d.device, cdi_device_ids=list(d.cdi_ids)
                )
        return resp

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        answers = self._driver.unprepare(self._keys(request))
        resp = self._pb.NodeUnprepareResourcesResponse()
        for uid, a in answers.items():
            resp.claims[uid].error = a.error
        return resp


class _Health:
    def __init__(self, pb: ModuleType, plugin: DraPlugin) -> None:
        self._pb = pb
        self._plugin = plugin

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        seen = -1
        while context.is_active() and not self._plugin.stopping:
            version, devices = self._plugin.wait_health(seen, timeout=1.0)
            if version == seen:
                continue
            seen = version
            yield self._pb.NodeWatchResourcesResponse(
                devices=[
                    self._pb.DeviceHealth(
                        device=self._pb.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
                        health=self._pb.HEALTHY if d.healthy else self._pb.UNHEALTHY,
                        last_updated_time=int(self._plugin.clock()),
                        message=d.message[:1024],
                    )
                    for d in devices
                ]
            )


class _Registration:
    def __init__(self, plugin: DraPlugin) -> None:
        self._plugin = plugin

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pluginregistration_v1_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._plugin.driver_name,
            endpoint=str(self._plugin.service_socket),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._plugin.registration_status(bool(request.plugin_registered), str(request.error))
        if not request.plugin_registered:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"registration failed: {request.error}")
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


class DraPlugin:
    """The kubelet plugin of one driver on one node."""

    def __init__(
        self,
        driver_name: DriverName,
        driver: DraDriver,
        health: HealthFn,
        *,
        registry_dir: Path = KUBELET_REGISTRY_DIR,
        plugins_dir: Path = KUBELET_PLUGINS_DIR,
        pod_uid: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.driver_name = driver_name
        self._driver = driver
        self._health = health
        self.registration_socket, self.service_socket = socket_paths(driver_name, registry_dir, plugins_dir, pod_uid)
        self.clock = clock
        self._cond = threading.Condition()
        self._health_version = 0
        self.stopping = False
        self.registered: bool | None = None
        self.registration_error = ""
        self.refusals: list[str] = []
        """Every error a kubelet sent with ``plugin_registered=false``."""
        self._servers: list[grpc.Server] = []

    def _serve(self, socket: Path, add: Callable[[grpc.Server], None]) -> None:
        socket.parent.mkdir(parents=True, exist_ok=True)
        socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="dra-plugin"))
        add(server)
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        self._servers.append(server)

    def start(self) -> None:
        def service(server: grpc.Server) -> None:
            dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_DraService(dra_v1_pb2, self._driver), server)
            dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(_DraService(dra_v1beta1_pb2, self._driver), server)
            dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(_Health(dra_health_v1_pb2, self), server)
            dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                _Health(dra_health_v1alpha1_pb2, self), server
            )

        def registration(server: grpc.Server) -> None:
            pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)

        self._serve(self.service_socket, service)  # the kubelet connects at once after GetInfo
        self._serve(self.registration_socket, registration)

    def stop(self) -> None:
        with self._cond:
            self.stopping = True
            self._cond.notify_all()
        for server in reversed(self._servers):
            server.stop(0).wait()
        self._servers.clear()
        self.registration_socket.unlink(missing_ok=True)
        self.service_socket.unlink(missing_ok=True)

    def registration_status(self, registered: bool, error: str) -> None:
        with self._cond:
            self.registered, self.registration_error = registered, error
            self._cond.notify_all()
        if not registered:
            self.refusals.append(error)
            log.error("the kubelet refused DRA driver %s: %s", self.driver_name, error)

    def wait_registered(self, timeout: float) -> bool | None:
        """The kubelet's last registration answer, waiting up to ``timeout`` for one."""
        with self._cond:
            self._cond.wait_for(lambda: self.registered is not None, timeout)
            return self.registered

    def health_changed(self) -> None:
        with self._cond:
            self._health_version += 1
            self._cond.notify_all()

    def wait_health(self, seen: int, timeout: float) -> tuple[int, Sequence[DeviceHealth]]:
        with self._cond:
            if self._health_version == seen and not self.stopping:
                self._cond.wait(timeout)
            version = self._health_version
        return version, self._health()


__all__ = [
    "KUBELET_PLUGINS_DIR",
    "KUBELET_REGISTRY_DIR",
    "PLUGIN_TYPE",
    "SUPPORTED_VERSIONS",
    "DeviceHealth",
    "DraPlugin",
    "HealthFn",
    "socket_paths",
]
