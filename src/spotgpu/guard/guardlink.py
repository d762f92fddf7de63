"""The fd holder's side of its guard connections.

Decides when a control connection has been silent too long (``guard_timeout`` for the attached
guard, which pings every ``guard_timeout / 4``, and for a connection that never sent a first
message). Side effects: sends on and closes those connections, (un)registers them with the
holder's event loop, and tells the holder when the attached guard is gone (``on_detached``),
which then takes every fd back. What the guard's messages mean is the holder's.

During a handover the connections are *paused*: not read, so that every message the guard
sends meanwhile waits in the socket for whichever holder commits.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from spotgpu.core.clock import Clock
from spotgpu.guard import handover, protocol
from spotgpu.guard.loop import EventLoop
from spotgpu.guard.protocol import Op

log = logging.getLogger(__name__)

Hold = tuple[str, int]
"""A call the guard reported holding: (fd key, notification id)."""


def receive(sock: socket.socket, peer: str) -> tuple[protocol.Message, int | None] | None:
    """One control message; None when the peer is gone or broke the protocol (logged): every
    caller then treats the connection as ended."""
    try:
        return protocol.receive(sock)
    except (OSError, protocol.ProtocolError) as exc:
        log.warning("guard holder: bad message from %s: %s", peer, exc)
        return None


@dataclass(slots=True)
class GuardConn:
    """One control connection: a guard (``attached`` after its ``attach``) or, before its first
    message, possibly a successor holder."""

    sock: socket.socket
    last_seen: float
    attached: bool = False


class GuardLink:
    """The attached guard, the control connections before their first message, the calls the
    guard reported holding. ``on_readable(conn)`` is called when a connection has a message."""

    def __init__(
        self,
        loop: EventLoop,
        clock: Clock,
        timeout: float,
        on_readable: Callable[[GuardConn], None],
        on_detached: Callable[[str], None],
    ) -> None:
        self._loop = loop
        self._clock = clock
        self.timeout = timeout
        self._on_readable = on_readable
        self._on_detached = on_detached
        self.guard: GuardConn | None = None
        self._pending: dict[int, GuardConn] = {}
        self.reported: set[Hold] = set()
        self._paused: list[GuardConn] = []

    @property
    def attached(self) -> bool:
        return self.guard is not None and self.guard.attached

    def add(self, sock: socket.socket, last_seen: float | None = None, *, attached: bool = False) -> GuardConn:
        """Watch a new connection (accepted, or inherited from a predecessor)."""
        conn = GuardConn(sock, self._clock.monotonic() if last_seen is None else last_seen, attached)
        self._loop.watch(sock.fileno(), self._readable)
        if attached:
            self.guard = conn
        else:
            self._pending[sock.fileno()] = conn
        return conn

    def _readable(self, fd: int, _mask: int) -> None:
        conn = self.guard if self.guard is not None and fd == self.guard.sock.fileno() else self._pending.get(fd)
        if conn is not None:
            self._on_readable(conn)

    def attach(self, conn: GuardConn) -> None:
        """``conn`` sent ``attach``: it is the guard now; a guard attached before is superseded."""
        if self.guard is not None:
            self.end(self.guard, "another guard attached", tell=True, superseded=True)
        self._pending.pop(conn.sock.fileno(), None)
        self.guard = conn
        conn.attached = True

    def release(self, conn: GuardConn) -> socket.socket:
        """A pending connection turned out to be a successor holder: it is not ours to time out.
        It stays registered with the loop (the caller gives it its own handler)."""
        self._pending.pop(conn.sock.fileno(), None)
        return conn.sock

    def send(self, data: bytes, fd: int | None = None) -> None:
        """To the attached guard, if any; a failed send ends it."""
        guard = self.guard
        if guard is None:
            return
        try:
            protocol.send(guard.sock, data, fd)
        except OSError as exc:
            self.end(guard, f"send failed: {exc}")

    def end(self, conn: GuardConn, reason: str, *, tell: bool = False, superseded: bool = False) -> None:
        """Drop a control connection; if it was the attached guard, ``on_detached(reason)``.

        ``superseded``: another guard attached; the dropped one must not come back (two agents
        on one node would otherwise take the fds from each other in turn).
        """
        if tell:
            with contextlib.suppress(OSError):
                protocol.send(conn.sock, protocol.encode(Op.DETACH, reason=reason, superseded=superseded))
        self._pending.pop(conn.sock.fileno(), None)
        self._loop.forget(conn.sock.fileno())
        conn.sock.close()
        if conn is not self.guard:
            return
        self.guard = None
        self._on_detached(reason)

    def check_silence(self) -> None:
        if self._paused:
            return  # not reading the guard while the state is in flight
        guard = self.guard
        if guard is not None and self._clock.monotonic() - guard.last_seen > self.timeout:
            self.end(guard, f"silent for more than {self.timeout:g}s", tell=True)
        for pending in list(self._pending.values()):
            if self._clock.monotonic() - pending.last_seen > self.timeout:
                self.end(pending, "no attach")

    def deadline(self) -> float | None:
        """When the attached guard counts as silent (None while paused or without a guard)."""
        if self.guard is None or self._paused:
            return None
        return self.guard.last_seen + self.timeout

    def forget_holds(self, key: str) -> None:
        """The fd ``key`` is closed: no call of it can be held any more."""
        self.reported = {r for r in self.reported if r[0] != key}

    def take_holds(self) -> list[Hold]:
        """The reported holds, oldest key first, and forget them (they are being released)."""
        holds = sorted(self.reported)
        self.reported = set()
        return holds

    # -- handover ----------------------------------------------------------------------------
    def inherit(self, guards: Iterable[handover.InheritedGuard], now: float) -> None:
        """Take the connections a predecessor handed over, with the holds its guard reported."""
        for got in guards:
            got.sock.settimeout(0.5)
            attach = got.attached and self.guard is None
            self.add(got.sock, now - got.silent_s, attached=attach)
            if attach:
                self.reported = set(got.reported)

    def pause(self) -> None:
        """Stop reading every connection: from here on their messages wait for the successor."""
        self._paused = [g for g in (self.guard, *self._pending.values()) if g is not None]
        for conn in self._paused:
            self._loop.forget(conn.sock.fileno())

    def outgoing(self, now: float) -> list[handover.OutgoingGuard]:
        """The paused connections as a successor receives them."""
        holds = tuple(sorted(self.reported))
        return [
            handover.OutgoingGuard(g.sock.fileno(), g.attached, holds if g.attached else (), now - g.last_seen)
            for g in self._paused
        ]

    def unpause(self) -> None:
        """The handover aborted: read the connections again (their silence counts from now)."""
        now = self._clock.monotonic()
        for conn in self._paused:
            conn.last_seen = now
            self._loop.watch(conn.sock.fileno(), self._readable)
        self._paused = []

    def hand_off(self) -> None:
        """The successor committed: it owns the connections now; close our copies."""
        for conn in self._paused:
            conn.sock.close()
        self._paused, self.guard, self._pending, self.reported = [], None, {}, set()

    def close(self) -> None:
        for conn in (self.guard, *self._pending.values(), *self._paused):
            if conn is not None:
                conn.sock.close()
        self.guard = None
        self._pending.clear()
        self._paused = []


__all__ = ["GuardConn", "GuardLink", "Hold", "receive"]
