"""The runtime service: the agent's unix socket that modifies specs for the per-call wrapper.

Decides nothing itself (the :class:`~spotgpu.runtime.engine.SpecEngine` does). Side effects:
a listening unix socket (mode 0600: only root, i.e. the shim's wrapper, may connect) with one
thread per connection, and removal of the socket on :meth:`RuntimeService.stop`.

Why a service (numbers in docs/runtime.md): the wrapper runs once per container creation, so
everything it imports is paid for on every ``create``. Holding the modifier chain, the codec
and the gRPC clients in the long-running agent keeps the wrapper at the bare interpreter start
(about 8 ms) plus one socket round trip, where an in-process chain would import gRPC (+60 ms)
and ``json`` (+9 ms) each time.

Hosting it in the agent (done by the agent's wiring, not here)::

    service = RuntimeService.for_agent(agent_config, runtime_config, owner_of=agent.owner_of,
                                       own_plugin_sockets=("spotgpu-spot-gpu.sock",),
                                       lendable=agent.lendable)
    service.start()       # after the MappingCache is recovered, before the device plugin registers
    ...
    service.stop()

The agent mounts the socket's directory (``/run/spotgpu``) from the host at the same path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import socketserver
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from spotgpu.core.config import AgentConfig
from spotgpu.core.errors import TemporaryError
from spotgpu.runtime import protocol
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.engine import SpecEngine
from spotgpu.runtime.node import KubeletNodeLookup, LendableOf, LinuxHost, OwnerOf

log = logging.getLogger(__name__)


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(self.server.io_timeout)
        try:
            data = protocol.read_message(sock.recv)
            if not data:
                return  # a readiness probe: connect and close
            try:
                container_id, bundle, spec = protocol.parse_request(data)
            except protocol.ProtocolError as exc:
                answer = protocol.response(protocol.REFUSED, f"malformed request: {exc}".encode())
            else:
                answer = protocol.response(*self.server.engine.handle(container_id, bundle, spec))
            sock.sendall(answer)
        except (OSError, protocol.ProtocolError) as exc:
            log.warning("runtime service: dropping a connection: %s", exc)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, path: str, engine: SpecEngine, io_timeout: float) -> None:
        self.engine = engine
        self.io_timeout = io_timeout
        super().__init__(path, _Handler, bind_and_activate=False)


class RuntimeService:
    """Serves :class:`SpecEngine` on a unix socket; a context manager."""

    def __init__(self, socket_path: Path, engine: SpecEngine, *, io_timeout: float = 30.0) -> None:
        self.socket_path = socket_path
        self.engine = engine
        self.io_timeout = io_timeout
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lookup: KubeletNodeLookup | None = None

    @classmethod
    def for_agent(
        cls,
        agent: AgentConfig,
        runtime: RuntimeConfig,
        *,
        owner_of: OwnerOf,
        own_plugin_sockets: Sequence[str] = (),
        lendable: LendableOf | None = None,
    ) -> RuntimeService:
        """The service as the agent hosts it: kubelet clients from the agent's paths, owners (and
        whether a device is lent out now) from its state."""
        config = runtime.with_agent(agent)
        lookup = KubeletNodeLookup.from_config(
            config,
            owner_of,
            exclude_sockets=tuple(own_plugin_sockets),
            lendable=lendable,
        )
        service = cls(config.agent_socket, SpecEngine(config, lookup, LinuxHost()))
        service._lookup = lookup
        return service

    def start(self) -> Self:
        path = str(self.socket_path)
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if self.socket_path.is_socket():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                self.socket_path.unlink(missing_ok=True)  # stale: its server is gone
            else:
                raise TemporaryError(f"runtime service: another process already serves {path}")
            finally:
                probe.close()
        elif self.socket_path.exists():
            raise TemporaryError(f"runtime service: {path} exists and is not a socket")
        server = _Server(path, self.engine, self.io_timeout)
        try:
            server.server_bind()
            os.chmod(path, 0o600)  # before listen(): nobody can connect in between
            server.server_activate()
        except BaseException:
            server.server_close()
            raise
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="spotgpu-runtime-service", daemon=True)
        self._thread.start()
        log.info("runtime service listening on %s", path)
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._lookup is not None:
            self._lookup.close()
            self._lookup = None

    def counts(self) -> dict[str, int]:
        """The engine's answers by ``status`` or ``status:reason`` (the agent's metrics)."""
        return self.engine.counts()

    def status(self) -> dict[str, Any]:
        """For the agent's ``/debug/state``."""
        return {"answers": self.counts()}

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


__all__ = ["RuntimeService"]
