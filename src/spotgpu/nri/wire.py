"""NRI's wire format: the connection multiplexer and the ttrpc framing inside it.

Pure: bytes in, frames and messages out (no sockets here; :mod:`spotgpu.nri.transport` does
the I/O). Facts from shared/reference/cri-nri.md, "Wire format":

* One unix stream socket carries several logical connections. A **multiplexer frame** is
  ``[u32 BE connection id][u32 BE payload length][payload]``; connection 0 is reserved, frames
  for an unknown connection are dropped, and each connection's payloads form one byte stream
  (a frame boundary is not a message boundary). containerd reads a frame's payload into a
  4096-byte buffer and fails the whole plugin connection on a larger one (NRI then creates
  containers unadjusted), so :func:`mux_frames` never writes a frame longer than
  :data:`MAX_FRAME` bytes, header included.
* Connection :data:`PLUGIN_CONN` (1) carries service ``nri.pkg.api.v1alpha1.Plugin``, served by
  the plugin; :data:`RUNTIME_CONN` (2) service ``nri.pkg.api.v1alpha1.Runtime``, served by the
  runtime.
* A **ttrpc message** on a connection is ``[u32 BE length][u32 BE stream id][u8 type][u8
  flags][data]``, length at most 4 MiB; a client's stream ids are odd, from 1, +2 per call.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

MUX_HEADER: Final = struct.Struct(">II")
TTRPC_HEADER: Final = struct.Struct(">IIBB")
MAX_FRAME: Final = 4096
"""Longest multiplexer frame we send, header included."""
MAX_PAYLOAD: Final = MAX_FRAME - MUX_HEADER.size
MAX_MESSAGE: Final = 4 << 20
"""ttrpc's limit on one message's data."""

PLUGIN_CONN: Final = 1
RUNTIME_CONN: Final = 2

TYPE_REQUEST: Final = 1
TYPE_RESPONSE: Final = 2
TYPE_DATA: Final = 3
FLAG_REMOTE_CLOSED: Final = 1
FLAG_REMOTE_OPEN: Final = 2
FLAG_NO_DATA: Final = 4

PLUGIN_SERVICE: Final = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE: Final = "nri.pkg.api.v1alpha1.Runtime"


class WireError(ValueError):
    """The peer sent something that breaks the framing; the connection must be dropped."""


def mux_frames(conn_id: int, data: bytes) -> list[bytes]:
    """``data`` for connection ``conn_id`` as multiplexer frames of at most :data:`MAX_FRAME` bytes."""
    if not 0 < conn_id < 1 << 32:
        raise WireError(f"connection id {conn_id} is reserved or out of range")
    if not data:
        return []
    return [
        MUX_HEADER.pack(conn_id, len(chunk)) + chunk
        for chunk in (data[i : i + MAX_PAYLOAD] for i in range(0, len(data), MAX_PAYLOAD))
    ]


def ttrpc_message(stream_id: int, kind: int, data: bytes, flags: int = 0) -> bytes:
    """One ttrpc message (header and data)."""
    if len(data) > MAX_MESSAGE:
        raise WireError(f"ttrpc message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    return TTRPC_HEADER.pack(len(data), stream_id, kind, flags) + data


class MuxReader:
    """Splits the socket's byte stream into ``(connection id, payload)`` frames."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buffer += data
        frames: list[tuple[int, bytes]] = []
        while len(self._buffer) >= MUX_HEADER.size:
            conn_id, size = MUX_HEADER.unpack_from(self._buffer)
            if size > MAX_MESSAGE + TTRPC_HEADER.size:
                raise WireError(f"multiplexer frame of {size} bytes for connection {conn_id}")
            end = MUX_HEADER.size + size
            if len(self._buffer) < end:
                break
            frames.append((conn_id, bytes(self._buffer[MUX_HEADER.size : end])))
            del self._buffer[:end]
        return frames


@dataclass(frozen=True, slots=True)
class Message:
    stream_id: int
    kind: int
    flags: int
    data: bytes


class TtrpcReader:
    """Reassembles one connection's byte stream into ttrpc messages."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buffer += data
        messages: list[Message] = []
        while len(self._buffer) >= TTRPC_HEADER.size:
            size, stream_id, kind, flags = TTRPC_HEADER.unpack_from(self._buffer)
            if size > MAX_MESSAGE:
                raise WireError(f"ttrpc message of {size} bytes exceeds {MAX_MESSAGE}")
            end = TTRPC_HEADER.size + size
            if len(self._buffer) < end:
                break
            messages.append(Message(stream_id, kind, flags, bytes(self._buffer[TTRPC_HEADER.size : end])))
            del self._buffer[:end]
        return messages


def event_mask(*events: int) -> int:
    """The ``ConfigureResponse.events`` mask subscribing to ``events`` (``Event`` numbers)."""
    mask = 0
    for event in events:
        if not 1 <= event <= 14:
            raise WireError(f"NRI event {event} is out of range")
        mask |= 1 << (event - 1)
    return mask


__all__ = [
    "FLAG_NO_DATA",
    "FLAG_REMOTE_CLOSED",
    "FLAG_REMOTE_OPEN",
    "MAX_FRAME",
    "MAX_MESSAGE",
    "MAX_PAYLOAD",
    "PLUGIN_CONN",
    "PLUGIN_SERVICE",
    "RUNTIME_CONN",
    "RUNTIME_SERVICE",
    "TYPE_DATA",
    "TYPE_REQUEST",
    "TYPE_RESPONSE",
    "Message",
    "MuxReader",
    "TtrpcReader",
    "WireError",
    "event_mask",
    "mux_frames",
    "ttrpc_message",
]
