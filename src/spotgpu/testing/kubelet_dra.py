"""The kubelet's DRA side over real gRPC: plugin watcher, registration, Prepare/Unprepare, health.

No kubelet can run here, so this does what the kubelet's plugin manager and DRA manager do
(shared/reference/dra.md sections 1.4, 1.5, 2.3, 2.4):

* watches the registration directory (existing sockets too; names starting with ``.`` and
  non-sockets ignored), dials each new socket, calls ``GetInfo`` with a 1 s timeout, checks the
  type (``DRAPlugin``) and picks the first of the plugin's ``supported_versions`` it knows
  (``v1.DRAPlugin``, ``v1beta1.DRAPlugin``), connects to ``endpoint`` (empty: the registration
  socket) and only then sends ``NotifyRegistrationStatus`` (5 s), with the kubelet's error texts
  when it refuses;
* a vanished registration socket deregisters the plugin;
* :meth:`KubeletDraDouble.prepare` / :meth:`unprepare` call the chosen service with the
  kubelet's 45 s timeout and check the answer as the kubelet does (an unknown UID or a missing
  one is an error: ``NodePrepareResources skipped N ResourceClaims``);
* when the plugin advertises a health service (v1 preferred, v1alpha1), a thread keeps the
  latest ``NodeWatchResources`` answer (:meth:`health`).

What it does not do: fetch the claim and check ``reservedFor`` before calling (the driver
checks that itself), checkpoint CDI IDs, or hand them to the runtime (the tests pass them to
CRI's ``CDI_devices`` as the kubelet would).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
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

log = logging.getLogger(__name__)

CALL_TIMEOUT: Final = 45.0
SERVICES: Final[dict[str, tuple[ModuleType, Any]]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginStub),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginStub),
}
HEALTH: Final[dict[str, tuple[ModuleType, Any]]] = {
    "v1.DRAResourceHealth": (dra_health_v1_pb2, dra_health_v1_pb2_grpc.DRAResourceHealthStub),
    "v1alpha1.DRAResourceHealth": (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub),
}


class KubeletDraError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class PreparedAnswer:
    devices: tuple[tuple[tuple[str, ...], str, str, tuple[str, ...]], ...]
    """``(request_names, pool, device, cdi_device_ids)`` per device."""
    error: str


@dataclass(slots=True)
class RegisteredPlugin:
    name: str
    endpoint: str
    service: str
    registration_socket: Path
    channel: grpc.Channel
    health_service: str | None = None
    health: list[tuple[str, str, int, str]] = field(default_factory=list)
    """Latest ``(pool, device, health, message)`` list of the health stream."""
    health_updates: int = 0


class KubeletDraDouble:
    def __init__(self, registry_dir: Path, *, poll: float = 0.02, known: Sequence[str] = tuple(SERVICES)) -> None:
        self.registry_dir = registry_dir
        self._poll = poll
        self._known = tuple(known)
        self._cond = threading.Condition()
        self._plugins: dict[str, RegisteredPlugin] = {}
        self._seen: set[Path] = set()
        self.refusals: list[tuple[Path, str]] = []
        self._closing = False
        self._thread = threading.Thread(target=self._watch, name="kubelet-dra-watch", daemon=True)

    def start(self) -> KubeletDraDouble:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def close(self) -> None:
        with self._cond:
            self._closing = True
            plugins = list(self._plugins.values())
            self._plugins.clear()
            self._cond.notify_all()
        self._thread.join(timeout=5)
        for p in plugins:
            p.channel.close()

    def _watch(self) -> None:
        while not self._closing:
            present = {p for p in self.registry_dir.rglob("*") if not p.name.startswith(".") and p.is_socket()}
            for path in sorted(present - self._seen):
                self._seen.add(path)
                try:
                    self._register(path)
                except (grpc.RpcError, KubeletDraError) as exc:
                    log.warning("registration of %s failed: %s", path, exc)
            for path in self._seen - present:
                self._seen.discard(path)
                self._deregister(path)
            time.sleep(self._poll)

    def _refuse(self, stub: Any, path: Path, error: str) -> None:
        self.refusals.append((path, error))
        stub.NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=False, error=error), timeout=5
        )
        raise KubeletDraError(error)

    def _register(self, path: Path) -> None:
        with grpc.insecure_channel(f"unix:{path}") as reg_channel:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(reg_channel)
            info = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=1)
            if info.type != "DRAPlugin":
                self._refuse(stub, path, f"no handler registered for plugin type: {info.type}")
            offered = list(info.supported_versions)
            service = next((v for v in offered if v in self._known), None)
            if service is None:
                self._refuse(
                    stub,
                    path,
                    "RegisterPlugin error -- plugin validation failed with err: none of services supported by the "
                    f"plugin ({', '.join(offered)}) are supported by the kubelet ({', '.join(self._known)})",
                )
            endpoint = info.endpoint or str(path)
            channel = grpc.insecure_channel(f"unix:{endpoint}")
            try:
                grpc.channel_ready_future(channel).result(timeout=10)
            except grpc.FutureTimeoutError:
                channel.close()
                self._refuse(stub, path, f"RegisterPlugin error -- failed to connect to {endpoint}")
            health = next((h for h in HEALTH if h in offered), None)
            plugin = RegisteredPlugin(info.name, endpoint, str(service), path, channel, health)
            with self._cond:
                if info.name in self._plugins and self._plugins[info.name].endpoint == endpoint:
                    channel.close()
                    self._refuse(stub, path, f"plugin {info.name} at {endpoint} is already registered")
                self._plugins[info.name] = plugin
                self._cond.notify_all()
            stub.NotifyRegistrationStatus(
                pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=5
            )
        if health is not None:
            threading.Thread(target=self._stream_health, args=(plugin,), name="kubelet-dra-health", daemon=True).start()

    def _deregister(self, path: Path) -> None:
        with self._cond:
            for name, p in list(self._plugins.items()):
                if p.registration_socket == path:
                    del self._plugins[name]
                    p.channel.close()
            self._cond.notify_all()

    def _stream_health(self, plugin: RegisteredPlugin) -> None:
        assert plugin.health_service is not None
        pb, stub_cls = HEALTH[plugin.health_service]
        try:
            for resp in stub_cls(plugin.channel).NodeWatchResources(pb.NodeWatchResourcesRequest()):
                devices = [(d.device.pool_name, d.device.device_name, int(d.health), d.message) for d in resp.devices]
                with self._cond:
                    plugin.health = devices
                    plugin.health_updates += 1
                    self._cond.notify_all()
        except grpc.RpcError as exc:
            log.debug("health stream of %s ended: %s", plugin.name, exc.code())

    def plugin(self, name: str, timeout: float = 10.0) -> RegisteredPlugin:
        deadline = time.monotonic() + timeout
        with self._cond:
            while name not in self._plugins:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"DRA plugin {name} did not register within {timeout}s ({self.refusals})")
                self._cond.wait(left)
            return self._plugins[name]

    def registered(self, name: str) -> bool:
        with self._cond:
            return name in self._plugins

    def wait_health(self, name: str, predicate: Any, timeout: float = 10.0) -> list[tuple[str, str, int, str]]:
        plugin = self.plugin(name, timeout)
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(plugin.health):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"health of {name} is {plugin.health}")
                self._cond.wait(left)
            return list(plugin.health)

    def _call(self, name: str, method: str, claims: Sequence[tuple[str, str, str]]) -> dict[str, Any]:
        plugin = self.plugin(name)
        pb, stub_cls = SERVICES[plugin.service]
        request_type = getattr(pb, f"{method}Request")
        request = request_type(claims=[pb.Claim(namespace=ns, name=n, uid=uid) for ns, n, uid in claims])
        resp = getattr(stub_cls(plugin.channel), method)(request, timeout=CALL_TIMEOUT)
        answers = dict(resp.claims)
        unknown = set(answers) - {uid for _, _, uid in claims}
        if unknown:
            raise KubeletDraError(f"{method}: result for unknown claim UID(s) {', '.join(sorted(unknown))}")
        missing = {uid for _, _, uid in claims} - set(answers)
        if missing:
            raise KubeletDraError(f"{method} skipped {len(missing)} ResourceClaims")
        return answers

    def prepare(self, name: str, claims: Sequence[tuple[str, str, str]]) -> dict[str, PreparedAnswer]:
        """``NodePrepareResources`` for ``(namespace, name, uid)`` claims; the answer per UID."""
        return {
            uid: PreparedAnswer(
                tuple((tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids)) for d in a.devices),
                a.error,
            )
            for uid, a in self._call(name, "NodePrepareResources", claims).items()
        }

    def unprepare(self, name: str, claims: Sequence[tuple[str, str, str]]) -> dict[str, str]:
        return {uid: a.error for uid, a in self._call(name, "NodeUnprepareResources", claims).items()}


__all__ = ["CALL_TIMEOUT", "KubeletDraDouble", "KubeletDraError", "PreparedAnswer", "RegisteredPlugin"]
