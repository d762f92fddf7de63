"""spotgpu's NRI plugin: registration, the runtime's calls, and reconnecting.

Decides nothing about containers (its :class:`ContainerHandler` does, :mod:`spotgpu.nri.host`).
Side effects: connects to the runtime's NRI socket (:mod:`spotgpu.nri.transport`), one
background thread that keeps a session up.

Life of a session (shared/reference/cri-nri.md, "Registration"): connect; ``RegisterPlugin``
(name, two-digit index) on the runtime connection, first thing; the runtime then calls
``Configure`` (we subscribe to CreateContainer and StartContainer) and ``Synchronize`` with the
pods and containers it knows, possibly in parts (``more``: each part is answered with ``more =
true`` and no updates, the handler sees them all at once); then ``CreateContainer`` per
container, and ``StateChange`` (event START_CONTAINER) before the runtime starts its process: an
error answer fails the start.
When the connection breaks (containerd restarting, ``Shutdown``, a framing error) the loop
connects again with a capped backoff and registers anew, so a containerd restart needs no
agent restart. While no session is up, containerd creates containers without our adjustments
(NRI fails open) unless its NRI default validator requires this plugin
(``deploy/containerd/nri-v3.toml``); docs/runtime.md ("NRI mode") says what each means.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol, Self

from spotgpu.adapters.proto import nri_v1alpha1_pb2 as nri
from spotgpu.nri import wire
from spotgpu.nri.transport import UNIMPLEMENTED, RpcError, Session, SessionClosed, encode

log = logging.getLogger(__name__)

SUBSCRIBED: Final = wire.event_mask(nri.CREATE_CONTAINER, nri.START_CONTAINER)
_INDEX: Final = re.compile(r"[0-9]{2}")


class ContainerHandler(Protocol):
    """What the plugin asks at CreateContainer and at registration."""

    def create_container(
        self, pod: nri.PodSandbox, container: nri.Container, timeout: float
    ) -> nri.ContainerAdjustment:
        """The adjustment for a container about to be created; raise RpcError to refuse it.
        ``timeout``: seconds until the runtime gives up on us (and creates it unadjusted)."""
        ...

    def start_container(self, pod: nri.PodSandbox, container: nri.Container, timeout: float) -> None:
        """Before the runtime starts a created container's process; raise RpcError to fail the start."""
        ...

    def synchronize(self, pods: Sequence[nri.PodSandbox], containers: Sequence[nri.Container]) -> None:
        """The runtime's pods and containers when we (re)register."""
        ...

    def configure(self, runtime_name: str, runtime_version: str) -> None:
        """Which runtime (and version) configured us, before anything else."""
        ...


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    name: str
    version: str
    request_timeout: float
    """Seconds the runtime waits for one answer (``plugin_request_timeout``)."""


class NriPlugin:
    """Keeps one registered NRI session with the runtime at ``socket_path`` (module docstring)."""

    def __init__(
        self,
        socket_path: Path,
        handler: ContainerHandler,
        *,
        name: str = "spotgpu",
        index: str = "50",
        call_timeout: float = 5.0,
        max_backoff: float = 2.0,
    ) -> None:
        if not name:
            raise ValueError("NRI plugin name must not be empty")
        if _INDEX.fullmatch(index) is None:
            raise ValueError(f"NRI plugin index {index!r} must be exactly two digits")
        self.socket_path = socket_path
        self.handler = handler
        self.name = name
        self.index = index
        self.call_timeout = call_timeout
        self.max_backoff = max_backoff
        self.runtime: RuntimeInfo | None = None
        self.sessions = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._session: Session | None = None
        self._sync_parts: tuple[list[nri.PodSandbox], list[nri.Container]] = ([], [])
        self._thread: threading.Thread | None = None

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> Self:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="nri-plugin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        session = self._session
        if session is not None:
            session.close()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def wait_synchronized(self, timeout: float) -> bool:
        """True once the current session finished Synchronize (the runtime now calls us)."""
        return self._synced.wait(timeout)

    @property
    def connected(self) -> bool:
        return self._synced.is_set()

    def status(self) -> dict[str, Any]:
        runtime = self.runtime
        return {
            "socket": str(self.socket_path),
            "plugin": f"{self.index}-{self.name}",
            "synchronized": self._synced.is_set(),
            "sessions": self.sessions,
            "runtime": f"{runtime.name} {runtime.version}" if runtime else None,
            "last_error": self.last_error,
        }

    def _loop(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._run_session()
            except (OSError, RpcError) as exc:
                self.last_error = str(exc)
                log.debug("NRI session to %s: %s", self.socket_path, exc)
            if self._stop.is_set():
                return
            backoff = 0.05 if time.monotonic() - started > 5 else min(backoff * 2, self.max_backoff)
            self._stop.wait(backoff)

    def _run_session(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.call_timeout)
            sock.connect(str(self.socket_path))
            sock.settimeout(None)
        except OSError:
            sock.close()
            raise
        self._synced.clear()
        self._sync_parts = ([], [])
        session = Session(sock, self._handle).start()
        self._session = session
        try:
            request = nri.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
            session.call("RegisterPlugin", request.SerializeToString(), self.call_timeout)
            self.sessions += 1
            log.info("NRI: registered as %s-%s on %s", self.index, self.name, self.socket_path)
            while not self._stop.is_set() and not session.closed.wait(0.5):
                pass
            if session.error and not self._stop.is_set():
                self.last_error = session.error
                log.warning("NRI: session to %s ended: %s; reconnecting", self.socket_path, session.error)
        except SessionClosed as exc:
            raise OSError(f"session closed during registration: {exc}") from None
        finally:
            self._synced.clear()
            self._session = None
            session.close()

    # -- the runtime's calls ---------------------------------------------------------------
    def _handle(self, method: str, payload: bytes, metadata: Mapping[str, str]) -> bytes:
        if method == "CreateContainer":
            request = nri.CreateContainerRequest.FromString(payload)
            timeout = self.runtime.request_timeout if self.runtime else 2.0
            adjust = self.handler.create_container(request.pod, request.container, timeout)
            return encode(nri.CreateContainerResponse(adjust=adjust))
        if method == "Configure":
            return self._configure(nri.ConfigureRequest.FromString(payload))
        if method == "Synchronize":
            return self._synchronize(nri.SynchronizeRequest.FromString(payload))
        if method == "Shutdown":
            log.info("NRI: the runtime asked us to shut down; reconnecting later")
            session = self._session
            if session is not None:
                threading.Timer(0.1, session.close).start()
            return encode(nri.Empty())
        if method == "StateChange":
            event = nri.StateChangeEvent.FromString(payload)
            if event.event == nri.START_CONTAINER:
                timeout = self.runtime.request_timeout if self.runtime else 2.0
                self.handler.start_container(event.pod, event.container, timeout)
            return encode(nri.Empty())
        if method in ("StopContainer", "UpdateContainer", "UpdatePodSandbox"):
            return b""  # empty responses: we subscribed to none of these
        raise RpcError(UNIMPLEMENTED, f"spotgpu NRI plugin does not implement {method}")

    def _configure(self, request: nri.ConfigureRequest) -> bytes:
        timeout = request.request_timeout / 1000 if request.request_timeout > 0 else 2.0
        self.runtime = RuntimeInfo(request.runtime_name, request.runtime_version, timeout)
        self.handler.configure(request.runtime_name, request.runtime_version)
        log.info(
            "NRI: configured by %s %s (request timeout %.1fs)", request.runtime_name, request.runtime_version, timeout
        )
        return encode(nri.ConfigureResponse(events=SUBSCRIBED))

    def _synchronize(self, request: nri.SynchronizeRequest) -> bytes:
        pods, containers = self._sync_parts
        pods.extend(request.pods)
        containers.extend(request.containers)
        if request.more:
            return encode(nri.SynchronizeResponse(more=True))
        self._sync_parts = ([], [])
        try:
            self.handler.synchronize(pods, containers)
        except Exception:  # a bug in bookkeeping must not keep the runtime from calling us
            log.exception("NRI: handling Synchronize failed")
        self._synced.set()
        return encode(nri.SynchronizeResponse())


__all__ = ["SUBSCRIBED", "ContainerHandler", "NriPlugin", "RuntimeInfo"]
