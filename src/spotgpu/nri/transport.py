"""One NRI session: the runtime's unix socket, its multiplexed connections, ttrpc both ways.

Decides nothing; moves bytes. Side effects: reads and writes one connected unix socket, a
reader thread, a small pool of handler threads. Framing is :mod:`spotgpu.nri.wire`.

On :data:`~spotgpu.nri.wire.PLUGIN_CONN` the runtime calls us: each request is handed to the
``handler`` (method name, payload, metadata) on a pool thread and its answer (or the
:class:`RpcError` it raised, as an error status) is sent back on the request's stream. On
:data:`~spotgpu.nri.wire.RUNTIME_CONN` we call the runtime (:meth:`Session.call`). Every write
goes out in multiplexer frames of at most 4096 bytes, under one lock, so frames of different
messages never interleave. A framing error, EOF or a failed write closes the session; callers
(:mod:`spotgpu.nri.plugin`) reconnect.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

from spotgpu.adapters.proto import ttrpc_pb2
from spotgpu.nri import wire

log = logging.getLogger(__name__)

UNKNOWN: Final = 2
INVALID_ARGUMENT: Final = 3
DEADLINE_EXCEEDED: Final = 4
PERMISSION_DENIED: Final = 7
FAILED_PRECONDITION: Final = 9
UNIMPLEMENTED: Final = 12
INTERNAL: Final = 13
UNAVAILABLE: Final = 14


class RpcError(Exception):
    """An error status: raised by a handler to answer with it, or received from the peer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"rpc error {code}: {message}")
        self.code = code
        self.message = message


def encode(message: Any) -> bytes:
    """A protobuf message's wire bytes (typed: the protobuf runtime has no stubs here)."""
    return bytes(message.SerializeToString())


class SessionClosed(ConnectionError):
    """The session ended (EOF, framing error, close) before the call was answered."""


Handler = Callable[[str, bytes, Mapping[str, str]], bytes]
"""``(method, request payload, metadata) -> response payload``; raise :class:`RpcError` to fail."""


class Session:
    """A connected NRI socket (see module docstring); ``start()`` it, ``close()`` it."""

    def __init__(self, sock: socket.socket, handler: Handler, *, workers: int = 4) -> None:
        self._sock = sock
        self._handler = handler
        self._write_lock = threading.Lock()
        self._pending: dict[int, Future[ttrpc_pb2.Response]] = {}
        self._pending_lock = threading.Lock()
        self._next_stream = 1
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nri-handler")
        self._readers = {conn: wire.TtrpcReader() for conn in (wire.PLUGIN_CONN, wire.RUNTIME_CONN)}
        self.closed = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._read_loop, name="nri-reader", daemon=True)

    def start(self) -> Session:
        self._thread.start()
        return self

    # -- writing ---------------------------------------------------------------------------
    def _send(self, conn_id: int, message: bytes) -> None:
        frames = wire.mux_frames(conn_id, message)
        with self._write_lock:
            if self.closed.is_set():
                raise SessionClosed(self.error or "session closed")
            try:
                for frame in frames:
                    self._sock.sendall(frame)
            except OSError as exc:
                self._fail(f"write failed: {exc}")
                raise SessionClosed(str(exc)) from None

    def call(self, method: str, payload: bytes, timeout: float, service: str = wire.RUNTIME_SERVICE) -> bytes:
        """Call ``service.method`` on the runtime; the response payload, or :class:`RpcError`."""
        future: Future[ttrpc_pb2.Response] = Future()
        with self._pending_lock:
            stream = self._next_stream
            self._next_stream += 2
            self._pending[stream] = future
        request = ttrpc_pb2.Request(
            service=service, method=method, payload=payload, timeout_nano=int(timeout * 1e9)
        ).SerializeToString()
        try:
            self._send(wire.RUNTIME_CONN, wire.ttrpc_message(stream, wire.TYPE_REQUEST, request))
            response = future.result(timeout)
        except TimeoutError:
            raise RpcError(DEADLINE_EXCEEDED, f"{method}: no answer within {timeout:.1f}s") from None
        finally:
            with self._pending_lock:
                self._pending.pop(stream, None)
        if response.HasField("status") and response.status.code != 0:
            raise RpcError(response.status.code, response.status.message)
        return response.payload

    # -- reading ---------------------------------------------------------------------------
    def _read_loop(self) -> None:
        mux = wire.MuxReader()
        try:
            while not self.closed.is_set():
                data = self._sock.recv(65536)
                if not data:
                    self._fail("the runtime closed the connection")
                    return
                for conn_id, payload in mux.feed(data):
                    reader = self._readers.get(conn_id)
                    if reader is None:
                        log.debug("NRI: dropping a frame for unknown connection %d", conn_id)
                        continue
                    for message in reader.feed(payload):
                        self._dispatch(conn_id, message)
        except (OSError, wire.WireError, ValueError) as exc:
            self._fail(f"read failed: {exc}")

    def _dispatch(self, conn_id: int, message: wire.Message) -> None:
        if conn_id == wire.PLUGIN_CONN and message.kind == wire.TYPE_REQUEST:
            request = ttrpc_pb2.Request.FromString(message.data)
            self._pool.submit(self._serve, message.stream_id, request)
        elif conn_id == wire.RUNTIME_CONN and message.kind == wire.TYPE_RESPONSE:
            with self._pending_lock:
                future = self._pending.get(message.stream_id)
            if future is not None and not future.done():
                future.set_result(ttrpc_pb2.Response.FromString(message.data))
        else:
            log.debug("NRI: ignoring message type %d on connection %d", message.kind, conn_id)

    def _serve(self, stream_id: int, request: ttrpc_pb2.Request) -> None:
        metadata = {kv.key: kv.value for kv in request.metadata}
        try:
            payload = self._handler(request.method, request.payload, metadata)
            response = ttrpc_pb2.Response(payload=payload)
        except RpcError as exc:
            response = ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=exc.code, message=exc.message))
        except Exception as exc:  # a bug answers with an error; it never kills the session
            log.exception("NRI %s: handler failed", request.method)
            response = ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=INTERNAL, message=f"spotgpu: {exc!r}"))
        with contextlib.suppress(SessionClosed):
            self._send(
                wire.PLUGIN_CONN, wire.ttrpc_message(stream_id, wire.TYPE_RESPONSE, response.SerializeToString())
            )

    # -- closing ---------------------------------------------------------------------------
    def _fail(self, reason: str) -> None:
        if self.closed.is_set():
            return
        self.error = reason
        self.closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with self._pending_lock:
            pending = list(self._pending.values())
        for future in pending:
            if not future.done():
                future.set_exception(SessionClosed(reason))

    def close(self) -> None:
        self._fail("closed by the plugin")
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(OSError):
            self._sock.close()


__all__ = [
    "DEADLINE_EXCEEDED",
    "FAILED_PRECONDITION",
    "INTERNAL",
    "INVALID_ARGUMENT",
    "PERMISSION_DENIED",
    "UNAVAILABLE",
    "UNIMPLEMENTED",
    "UNKNOWN",
    "Handler",
    "RpcError",
    "Session",
    "SessionClosed",
    "encode",
]
