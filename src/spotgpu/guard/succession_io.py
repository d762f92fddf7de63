"""The fd holder's succession, applied: the handover's steps and the links between holders.

The decisions (who may hand over, the roles and their transitions, when to stay quiet) are in
:mod:`spotgpu.guard.succession`; the wire format in :mod:`spotgpu.guard.handover`. This module
holds the current role and performs each transition's side effects: it sends the state to a
successor, pauses and hands off the guard connections, stops or resumes accepting, keeps the
link to the standby (primary) or to the primary (standby), copies later fds over it, and
drops every fd on retirement. docs/guard.md ("Handover") has the whole sequence.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from typing import Final, Protocol

from spotgpu.core.clock import Clock
from spotgpu.guard import handover, protocol, succession
from spotgpu.guard.endpoints import Endpoints
from spotgpu.guard.fdtable import HeldFd, NotifyFds
from spotgpu.guard.guardlink import GuardConn, GuardLink, receive
from spotgpu.guard.ledger import LedgerEntry
from spotgpu.guard.listener import NotifyFdInfo
from spotgpu.guard.loop import EventLoop
from spotgpu.guard.losses import Losses
from spotgpu.guard.protocol import Op
from spotgpu.guard.succession import HandingOver, HolderRole, Primary, Standby

log = logging.getLogger(__name__)

DRAIN_TIMEOUT: Final = 3.0
"""Before sending its state, a predecessor lets listener connections it already accepted finish
(each reader gives up after 2 s)."""
DRAIN_POLL: Final = 0.02
"""While draining, how soon the loop looks again."""


class Host(Protocol):
    """What the succession needs of the holder that runs it."""

    def adopt(
        self, fd: int, info: NotifyFdInfo, start_time: int | None = None, *, forward: bool = True, verify: bool = False
    ) -> HeldFd | None: ...

    def adopt_incoming(self) -> None: ...

    def sync_answering(self) -> None: ...

    def takeover(self, reason: str) -> None: ...


class Succession:
    """The holder's role (``role``, a :data:`~spotgpu.guard.succession.HolderRole`) and the I/O
    of changing it."""

    def __init__(
        self,
        host: Host,
        *,
        loop: EventLoop,
        endpoints: Endpoints,
        fds: NotifyFds,
        link: GuardLink,
        losses: Losses,
        clock: Clock,
    ) -> None:
        self._host = host
        self._loop = loop
        self._endpoints = endpoints
        self._fds = fds
        self._link = link
        self._losses = losses
        self._clock = clock
        self.role: HolderRole = Primary()

    @property
    def quiet_until(self) -> float | None:
        role = self.role
        return role.quiet_until if isinstance(role, Primary | HandingOver) else None

    def deadline(self) -> float | None:
        """The next moment the loop must look at the succession."""
        if isinstance(self.role, HandingOver):
            return self._clock.monotonic() + DRAIN_POLL  # draining: look again soon
        return self.quiet_until

    def unquiet(self) -> None:
        if isinstance(self.role, Primary | HandingOver):
            self.role = self.role.quiet(None)

    # -- the successor's side ------------------------------------------------------------------
    def install(self, inherited: handover.Inheritance) -> str:
        """Take what a predecessor handed over (at start, before the loop runs). Returns a reason
        when this holder must take over answering right away: its predecessor died part-way and
        no guard answers instead."""
        now = self._clock.monotonic()
        self._endpoints.inherit(inherited.sockets)
        for fd, entry in inherited.fds:
            self._host.adopt(fd, entry.info, entry.start_time, forward=False)
        self._losses.replace(inherited.lost)
        self._link.inherit(inherited.guards, now)
        self.role, take_over = succession.inherited_role(
            complete=inherited.complete,
            link=inherited.link,
            quiet_s=inherited.quiet_s,
            guard_attached=self._link.attached,
            guard_expected=inherited.guard_expected,
            guard_timeout=self._link.timeout,
            now=now,
        )
        pid = inherited.predecessor_pid
        with_guard = self._link.attached
        if isinstance(self.role, Primary) and self.role.standby is not None:
            self._loop.watch(self.role.standby.fileno(), self._on_standby_link)
        if inherited.complete:
            log.info(
                "guard holder: took over %d notify fds%s from holder pid %d, which stands by until it exits",
                len(self._fds),
                " and the attached guard" if with_guard else "",
                pid,
            )
            return ""
        log.error(
            "guard holder: holder pid %d died while handing over; starting with the %d fds received%s",
            pid,
            len(self._fds),
            " and its guard" if with_guard else "",
        )
        return f"holder pid {pid} died while handing over" if take_over else ""

    # -- the predecessor's side ----------------------------------------------------------------
    def begin(self, conn: GuardConn, message: protocol.Message) -> None:
        """A control connection asked for a handover (its first message)."""
        refusal = succession.refuse_handover(self.role.kind, message.int_field("version"), protocol.PROTOCOL_VERSION)
        if refusal is not None:
            with contextlib.suppress(OSError):
                protocol.send(conn.sock, protocol.encode(Op.DETACH, reason=refusal.reason, retry=refusal.retry))
            self._link.end(conn, f"handover refused: {refusal.reason}")
            return
        assert isinstance(self.role, Primary)  # refuse_handover lets only a primary hand over
        successor = self._link.release(conn)
        self._loop.handle(successor.fileno(), self._on_successor)
        self.role = self.role.hand_over(successor, self._clock.monotonic())
        self._endpoints.listen(False)  # new connections wait in the backlog for whoever commits
        log.info("guard holder: successor pid %s asks to take over %d fds", message.body.get("pid"), len(self._fds))

    def check_handover(self) -> None:
        role = self.role
        if not isinstance(role, HandingOver):
            return
        now = self._clock.monotonic()
        if role.sent_at is None:
            if self._endpoints.busy() and now - role.started < DRAIN_TIMEOUT:
                return
            self._host.adopt_incoming()
            self._send_state(role)
        elif now - role.sent_at > self._link.timeout:  # as silent as a guard we would detach
            self._abort(role, f"the successor did not confirm within {self._link.timeout:g}s")

    def _send_state(self, role: HandingOver) -> None:
        now = self._clock.monotonic()
        self._link.pause()  # from here on the guard's messages wait for the successor
        try:
            handover.send_state(
                role.successor,
                sockets=self._endpoints.handed(),
                fds=[(h.fd, h.entry) for h in self._fds],
                guards=self._link.outgoing(now),
                lost=self._losses.lost(),
                quiet_s=0.0 if role.quiet_until is None else role.quiet_until - now,
            )
        except OSError as exc:
            self._abort(role, f"sending the state failed: {exc}")
            return
        self.role = role.sent(now)

    def _on_successor(self, _fd: int, _mask: int) -> None:
        role = self.role
        if not isinstance(role, HandingOver):
            return
        got = receive(role.successor, "the successor")
        if got is None:
            self._abort(role, "the successor went away")
        elif got[0].op is Op.TAKEN and role.sent_at is not None:
            self._commit(role)
        else:
            if got[1] is not None:
                os.close(got[1])
            self._abort(role, f"unexpected {got[0].op} from the successor")

    def _commit(self, role: HandingOver) -> None:
        link = role.successor
        had_guard = self._link.attached
        self.role = role.commit(had_guard)
        self._host.sync_answering()  # stop answering *before* the successor may start
        try:
            protocol.send(link, protocol.encode(Op.STANDBY, pid=os.getpid()))
        except OSError as exc:
            self.role = role
            self._abort(role, f"cannot confirm to the successor: {exc}")
            return
        self._link.hand_off()  # the successor owns the guard connections now
        if role.standby is not None:  # our own standby is obsolete: the successor has a newer one
            self._send_link(role.standby, protocol.encode(Op.RETIRE))
            self._drop_link(role.standby)
        self._loop.handle(link.fileno(), self._on_primary_link)
        self._losses.forget_suspects()
        log.info(
            "guard holder: handed %d fds%s over to successor pid %d in %.1f ms; standing by",
            len(self._fds),
            " and the attached guard" if had_guard else "",
            handover.peer_pid(link),
            (self._clock.monotonic() - role.started) * 1e3,
        )

    def _abort(self, role: HandingOver, reason: str) -> None:
        with contextlib.suppress(OSError):
            protocol.send(role.successor, protocol.encode(Op.DETACH, reason=f"handover aborted: {reason}", retry=True))
        self._drop_link(role.successor)
        self.role = role.abort()
        self._link.unpause()
        self._endpoints.listen(True)
        self._host.sync_answering()
        log.warning("guard holder: handover aborted (%s); serving on", reason)

    # -- the links between primary and standby -------------------------------------------------
    def _send_link(self, link: socket.socket, data: bytes, fd: int | None = None) -> None:
        try:
            protocol.send(link, data, fd)
        except OSError as exc:
            peer = "standby" if link is succession.standby_of(self.role) else "peer"
            log.warning("guard holder: the link to the %s broke: %s", peer, exc)

    def _drop_link(self, link: socket.socket) -> None:
        self._loop.forget(link.fileno())
        link.close()

    def share(self, held: HeldFd) -> None:
        """Copy a new fd to the other holder: our standby, or (a late connection reached a
        standby after the handover) our primary."""
        role = self.role
        peer = role.primary if isinstance(role, Standby) else succession.standby_of(role)
        if peer is not None:
            self._send_link(peer, protocol.encode(Op.FD, fd=held.entry.to_wire()), held.fd)

    def to_standby(self, data: bytes) -> None:
        standby = succession.standby_of(self.role)
        if standby is not None:
            self._send_link(standby, data)

    def send_status(self, guard_attached: bool) -> None:
        self.to_standby(protocol.encode(Op.STATUS, guard=guard_attached))

    def _on_standby_link(self, _fd: int, _mask: int) -> None:
        """PRIMARY: our standby writes only to hand us a connection that reached it late."""
        role = self.role
        if not isinstance(role, Primary | HandingOver) or role.standby is None:
            return
        got = receive(role.standby, "the standby")
        if got is None:
            log.info("guard holder: the standby holder exited")
            self._drop_link(role.standby)
            self.role = role.without_standby()
            return
        message, fd = got
        if message.op is Op.FD and fd is not None:
            entry = LedgerEntry.from_wire(message.body.get("fd"))
            held = self._host.adopt(fd, entry.info, entry.start_time, forward=False)
            if held is not None and self._link.attached:
                self._link.send(protocol.fd_message(held.info), held.fd)
        else:
            if fd is not None:
                os.close(fd)
            log.warning("guard holder: unexpected %s from the standby", message.op)

    def _on_primary_link(self, _fd: int, _mask: int) -> None:
        """STANDBY: copies of later fds, the primary's guard status, or our retirement."""
        role = self.role
        if not isinstance(role, Standby):
            return
        got = receive(role.primary, "the primary")
        if got is None:
            self._resume(role)
            return
        message, fd = got
        if message.op is Op.FD and fd is not None:
            entry = LedgerEntry.from_wire(message.body.get("fd"))
            self._host.adopt(fd, entry.info, entry.start_time, forward=False)
        elif message.op is Op.STATUS:
            self.role = role.status(message.bool_field("guard"))
        elif message.op is Op.LOST:
            first, entries = handover.parse_lost(message)
            self._losses.replace(entries, first=first)
        elif message.op is Op.RETIRE:
            self._retire(role)
        else:
            if fd is not None:
                os.close(fd)
            log.warning("guard holder: unexpected %s from the primary", message.op)

    def _resume(self, role: Standby) -> None:
        """STANDBY -> PRIMARY: the successor died (or exited). We hold every fd it held."""
        self._drop_link(role.primary)
        resumed = role.resume(self._link.timeout, self._clock.monotonic())
        self.role = resumed
        self._endpoints.listen(True)
        self._losses.dirty = True
        if resumed.quiet_until is None:
            self._host.takeover("the successor holder is gone; resuming as primary")
        else:
            self._host.sync_answering()
            log.warning(
                "guard holder: the successor holder is gone; resuming as primary with %d fds, waiting up to "
                "%gs for its guard (which answers alone meanwhile) to attach here",
                len(self._fds),
                self._link.timeout,
            )

    def _retire(self, role: Standby) -> None:
        """STANDBY -> RETIRED: our primary handed over to a newer holder, whose standby it is."""
        self._fds.close()
        self._drop_link(role.primary)
        self._endpoints.drop_copies()
        self.role = role.retire()
        log.info("guard holder: a newer standby replaced this one; holding nothing, waiting to be stopped")

    def check_quiet(self) -> None:
        role = self.role
        if not isinstance(role, Primary | HandingOver) or role.quiet_until is None:
            return
        if self._clock.monotonic() >= role.quiet_until:
            self.role = role.quiet(None)
            if not self._link.attached:
                self._host.takeover(f"no guard attached within {self._link.timeout:g}s of resuming")

    def close(self) -> None:
        """Close every link to another holder (at exit)."""
        for link in _links_of(self.role):
            link.close()


def _links_of(role: HolderRole) -> list[socket.socket]:
    if isinstance(role, Standby):
        return [role.primary]
    found = [succession.standby_of(role)]
    if isinstance(role, HandingOver):
        found.append(role.successor)
    return [link for link in found if link is not None]


__all__ = ["DRAIN_TIMEOUT", "Host", "Succession"]
