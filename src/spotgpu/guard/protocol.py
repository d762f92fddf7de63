"""The control protocol between the fd holder (``spotgpu guard-holder``), the agent's guard,
and successor holders.

Encoding and decoding are pure; :func:`send` and :func:`receive` do one ``sendmsg`` /
``recvmsg`` on a ``SOCK_SEQPACKET`` unix socket (message boundaries kept, at most one fd per
message, attached with ``SCM_RIGHTS``).

Every message is one UTF-8 JSON object with an ``op``. Between the holder (H) and a guard (G):

====================  =========  ==============================================================
op                    direction  meaning
====================  =========  ==============================================================
``attach``            G -> H     first message; ``have``: keys of the fds the guard already holds
``welcome``           H -> G     answer to attach: holder pid, listener path, notify support
``fd`` (+ 1 fd)       both       a notify fd and its :class:`~spotgpu.guard.listener.NotifyFdInfo`
``lost``              H -> G     notify fds lost in a crash of holder and guard together (their
                                 owners' session starts fail with ENOSYS until they restart);
                                 ``first``: this chunk replaces the list, else it extends it
``synced``            H -> G     every fd the guard lacked was sent; the guard now answers all
``hold`` / ``done``   G -> H     the guard holds / released notification ``id`` on fd ``key``
``ping``              G -> H     heartbeat; a silent guard is detached after the holder timeout
``detach``            H -> G     the holder took the fds back; the guard must stop answering.
                                 ``superseded``: another guard attached, do not come back;
                                 otherwise (silent too long, protocol error) attach again
====================  =========  ==============================================================

Between an old holder (P, predecessor) and a new one (S, successor) that takes over from it
(:mod:`spotgpu.guard.handover`):

======================  =========  ============================================================
op                      direction  meaning
======================  =========  ============================================================
``handover``            S -> P     first message: take over everything P holds
``takeover``            P -> S     header: counts, whether a guard is attached, P's quiet time
``socket`` (+ 1 fd)     P -> S     a listening socket (``role``: listener/control, ``inode``)
``fd`` (+ 1 fd)         P -> S     a notify fd, its info and its process start time
``guard`` (+ 1 fd)      P -> S     a guard's control connection, ``attached``, its ``reported``
                                   holds and how long it has been ``silent_s``
``lost``                P -> S     the lost-fd list (chunks, as above)
``handed``              P -> S     end of the state; S answers ``taken``
``taken``               S -> P     S has everything; P stops answering and becomes standby
``standby``             P -> S     commit: S answers from now on; the link stays open
``fd`` (+ 1 fd)         S -> P     later fds, so the standby can resume with all of them
``status``              S -> P     ``guard``: whether a guard is attached to S
``retire``              S -> P     P's own standby is obsolete (S has a newer one): let go
``detach``              P -> S     handover refused or aborted (``retry``: ask again soon)
======================  =========  ============================================================

The guard answers notifications only between ``synced`` and the end of the connection; the
holder answers them (always CONTINUE) whenever no guard is attached; a standby never does.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from spotgpu.core.errors import ValidationError
from spotgpu.guard import seccomp
from spotgpu.guard.listener import NotifyFdInfo

PROTOCOL_VERSION: Final = 2
"""1: guard <-> holder; 2: adds holder -> holder handover and ``lost``. Holders accept guards of
version 1 and 2; a handover needs version 2 on both sides."""
MAX_MESSAGE: Final = 1 << 16


class ProtocolError(ValidationError):
    """A control message is malformed or unexpected."""


class Op(StrEnum):
    ATTACH = "attach"
    WELCOME = "welcome"
    FD = "fd"
    SYNCED = "synced"
    HOLD = "hold"
    DONE = "done"
    PING = "ping"
    DETACH = "detach"
    LOST = "lost"
    HANDOVER = "handover"
    TAKEOVER = "takeover"
    SOCKET = "socket"
    GUARD = "guard"
    HANDED = "handed"
    TAKEN = "taken"
    STANDBY = "standby"
    STATUS = "status"
    RETIRE = "retire"


CARRIES_FD: Final = frozenset({Op.FD, Op.SOCKET, Op.GUARD})
"""Ops whose message carries exactly one fd; every other op carries none."""


@dataclass(frozen=True, slots=True)
class Message:
    op: Op
    body: dict[str, Any]

    # Typed accessors; each raises ProtocolError when the field is missing or has the wrong type.
    def str_field(self, name: str) -> str:
        value = self.body.get(name)
        if not isinstance(value, str):
            raise ProtocolError(f"{self.op}: {name} must be a string, got {value!r}")
        return value

    def int_field(self, name: str) -> int:
        value = self.body.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ProtocolError(f"{self.op}: {name} must be a non-negative integer, got {value!r}")
        return value

    def bool_field(self, name: str) -> bool:
        value = self.body.get(name)
        if not isinstance(value, bool):
            raise ProtocolError(f"{self.op}: {name} must be a boolean, got {value!r}")
        return value

    def float_field(self, name: str) -> float:
        value = self.body.get(name)
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < 1e9:
            raise ProtocolError(f"{self.op}: {name} must be a non-negative number, got {value!r}")
        return float(value)

    def list_field(self, name: str) -> list[Any]:
        value = self.body.get(name)
        if not isinstance(value, list):
            raise ProtocolError(f"{self.op}: {name} must be a list, got {value!r}")
        return value

    def keys_field(self, name: str) -> list[str]:
        value = self.body.get(name)
        if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
            raise ProtocolError(f"{self.op}: {name} must be a list of strings, got {value!r}")
        return list(value)

    def fd_info(self) -> NotifyFdInfo:
        try:
            return NotifyFdInfo.from_wire(self.body.get("fd"))
        except ValidationError as exc:
            raise ProtocolError(f"{self.op}: {exc}") from None


def encode(op: Op, **body: Any) -> bytes:
    if "op" in body:
        raise ValueError("'op' is reserved")
    data = json.dumps({"op": op.value, **body}, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"{op} message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    return data


def decode(data: bytes) -> Message:
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError(f"control message is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"control message must be an object, got {type(obj).__name__}")
    op = obj.pop("op", None)
    try:
        return Message(Op(op), obj)
    except ValueError:
        raise ProtocolError(f"unknown control op {op!r}") from None


def fd_message(info: NotifyFdInfo) -> bytes:
    return encode(Op.FD, fd=info.to_wire())


def send(sock: socket.socket, data: bytes, fd: int | None = None) -> None:
    """Send one message; raises OSError when the peer is gone."""
    seccomp.send_with_fd(sock, data, fd)


def receive(sock: socket.socket) -> tuple[Message, int | None] | None:
    """Receive one message and its fd (the caller owns it); None at end of connection.

    A malformed message raises :class:`ProtocolError`, with any fd it carried closed.
    """
    data, fds = seccomp.recv_with_fds(sock, MAX_MESSAGE + 1, maxfds=1)
    if not data and not fds:
        return None
    try:
        if len(data) > MAX_MESSAGE:
            raise ProtocolError(f"control message larger than {MAX_MESSAGE} bytes")
        message = decode(data)
        if (message.op in CARRIES_FD) != bool(fds):
            raise ProtocolError(f"{message.op}: {'missing' if message.op in CARRIES_FD else 'unexpected'} fd")
    except ProtocolError:
        seccomp.close_all(fds)
        raise
    return message, (fds[0] if fds else None)


__all__ = [
    "CARRIES_FD",
    "MAX_MESSAGE",
    "PROTOCOL_VERSION",
    "Message",
    "Op",
    "ProtocolError",
    "decode",
    "encode",
    "fd_message",
    "receive",
    "send",
]
