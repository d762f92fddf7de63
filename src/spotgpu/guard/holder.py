"""The fd holder: the process that owns the seccomp listener and never lets a notify fd die.

Decides only one thing itself: while no guard is attached, every caught call continues at once.
Its life-cycle decisions (who answers, when it may exit) come from
:mod:`spotgpu.guard.succession`. Side effects: listens on the listener socket (runc connects
there) and on the control socket (the agent's guard and successor holders connect there), keeps
a copy of every notify fd, answers notifications while no guard is attached, after a guard goes
away releases the calls it reported holding and restarts any call it left stranded
(:mod:`spotgpu.guard.kick`), hands everything to a successor holder
(:mod:`spotgpu.guard.handover`), keeps the ledger (:mod:`spotgpu.guard.ledger`) and a
readiness file.

Why a separate process: if the last copy of a notify fd closes, every call the filter catches
in that container fails with ENOSYS for the rest of the container's life (seccomp(2)). The
holder is small, single-threaded apart from short per-connection readers, imports nothing
heavy, and is deployed as its own DaemonSet so agent restarts never touch it. The guard keeps
copies of all fds too, so a holder crash or restart is survived as well: the guard goes on
answering and hands its fds to the next holder when it attaches. A holder upgrade hands
everything over before the old holder exits (docs/guard.md, "Handover").

Structure: :class:`FdHolder` wires the parts and owns what they share (the notify-fd table,
whether it answers, the exit request): :mod:`~spotgpu.guard.loop` (the epoll loop),
:mod:`~spotgpu.guard.endpoints` (the listening sockets, runc's connections),
:mod:`~spotgpu.guard.guardlink` (the guard connections), :mod:`~spotgpu.guard.succession_io`
(the role and the handover's I/O) and :mod:`~spotgpu.guard.losses` (lost fds, the ledger).

Timing bounds (see docs/guard.md): a guard that dies is noticed at once (its socket closes);
a guard that stops answering is detached after ``guard_timeout`` without a message (it sends
a ping every ``guard_timeout / 4``); a holder asked to stop waits at most ``handover_timeout``
for a successor. Time comes from the injected :class:`~spotgpu.core.clock.Clock`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from spotgpu.core.clock import Clock, SystemClock
from spotgpu.guard import handover, kick, ledger, protocol, seccomp, succession
from spotgpu.guard.endpoints import Endpoints, bind_unix, peer_uid, unlink_if_ours
from spotgpu.guard.fdtable import HeldFd, NotifyFds
from spotgpu.guard.gate import ReleaseGate
from spotgpu.guard.guardlink import GuardConn, GuardLink, receive
from spotgpu.guard.ledger import LedgerEntry
from spotgpu.guard.listener import NotifyFdInfo, resolve_owner
from spotgpu.guard.loop import EventLoop
from spotgpu.guard.losses import Losses
from spotgpu.guard.protocol import Op
from spotgpu.guard.rule import GUARD_MATCH, IoctlMatch
from spotgpu.guard.succession import ExitReason, HandingOver, Retired, Role
from spotgpu.guard.succession_io import Succession
from spotgpu.guard.support import GuardSupport

log = logging.getLogger(__name__)

DEFAULT_GUARD_TIMEOUT: Final = 3.0
DEFAULT_HANDOVER_TIMEOUT: Final = 60.0
PULL_TIMEOUT: Final = 10.0
"""A successor's whole attempt to take over from a running predecessor."""


@dataclass(frozen=True, slots=True)
class HolderSettings:
    guard_timeout: float
    handover_timeout: float
    match: IoctlMatch
    """What the rule catches: stranded calls of this kind are restarted after a guard is lost."""
    inherit: bool
    ready_file: Path | None


@dataclass(slots=True)
class _ExitRequest:
    requested_at: float | None = None
    """When the holder was asked to stop (SIGTERM); None while it was not."""
    announced: bool = False
    reason: ExitReason | None = None


class FdHolder:
    """``spotgpu guard-holder``: see the module docstring. Use :meth:`serve` in the main thread.

    ``inherit``: on :meth:`start`, first try to take over from a holder already serving on
    ``control_path`` (a rolling upgrade or a restart next to a running holder).
    """

    def __init__(
        self,
        listener_path: Path,
        control_path: Path,
        support: GuardSupport,
        *,
        guard_timeout: float = DEFAULT_GUARD_TIMEOUT,
        handover_timeout: float = DEFAULT_HANDOVER_TIMEOUT,
        match: IoctlMatch = GUARD_MATCH,
        inherit: bool = True,
        ready_file: Path | None = None,
        ledger_path: Path | None = None,
        clock: Clock | None = None,
        gate: ReleaseGate | None = None,
    ) -> None:
        if guard_timeout <= 0 or handover_timeout <= 0:
            raise ValueError("guard_timeout and handover_timeout must be > 0")
        self.settings = HolderSettings(guard_timeout, handover_timeout, match, inherit, ready_file)
        self.support = support
        self.gate = gate
        """Clears an owner's GPUs of other pods' holders before this holder lets its call go
        on (:mod:`spotgpu.guard.gate`); None: released at once (no process walk)."""
        self.clock: Clock = SystemClock() if clock is None else clock
        self.loop = EventLoop("guard holder")
        self._stop = threading.Event()
        self.fds = NotifyFds(self._watch_fd, self.loop.forget)
        self.endpoints = Endpoints(listener_path, control_path, self.loop, self._on_control)
        self.link = GuardLink(self.loop, self.clock, guard_timeout, self._on_guard, self._guard_detached)
        self.losses = Losses(
            ledger.path_for(control_path) if ledger_path is None else ledger_path, self.clock, guard_timeout
        )
        self.succession = Succession(
            self,
            loop=self.loop,
            endpoints=self.endpoints,
            fds=self.fds,
            link=self.link,
            losses=self.losses,
            clock=self.clock,
        )
        self._exit = _ExitRequest()
        self._started = False
        self._answering = False
        self.continued = 0
        """Calls this holder answered itself (for logs and tests)."""

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Take over from a running predecessor if there is one, else open the sockets."""
        control_path = self.endpoints.control_path
        inherited = handover.pull(control_path, PULL_TIMEOUT) if self.settings.inherit else None
        takeover_reason = self.succession.install(inherited) if inherited is not None else ""
        self.endpoints.open(self.support.available)
        self.endpoints.listen(True)
        if self.support.available:
            log.info("guard holder: listening on %s, control on %s", self.endpoints.listener_path, control_path)
        else:
            log.warning("guard holder: %s; not opening %s", self.support.summary(), self.endpoints.listener_path)
        if inherited is None or not inherited.complete:
            self.losses.load_suspects(self.fds.keys())
        self.sync_answering(force=True)
        if takeover_reason:
            self.takeover(takeover_reason)
        self.losses.dirty = True  # written by the loop, after its first poll: not in the handover's pause
        if self.settings.ready_file is not None:
            self.settings.ready_file.write_text(f"{os.getpid()}\n")
        self._started = True

    def stop(self) -> None:
        """Stop at once (a second SIGTERM): no waiting for a successor."""
        self._stop.set()
        self.loop.poke()

    def request_exit(self) -> None:
        """Stop as soon as nothing depends on this process alone (:func:`succession.decide_exit`):
        a successor took the fds, or the handover timeout ran out. Safe in a signal handler
        (with a clock that takes no lock, as :class:`~spotgpu.core.clock.SystemClock`)."""
        if self._exit.requested_at is None:
            self._exit.requested_at = self.clock.monotonic()
        self.loop.poke()

    def serve(self) -> None:
        """Run until stopped; then close the sockets (the fds stay open until :meth:`close`)."""
        if not self._started:
            self.start()
        steps = (
            self.adopt_incoming,
            self.link.check_silence,
            self.succession.check_handover,
            self.succession.check_quiet,
            self._check_suspects,
            self._prune_lost,
            self._write_ledger,
            self._check_exit,
        )
        while not self._stop.is_set():
            self.loop.poll(self._next_timeout())
            for step in steps:
                try:
                    step()
                except Exception:  # never let one bad step end the process that keeps the fds
                    log.exception("guard holder: housekeeping (%s) failed", step.__name__)
        self._close_sockets()

    def close(self) -> None:
        """Close every fd (their containers' filtered calls then fail with ENOSYS unless another
        process holds copies: only at exit)."""
        self._close_sockets()
        self.fds.close()
        self.succession.close()
        if self.settings.ready_file is not None:
            with contextlib.suppress(OSError):
                self.settings.ready_file.unlink()
        self.loop.close()

    @property
    def fd_count(self) -> int:
        return len(self.fds)

    @property
    def guard_attached(self) -> bool:
        return self.link.attached

    @property
    def role(self) -> Role:
        return self.succession.role.kind

    @property
    def exit_reason(self) -> ExitReason | None:
        """Why :meth:`serve` returned, when it decided to leave (None after :meth:`stop`)."""
        return self._exit.reason

    def lost(self) -> list[LedgerEntry]:
        return self.losses.lost()

    def _next_timeout(self) -> float:
        now = self.clock.monotonic()
        deadlines = [now + 1.0]
        for deadline in (self.link.deadline(), self.succession.deadline(), self.losses.suspects_until):
            if deadline is not None:
                deadlines.append(deadline)
        exit_at = self._exit.requested_at
        if exit_at is not None and exit_at + self.settings.handover_timeout > now:
            deadlines.append(exit_at + self.settings.handover_timeout)  # (past it: exit is decided)
        return max(0.0, min(deadlines) - now)

    def _close_sockets(self) -> None:
        self.endpoints.close(unlink=succession.removes_socket_files(self.succession.role))
        self.link.close()

    # -- notify fds --------------------------------------------------------------------------
    def sync_answering(self, *, force: bool = False) -> None:
        """Poll the notify fds for calls exactly while this holder is the one to answer them
        (EPOLLHUP, a container's exit, is reported either way)."""
        answering = succession.answers(self.succession.role, self.link.attached)
        if answering == self._answering and not force:
            return
        self._answering = answering
        for held in self.fds:
            self.loop.modify(held.fd, select.EPOLLIN if answering else 0)

    def _watch_fd(self, fd: int) -> None:
        self.loop.watch(fd, self._on_notify_fd, select.EPOLLIN if self._answering else 0)

    def adopt_incoming(self) -> None:
        """Hold the notify fds runc sent (read by the listener's threads)."""
        role = self.succession.role
        if (isinstance(role, HandingOver) and role.sent_at is not None) or isinstance(role, Retired):
            return  # the state is in flight: decide after the commit or the abort
        for conn in self.endpoints.incoming():
            resolution = resolve_owner(conn.state)
            if resolution.warning:
                log.warning("guard holder: %s", resolution.warning)
            info = NotifyFdInfo(
                key=uuid.uuid4().hex,
                container_id=conn.state.container_id,
                pid=conn.state.pid,
                init_pid=conn.state.init_pid,
                exec=conn.state.is_exec,
                owner=resolution.owner,
            )
            if self.adopt(conn.fd, info) is not None and self.link.attached:
                self.link.send(protocol.fd_message(info), conn.fd)

    def adopt(
        self, fd: int, info: NotifyFdInfo, start_time: int | None = None, *, forward: bool = True, verify: bool = False
    ) -> HeldFd | None:
        """Hold ``fd`` (None, and ``fd`` closed, when its key is here already); ``forward``: copy
        it to the other holder; ``verify``: check that it is a notify fd (a guard sent it)."""
        if start_time is None and info.key not in self.fds:
            start_time = ledger.process_start_time(info.pid) or 0
        held = self.fds.adopt(fd, info, start_time or 0, verify=verify)
        if held is None:
            return None
        self.losses.dirty = True
        if self.losses.returned(info.key, info.container_id):
            self._publish_lost()
        if forward:
            self.succession.share(held)
        log.log(
            logging.DEBUG if info.exec else logging.INFO,  # exec probes come every few seconds
            "guard holder: holding notify fd of %s %s (pid %d, owner %s)",
            "exec in" if info.exec else "container",
            info.container_id,
            info.pid,
            info.owner or "unknown",
        )
        return held

    def _on_notify_fd(self, fd: int, mask: int) -> None:
        held = self.fds.by_fd(fd)
        if held is None:
            return
        if mask & select.EPOLLIN and self._answering:
            try:
                notification = seccomp.recv(fd)
                if notification is not None:
                    self._clear_for(notification.pid)
                if notification is not None and seccomp.send_continue(fd, notification.id):
                    self.continued += 1
            except seccomp.SeccompError as exc:
                log.error("guard holder: notify fd %s: %s", held.key, exc)
        if mask & (select.EPOLLHUP | select.EPOLLERR):
            self._drop(held.key)

    def _drop(self, key: str) -> None:
        held = self.fds.drop(key)
        self.link.forget_holds(key)
        self.losses.dirty = True
        log.log(
            logging.DEBUG if held.info.exec else logging.INFO,
            "guard holder: the %s of %s exited; its notify fd is closed",
            "exec'd process" if held.info.exec else "last process",
            held.info.container_id,
        )

    # -- the guard -------------------------------------------------------------------------
    def _on_control(self, conn: socket.socket) -> None:
        self.link.add(conn)

    def _on_guard(self, conn: GuardConn) -> None:
        got = receive(conn.sock, "a control peer")
        if got is None:
            self.link.end(conn, "connection closed")
            return
        message, fd = got
        conn.last_seen = self.clock.monotonic()
        try:
            self._handle(conn, message, fd)
        except protocol.ProtocolError as exc:
            if fd is not None:
                os.close(fd)
            log.warning("guard holder: %s; detaching that peer", exc)
            self.link.end(conn, str(exc), tell=True)

    def _handle(self, conn: GuardConn, message: protocol.Message, fd: int | None) -> None:
        if message.op is Op.HANDOVER and not conn.attached:
            self.succession.begin(conn, message)
        elif message.op is Op.ATTACH:
            if conn.attached:
                raise protocol.ProtocolError("attach sent twice on one connection")
            self._attach(conn, set(message.keys_field("have")))
        elif not conn.attached:
            raise protocol.ProtocolError(f"{message.op} before attach")
        elif message.op is Op.FD:
            assert fd is not None
            self.adopt(fd, message.fd_info(), verify=True)
        elif message.op is Op.HOLD:
            self.link.reported.add((message.str_field("key"), message.int_field("id")))
        elif message.op is Op.DONE:
            self.link.reported.discard((message.str_field("key"), message.int_field("id")))
        elif message.op is not Op.PING:
            raise protocol.ProtocolError(f"unexpected {message.op} from a guard")

    def _attach(self, conn: GuardConn, have: set[str]) -> None:
        self.link.attach(conn)  # a guard attached before is detached (and the fds taken back) first
        self.succession.unquiet()
        self.sync_answering()  # stop answering: the guard does from now on
        self.link.send(
            protocol.encode(
                Op.WELCOME,
                version=protocol.PROTOCOL_VERSION,
                holder_pid=os.getpid(),
                have=sorted(self.fds.keys()),
                available=self.support.available,
                support=self.support.summary(),
            )
        )
        for held in self.fds:
            if held.key not in have:
                self.link.send(protocol.fd_message(held.info), held.fd)
        for data in self.losses.messages():
            self.link.send(data)
        self.link.send(protocol.encode(Op.SYNCED))
        self._send_status()
        log.info("guard holder: guard attached; it answers calls for %d fds now", len(self.fds))

    def _guard_detached(self, reason: str) -> None:
        self.takeover(f"guard detached ({reason})")
        self._send_status()

    def _send_status(self) -> None:
        self.succession.send_status(self.link.attached)

    def takeover(self, reason: str) -> None:
        """Become the one answering: release the calls a lost guard reported holding, restart
        calls stranded in a notification nobody will answer, then answer everything."""
        started = self.clock.monotonic()
        released = 0
        holds = self.link.take_holds()
        for key in sorted({key for key, _ in holds}):
            held = self.fds.get(key)
            if held is not None:
                self._clear_for(_alive_pid(held.info.pid, held.info.init_pid))
        for key, nid in holds:
            held = self.fds.get(key)
            try:
                if held is not None and seccomp.send_continue(held.fd, nid):
                    released += 1
            except seccomp.SeccompError as exc:
                log.error("guard holder: cannot continue reported call %d: %s", nid, exc)
        self.succession.unquiet()
        report = kick.kick_blocked(self.settings.match, pid_namespaces=self._pid_namespaces())
        self.sync_answering()
        log.warning(
            "guard holder: %s; took back %d fds, released %d held calls, restarted %d stranded calls%s in %.1f ms",
            reason,
            len(self.fds),
            released,
            len(report.restarted),
            f", FAILED to restart {report.failed}" if report.failed else "",
            (self.clock.monotonic() - started) * 1e3,
        )

    def _clear_for(self, pid: int | None) -> None:
        """The release check before this holder lets a call of ``pid``'s container go on."""
        if self.gate is None or pid is None:
            return
        line = self.gate.clear(pid)
        log.warning("guard holder: releasing a call of pid %d without a guard: %s", pid, line)

    def _pid_namespaces(self) -> set[str]:
        namespaces = set()
        for held in self.fds:
            for pid in (held.info.pid, held.info.init_pid):
                with contextlib.suppress(OSError):
                    namespaces.add(os.readlink(f"/proc/{pid}/ns/pid"))
        return namespaces

    # -- losses ------------------------------------------------------------------------------
    def _check_suspects(self) -> None:
        # Only a plain primary: mid-handover the guard's connection may be on its way.
        if self.role is Role.PRIMARY and self.losses.check_suspects(self.fds.keys()):
            self._publish_lost()

    def _prune_lost(self) -> None:
        if self.role is Role.PRIMARY and self.losses.prune():
            self._publish_lost()

    def _publish_lost(self) -> None:
        self.losses.dirty = True
        for data in self.losses.messages():
            self.link.send(data)
            self.succession.to_standby(data)

    def _write_ledger(self) -> None:
        if self.role in (Role.PRIMARY, Role.HANDING_OVER):
            self.losses.write(h.entry for h in self.fds)

    # -- exit ------------------------------------------------------------------------------
    def _check_exit(self) -> None:
        if self._exit.requested_at is None or self._stop.is_set():
            return
        state = succession.HolderState(
            role=self.role,
            fds=len(self.fds),
            guard_attached=self.link.attached,
            has_standby=succession.standby_of(self.succession.role) is not None,
            exit_requested_at=self._exit.requested_at,
            handover_timeout=self.settings.handover_timeout,
            now=self.clock.monotonic(),
        )
        decision = succession.decide_exit(state)
        if decision is None:
            if not self._exit.announced:
                self._exit.announced = True
                log.warning(
                    "guard holder: asked to stop while holding %d notify fds (%s); waiting up to %gs for a "
                    "successor holder to take them, answering as usual meanwhile (signal again to exit at once)",
                    len(self.fds),
                    "a guard holds copies" if self.link.attached else "no guard attached: this is the only copy",
                    self.settings.handover_timeout,
                )
            return
        self._exit.reason = decision.reason
        self._log_exit(decision.reason)
        self._stop.set()

    def _log_exit(self, reason: ExitReason) -> None:
        count = len(self.fds)
        if reason is ExitReason.FDS_LOST:
            log.error(
                "guard holder: no successor holder within %gs and no guard attached: exiting closes the last "
                "copies of %d notify fds; GPU session starts in these fail with ENOSYS until they restart: %s",
                self.settings.handover_timeout,
                count,
                ", ".join(sorted(f"{h.info.container_id} ({h.info.owner or 'unknown'})" for h in self.fds)),
            )
        elif reason is ExitReason.GUARD_HOLDS_ALONE:
            log.warning(
                "guard holder: no successor holder within %gs; exiting; the attached guard keeps the only copies "
                "of %d notify fds until a holder starts",
                self.settings.handover_timeout,
                count,
            )
        else:
            log.info("guard holder: exiting (%s)", reason.value)


def _alive_pid(*pids: int) -> int | None:
    """The first of ``pids`` that names a running process (the container's caller or its init)."""
    for pid in pids:
        if pid > 0 and os.path.exists(f"/proc/{pid}"):
            return pid
    return None


__all__ = [
    "DEFAULT_GUARD_TIMEOUT",
    "DEFAULT_HANDOVER_TIMEOUT",
    "FdHolder",
    "HolderSettings",
    "bind_unix",
    "peer_uid",
    "unlink_if_ours",
]
