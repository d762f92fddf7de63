"""The fd holder's listening sockets: the listener (runc) and the control socket (guards and
successor holders).

Decides only who may connect to the control socket (the holder's own uid). Side effects: binds
(atomically, mode 0600) or inherits both sockets, accepts on them while told to listen, reads
each runc connection on a short-lived thread (a slow client never delays answering calls) and
queues what it got for the loop, and removes the socket files when told to (the last holder).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import struct
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Final

from spotgpu.core.errors import SpotgpuError
from spotgpu.guard.listener import Connection, read_connection
from spotgpu.guard.loop import EventLoop

log = logging.getLogger(__name__)

_SO_PEERCRED: Final = struct.Struct("3i")
CONTROL_TIMEOUT: Final = 0.5
"""Send timeout of control connections: a peer that stops reading must not stall the loop for long."""


def bind_unix(path: Path, kind: socket.SocketKind, backlog: int = 64) -> tuple[socket.socket, int]:
    """A listening unix socket at ``path``, mode 0600, swapped in atomically over any stale one.

    Returns the socket and the inode of its file, for :func:`unlink_if_ours`.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    sock = socket.socket(socket.AF_UNIX, kind | socket.SOCK_CLOEXEC)
    try:
        sock.bind(str(tmp))
        os.chmod(tmp, 0o600)
        sock.listen(backlog)
        os.rename(tmp, path)
        inode = os.stat(path).st_ino
    except OSError:
        sock.close()
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return sock, inode


def unlink_if_ours(path: Path, inode: int) -> None:
    """Remove ``path`` unless something else (a successor) has been bound there since."""
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == inode:
            path.unlink()


def peer_uid(sock: socket.socket) -> int:
    _pid, uid, _gid = _SO_PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _SO_PEERCRED.size))
    return int(uid)


class Endpoints:
    """The listener and control sockets of one holder. ``on_control`` gets each accepted control
    connection (its peer checked, its timeout set)."""

    def __init__(
        self, listener_path: Path, control_path: Path, loop: EventLoop, on_control: Callable[[socket.socket], None]
    ) -> None:
        self.listener_path = listener_path
        self.control_path = control_path
        self._loop = loop
        self._on_control = on_control
        self._sockets: dict[str, tuple[socket.socket, int]] = {}
        """``listener``/``control`` -> the socket and its file's inode."""
        self._listening = False
        self._incoming: queue.Queue[Connection] = queue.Queue()
        self._readers = 0
        self._readers_lock = threading.Lock()

    def _path(self, role: str) -> Path:
        return self.listener_path if role == "listener" else self.control_path

    @property
    def has_listener(self) -> bool:
        return "listener" in self._sockets

    def inherit(self, sockets: Mapping[str, tuple[socket.socket, int]]) -> None:
        """Take the sockets a predecessor handed over (the very same listening sockets)."""
        self._sockets.update(sockets)

    def open(self, available: bool) -> None:
        """Bind what is not inherited. Without notify support the listener stays closed on
        purpose: then ``listener_ready`` is false and spotgpu-runtime never injects the rule."""
        if "control" not in self._sockets:
            self._sockets["control"] = bind_unix(self.control_path, socket.SOCK_SEQPACKET)
        if available and "listener" not in self._sockets:
            self._sockets["listener"] = bind_unix(self.listener_path, socket.SOCK_STREAM)
        elif not available and "listener" in self._sockets:
            sock, inode = self._sockets.pop("listener")
            unlink_if_ours(self.listener_path, inode)
            sock.close()

    def listen(self, on: bool) -> None:
        """Accept (or stop accepting) on the listening sockets; they stay open either way."""
        if on == self._listening:
            return
        handlers = {"listener": self._accept_listener, "control": self._accept_control}
        for role, (sock, _inode) in self._sockets.items():
            if on:
                self._loop.watch(sock.fileno(), handlers[role])
            else:
                self._loop.forget(sock.fileno())
        self._listening = on

    def handed(self) -> list[tuple[str, int, int]]:
        """(role, fd, inode) of each socket, for a successor."""
        return [(role, sock.fileno(), inode) for role, (sock, inode) in self._sockets.items()]

    def busy(self) -> bool:
        """A runc connection is still being read."""
        with self._readers_lock:
            return self._readers > 0

    def incoming(self) -> Iterator[Connection]:
        """The runc connections read so far (each once)."""
        while True:
            try:
                yield self._incoming.get_nowait()
            except queue.Empty:
                return

    def drop_copies(self) -> None:
        """Close our copies only: the same sockets live on in newer holders."""
        for sock, _inode in self._sockets.values():
            sock.close()
        self._sockets.clear()

    def close(self, *, unlink: bool) -> None:
        """Stop accepting and close; ``unlink``: also remove the socket files if still ours."""
        self.listen(False)
        for role, (sock, inode) in self._sockets.items():
            if unlink:
                unlink_if_ours(self._path(role), inode)
            sock.close()
        self._sockets.clear()

    def _accept_listener(self, fd: int, _mask: int) -> None:
        try:
            conn, _ = self._sockets["listener"][0].accept()
        except OSError:
            return
        with self._readers_lock:
            self._readers += 1
        threading.Thread(target=self._read_listener, args=(conn,), name="holder-listener", daemon=True).start()

    def _read_listener(self, conn: socket.socket) -> None:
        """Runs on a short-lived thread so a slow client never delays answering calls."""
        try:
            with conn:
                got = read_connection(conn)
            if got is not None:  # None: a readiness probe
                self._incoming.put(got)
        except (SpotgpuError, OSError) as exc:
            log.warning("guard holder: refused a listener connection: %s", exc)
        finally:
            with self._readers_lock:
                self._readers -= 1
            self._loop.poke()

    def _accept_control(self, fd: int, _mask: int) -> None:
        try:
            conn, _ = self._sockets["control"][0].accept()
        except OSError:
            return
        if peer_uid(conn) != os.geteuid():
            log.warning("guard holder: refused a control connection from uid %d", peer_uid(conn))
            conn.close()
            return
        conn.settimeout(CONTROL_TIMEOUT)
        self._on_control(conn)


__all__ = ["CONTROL_TIMEOUT", "Endpoints", "bind_unix", "peer_uid", "unlink_if_ours"]
