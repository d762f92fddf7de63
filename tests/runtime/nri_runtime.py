"""The runtime's side of an NRI session, for tests: a unix socket server speaking the
multiplexer and ttrpc framing of :mod:`spotgpu.nri.wire` (written independently of
:mod:`spotgpu.nri.transport`), recording every frame it receives."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from spotgpu.adapters.proto import nri_v1alpha1_pb2 as nri
from spotgpu.adapters.proto import ttrpc_pb2
from spotgpu.nri import wire


class FakeRuntime:
    """Accepts one plugin connection; answers RegisterPlugin; lets the test call the plugin."""

    def __init__(self, path: Path, *, refuse_register: str | None = None, chunk: int = 4096) -> None:
        self.path = path
        self.refuse_register = refuse_register
        self.chunk = chunk
        self.frames: list[tuple[int, int]] = []
        """(connection id, frame length including the header) of every frame the plugin sent."""
        self.registered: list[nri.RegisterPluginRequest] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(4)
        self.conn: socket.socket | None = None
        self._mux = wire.MuxReader()
        self._readers = {c: wire.TtrpcReader() for c in (wire.PLUGIN_CONN, wire.RUNTIME_CONN)}
        self._responses: dict[int, ttrpc_pb2.Response] = {}
        self._cond = threading.Condition()
        self._stream = 1
        self._thread: threading.Thread | None = None

    def accept(self, timeout: float = 10.0) -> None:
        self._server.settimeout(timeout)
        self.conn, _ = self._server.accept()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def send_raw(self, data: bytes) -> None:
        assert self.conn is not None
        for i in range(0, len(data), self.chunk):  # arbitrary write boundaries
            self.conn.sendall(data[i : i + self.chunk])

    def _send(self, conn_id: int, message: bytes, frame: int = 1000) -> None:
        out = b""
        for i in range(0, len(message), frame):  # a message over several frames
            part = message[i : i + frame]
            out += wire.MUX_HEADER.pack(conn_id, len(part)) + part
        self.send_raw(out)

    def _read(self) -> None:
        assert self.conn is not None
        while True:
            try:
                data = self.conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            for conn_id, payload in self._mux.feed(data):
                self.frames.append((conn_id, len(payload) + wire.MUX_HEADER.size))
                for message in self._readers[conn_id].feed(payload):
                    try:
                        self._handle(conn_id, message)
                    except (BrokenPipeError, ConnectionResetError):
                        return  # the plugin hung up before our answer: as a runtime, drop the connection

    def _handle(self, conn_id: int, message: wire.Message) -> None:
        if conn_id == wire.RUNTIME_CONN and message.kind == wire.TYPE_REQUEST:
            request = ttrpc_pb2.Request.FromString(message.data)
            assert request.service == wire.RUNTIME_SERVICE and request.method == "RegisterPlugin"
            self.registered.append(nri.RegisterPluginRequest.FromString(request.payload))
            if self.refuse_register:
                response = ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=2, message=self.refuse_register))
            else:
                response = ttrpc_pb2.Response(payload=nri.Empty().SerializeToString())
            body = wire.ttrpc_message(message.stream_id, wire.TYPE_RESPONSE, response.SerializeToString())
            self._send(wire.RUNTIME_CONN, body)
        elif conn_id == wire.PLUGIN_CONN and message.kind == wire.TYPE_RESPONSE:
            with self._cond:
                self._responses[message.stream_id] = ttrpc_pb2.Response.FromString(message.data)
                self._cond.notify_all()

    def call(self, method: str, payload: bytes, timeout: float = 10.0, frame: int = 1000) -> ttrpc_pb2.Response:
        """Call the plugin's ``method`` on connection 1; its Response."""
        with self._cond:
            stream = self._stream
            self._stream += 2
        request = ttrpc_pb2.Request(service=wire.PLUGIN_SERVICE, method=method, payload=payload)
        self._send(wire.PLUGIN_CONN, wire.ttrpc_message(stream, wire.TYPE_REQUEST, request.SerializeToString()), frame)
        with self._cond:
            if not self._cond.wait_for(lambda: stream in self._responses, timeout):
                raise TimeoutError(f"{method}: no answer")
            return self._responses.pop(stream)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self._server.close()
        self.path.unlink(missing_ok=True)
