"""Holder-to-holder handover on the wire: a new fd holder takes everything from the running one.

Side effects: a connection to the predecessor's control socket, ``SCM_RIGHTS`` transfers of
listening sockets, notify fds and guard connections, ``pidfd_open`` to tell a dead predecessor
from a live one. Decides nothing beyond what the protocol defines; the holder's life-cycle
decisions are in :mod:`spotgpu.guard.succession`.

What moves (``protocol`` module docstring has the messages): the *listening* sockets themselves
(so runc's and the guard's connections queue on the same socket throughout, nothing is rebound
and no connection is refused), a copy of every notify fd with its info, and every guard control
connection with the holds it reported (so an attached guard never notices that the process at
the other end changed). The predecessor keeps its copies and becomes the successor's *standby*:
it answers nothing, receives every later fd, and resumes if the successor dies.

Commit protocol: the predecessor answers calls until it receives ``taken``; it then stops,
sends ``standby``, and only on ``standby`` does the successor start answering. So at no instant
do both answer, and a failure at any step leaves exactly one side responsible:

* the successor dies before ``taken``: the predecessor aborts and goes on as before;
* the predecessor dies mid-way (EOF, and its pidfd says it exited): the successor keeps what it
  received and starts as a primary that lost its predecessor (the holder then restarts stranded
  calls, waits for a guard that may answer alone, and compares with the ledger);
* the predecessor is alive but refuses or aborts (``detach``): the successor closes every copy
  it received and asks again, or, after ``timeout``, starts on its own.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from spotgpu.guard import protocol
from spotgpu.guard.ledger import LedgerEntry, LedgerError
from spotgpu.guard.protocol import Message, Op, ProtocolError

log = logging.getLogger(__name__)

LOST_CHUNK: Final = 100
"""Lost-fd entries per ``lost`` message (each entry is a few hundred bytes)."""
DEATH_GRACE: Final = 1.0
"""After EOF from a predecessor, how long to wait for its pidfd to report the exit."""
_PEERCRED: Final = struct.Struct("3i")


def peer_pid(sock: socket.socket) -> int:
    pid, _uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return int(pid)


def lost_messages(entries: Sequence[LedgerEntry], chunk: int = LOST_CHUNK) -> list[bytes]:
    """The ``lost`` messages for a list: at least one (``first`` replaces the receiver's list)."""
    wires = [e.to_wire() for e in entries]
    chunks = [wires[i : i + chunk] for i in range(0, len(wires), chunk)] or [[]]
    return [protocol.encode(Op.LOST, first=i == 0, fds=c) for i, c in enumerate(chunks)]


def parse_lost(message: Message) -> tuple[bool, list[LedgerEntry]]:
    try:
        return message.bool_field("first"), [LedgerEntry.from_wire(w) for w in message.list_field("fds")]
    except LedgerError as exc:
        raise ProtocolError(f"{message.op}: {exc}") from None


# --- the predecessor's side -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutgoingGuard:
    """A guard control connection as the predecessor hands it on."""

    fd: int
    attached: bool
    reported: tuple[tuple[str, int], ...]
    silent_s: float


def send_state(
    link: socket.socket,
    *,
    sockets: Sequence[tuple[str, int, int]],
    fds: Sequence[tuple[int, LedgerEntry]],
    guards: Sequence[OutgoingGuard],
    lost: Sequence[LedgerEntry],
    quiet_s: float,
) -> None:
    """Send everything to a successor: ``takeover``, then ``socket`` (role, fd, inode) for each
    listening socket, ``fd``, ``guard``, ``lost`` and ``handed``. Raises OSError when the link
    breaks (the caller aborts the handover; its own copies are untouched)."""
    protocol.send(
        link,
        protocol.encode(
            Op.TAKEOVER,
            version=protocol.PROTOCOL_VERSION,
            holder_pid=os.getpid(),
            sockets=len(sockets),
            fds=len(fds),
            guards=len(guards),
            guard=any(g.attached for g in guards),
            quiet_s=max(0.0, quiet_s),
        ),
    )
    for role, fd, inode in sockets:
        protocol.send(link, protocol.encode(Op.SOCKET, role=role, inode=inode), fd)
    for fd, entry in fds:
        protocol.send(link, protocol.encode(Op.FD, fd=entry.to_wire()), fd)
    for guard in guards:
        protocol.send(
            link,
            protocol.encode(
                Op.GUARD,
                attached=guard.attached,
                reported=[[key, nid] for key, nid in guard.reported],
                silent_s=max(0.0, guard.silent_s),
            ),
            guard.fd,
        )
    for data in lost_messages(lost):
        protocol.send(link, data)
    protocol.send(link, protocol.encode(Op.HANDED, sockets=len(sockets), fds=len(fds), guards=len(guards)))


# --- the successor's side -------------------------------------------------------------------


@dataclass(slots=True)
class InheritedGuard:
    sock: socket.socket
    attached: bool
    reported: set[tuple[str, int]]
    silent_s: float


@dataclass(slots=True)
class Inheritance:
    """What a successor received. ``complete``: the predecessor committed (it is standby now and
    ``link`` is the open standby link); otherwise the predecessor died part-way and this is all
    that is left of its state."""

    predecessor_pid: int
    complete: bool = False
    guard_expected: bool = False
    """A guard was attached to the predecessor (it may be answering alone if its connection
    did not arrive)."""
    quiet_s: float = 0.0
    sockets: dict[str, tuple[socket.socket, int]] = field(default_factory=dict)
    fds: list[tuple[int, LedgerEntry]] = field(default_factory=list)
    guards: list[InheritedGuard] = field(default_factory=list)
    lost: list[LedgerEntry] = field(default_factory=list)
    link: socket.socket | None = None

    def close(self) -> None:
        """Drop every copy received (the predecessor still has its own)."""
        for sock, _inode in self.sockets.values():
            sock.close()
        for fd, _entry in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for guard in self.guards:
            guard.sock.close()
        if self.link is not None:
            self.link.close()
        self.sockets, self.fds, self.guards, self.link = {}, [], [], None


_Outcome = Inheritance | Literal["retry", "failed"]


def pull(control_path: Path, timeout: float, *, retry_delay: float = 0.2) -> Inheritance | None:
    """Take over from the holder listening on ``control_path``, if one runs.

    None: no predecessor (nothing listens there), or it refused or failed without dying; the
    caller starts on its own then (a live predecessor keeps its fds and its guard).
    """
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(max(0.05, deadline - time.monotonic()))
            sock.connect(str(control_path))
        except OSError as exc:
            sock.close()
            if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK):
                log.warning("guard holder: cannot reach a predecessor at %s: %s", control_path, exc)
            return None
        outcome = _pull_once(sock, deadline)
        if isinstance(outcome, Inheritance):
            return outcome
        if outcome == "retry" and time.monotonic() + retry_delay < deadline:
            time.sleep(retry_delay)
            continue
        return None


def _pull_once(sock: socket.socket, deadline: float) -> _Outcome:
    pid = peer_pid(sock)
    pidfd: int | None = None
    with contextlib.suppress(OSError):
        pidfd = os.pidfd_open(pid)
    inherited = Inheritance(predecessor_pid=pid)
    header: Message | None = None
    try:
        protocol.send(sock, protocol.encode(Op.HANDOVER, version=protocol.PROTOCOL_VERSION, pid=os.getpid()))
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no complete handover in time")
            sock.settimeout(remaining)
            got = protocol.receive(sock)
            if got is None:
                raise ConnectionResetError(errno.ECONNRESET, "the predecessor closed the connection")
            message, fd = got
            if message.op is Op.DETACH:
                inherited.close()
                sock.close()
                retry = message.body.get("retry") is True
                log.warning(
                    "guard holder: predecessor pid %d refused the handover: %s", pid, message.body.get("reason")
                )
                return "retry" if retry else "failed"
            if header is None and message.op is not Op.TAKEOVER:
                raise ProtocolError(f"expected takeover, got {message.op}")
            if message.op is Op.TAKEOVER:
                header = message
                inherited.guard_expected = message.bool_field("guard")
                inherited.quiet_s = message.float_field("quiet_s")
            elif message.op is Op.STANDBY:
                inherited.complete = True
                inherited.link = sock
                sock.settimeout(0.5)
                return inherited
            elif message.op is Op.HANDED:
                _check_counts(header, message, inherited)
                protocol.send(sock, protocol.encode(Op.TAKEN, pid=os.getpid()))
            else:
                _receive_part(inherited, message, fd)
    except (OSError, ProtocolError) as exc:
        if header is not None and _predecessor_died(pidfd):
            log.error(
                "guard holder: predecessor pid %d died during the handover (%s); keeping the %d fds received",
                pid,
                exc,
                len(inherited.fds),
            )
            sock.close()
            return inherited
        log.warning("guard holder: handover from pid %d failed: %s", pid, exc)
        inherited.close()
        sock.close()
        return "failed"
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _receive_part(inherited: Inheritance, message: Message, fd: int | None) -> None:
    """Store one ``socket``/``fd``/``guard``/``lost`` message. Every field is checked before
    the fd is stored; on a protocol error the fd is closed and ``inherited`` is unchanged."""
    try:
        if message.op is Op.SOCKET:
            role, inode = message.str_field("role"), message.int_field("inode")
            if role not in ("listener", "control") or role in inherited.sockets:
                raise ProtocolError(f"socket: unexpected role {role!r}")
            assert fd is not None
            inherited.sockets[role] = (socket.socket(fileno=fd), inode)
        elif message.op is Op.FD:
            try:
                entry = LedgerEntry.from_wire(message.body.get("fd"))
            except LedgerError as exc:
                raise ProtocolError(f"fd: {exc}") from None
            assert fd is not None
            inherited.fds.append((fd, entry))
        elif message.op is Op.GUARD:
            attached, silent_s = message.bool_field("attached"), message.float_field("silent_s")
            reported = {_reported_hold(item) for item in message.list_field("reported")}
            assert fd is not None
            inherited.guards.append(InheritedGuard(socket.socket(fileno=fd), attached, reported, silent_s))
        elif message.op is Op.LOST:
            first, entries = parse_lost(message)
            inherited.lost = entries if first else inherited.lost + entries
        else:
            raise ProtocolError(f"unexpected {message.op} during a handover")
    except ProtocolError:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise


def _reported_hold(item: object) -> tuple[str, int]:
    if (
        isinstance(item, list)
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], int)
        and not isinstance(item[1], bool)
        and item[1] >= 0
    ):
        return item[0], item[1]
    raise ProtocolError(f"guard: bad reported hold {item!r}")


def _check_counts(header: Message | None, handed: Message, inherited: Inheritance) -> None:
    assert header is not None
    got = {"sockets": len(inherited.sockets), "fds": len(inherited.fds), "guards": len(inherited.guards)}
    for name, count in got.items():
        if header.int_field(name) != count or handed.int_field(name) != count:
            raise ProtocolError(f"handed: {name} announced {header.int_field(name)}, received {count}")


def _predecessor_died(pidfd: int | None) -> bool:
    """True when the predecessor exited (its pidfd polls readable within a short grace: the
    connection closes while the process is still exiting). Unknown (no pidfd) counts as alive,
    so a live predecessor is never mistaken for a dead one."""
    if pidfd is None:
        return False
    readable, _, _ = select.select([pidfd], [], [], DEATH_GRACE)
    return bool(readable)


__all__ = [
    "Inheritance",
    "InheritedGuard",
    "OutgoingGuard",
    "lost_messages",
    "parse_lost",
    "peer_pid",
    "pull",
    "send_state",
]
