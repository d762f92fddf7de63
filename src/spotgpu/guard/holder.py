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

Timing bounds (see docs/guard.md): a guard that dies is noticed at once (its socket closes);
a guard that stops answering is detached after ``guard_timeout`` without a message (it sends
a ping every ``guard_timeout / 4``); a holder asked to stop waits at most ``handover_timeout``
for a successor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from spotgpu.core.errors import SpotgpuError
from spotgpu.guard import handover, kick, ledger, protocol, seccomp, succession
from spotgpu.guard.ledger import LedgerEntry
from spotgpu.guard.listener import Connection, NotifyFdInfo, read_connection, resolve_owner
from spotgpu.guard.protocol import Op
from spotgpu.guard.rule import GUARD_MATCH, IoctlMatch
from spotgpu.guard.succession import ExitReason, Role
from spotgpu.guard.support import GuardSupport

log = logging.getLogger(__name__)

DEFAULT_GUARD_TIMEOUT: Final = 3.0
DEFAULT_HANDOVER_TIMEOUT: Final = 60.0
PULL_TIMEOUT: Final = 10.0
"""A successor's whole attempt to take over from a running predecessor."""
DRAIN_TIMEOUT: Final = 3.0
"""Before sending its state, a predecessor lets listener connections it already accepted finish
(each reader gives up after 2 s)."""
SUSPECT_SLACK: Final = 1.0
"""Beyond ``guard_timeout``: how long a new holder waits for a guard to bring back the fds the
ledger recorded before it reports them lost (a live guard re-attaches within 0.5 s)."""
PRUNE_INTERVAL: Final = 2.0
"""How often the processes behind lost fds are checked (dropped from the list once gone)."""
_SO_PEERCRED: Final = struct.Struct("3i")


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


def _receive(sock: socket.socket, peer: str) -> tuple[protocol.Message, int | None] | None:
    """One control message; None when the peer is gone or broke the protocol (logged): every
    caller then treats the connection as ended."""
    try:
        return protocol.receive(sock)
    except (OSError, protocol.ProtocolError) as exc:
        log.warning("guard holder: bad message from %s: %s", peer, exc)
        return None


@dataclass(slots=True)
class _Held:
    fd: int
    entry: LedgerEntry

    @property
    def info(self) -> NotifyFdInfo:
        return self.entry.info


@dataclass(slots=True)
class _Guard:
    sock: socket.socket
    last_seen: float
    attached: bool = False


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
    ) -> None:
        if guard_timeout <= 0 or handover_timeout <= 0:
            raise ValueError("guard_timeout and handover_timeout must be > 0")
        self.listener_path = listener_path
        self.control_path = control_path
        self.support = support
        self.guard_timeout = guard_timeout
        self.handover_timeout = handover_timeout
        self.match = match
        self.inherit = inherit
        self.ready_file = ready_file
        self.ledger_path = ledger.path_for(control_path) if ledger_path is None else ledger_path
        self._fds: dict[str, _Held] = {}
        self._by_fd: dict[int, str] = {}
        self._guard: _Guard | None = None
        self._pending: dict[int, _Guard] = {}  # control connections before their first message
        self._reported: set[tuple[str, int]] = set()
        self._incoming: queue.Queue[Connection] = queue.Queue()
        self._readers = 0
        self._readers_lock = threading.Lock()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._stop = threading.Event()
        self._epoll = select.epoll()
        self._epoll.register(self._wake, select.EPOLLIN)
        self._listener: socket.socket | None = None
        self._control: socket.socket | None = None
        self._listening = False
        self._inodes: dict[Path, int] = {}
        self._started = False
        self._answering = False
        # succession (see spotgpu.guard.succession)
        self._role = Role.PRIMARY
        self._successor: socket.socket | None = None  # HANDING_OVER: the link to the successor
        self._handover_started = 0.0
        self._handover_sent_at: float | None = None
        self._paused: list[_Guard] = []  # guard connections not read while the state is in flight
        self._standby: socket.socket | None = None  # PRIMARY: the link to our standby
        self._primary: socket.socket | None = None  # STANDBY: the link to our primary
        self._primary_has_guard = False
        self._quiet_until: float | None = None
        self._exit_requested_at: float | None = None
        self._exit_announced = False
        self.exit_reason: ExitReason | None = None
        # losses (see spotgpu.guard.ledger)
        self._suspects: dict[str, LedgerEntry] = {}
        self._suspects_until: float | None = None
        self._lost: dict[str, LedgerEntry] = {}
        self._next_prune = 0.0
        self._ledger_dirty = False
        self._ledger_warned = False
        self.continued = 0
        """Calls this holder answered itself (for logs and tests)."""

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Take over from a running predecessor if there is one, else open the sockets. Without
        notify support the listener stays closed on purpose: then ``listener_ready`` is false and
        spotgpu-runtime never injects the rule."""
        inherited = handover.pull(self.control_path, PULL_TIMEOUT) if self.inherit else None
        takeover_reason = ""
        if inherited is not None:
            takeover_reason = self._install(inherited)
        if self._control is None:
            self._control, self._inodes[self.control_path] = bind_unix(self.control_path, socket.SOCK_SEQPACKET)
        if self.support.available and self._listener is None:
            self._listener, self._inodes[self.listener_path] = bind_unix(self.listener_path, socket.SOCK_STREAM)
        elif not self.support.available and self._listener is not None:
            unlink_if_ours(self.listener_path, self._inodes.pop(self.listener_path, -1))
            self._listener.close()
            self._listener = None
        self._listen(True)
        if self.support.available:
            log.info("guard holder: listening on %s, control on %s", self.listener_path, self.control_path)
        else:
            log.warning("guard holder: %s; not opening %s", self.support.summary(), self.listener_path)
        if inherited is None or not inherited.complete:
            self._load_suspects()
        self._sync_answering(force=True)
        if takeover_reason:
            self._takeover(takeover_reason)
        self._ledger_dirty = True  # written by the loop, after its first poll: not in the handover's pause
        if self.ready_file is not None:
            self.ready_file.write_text(f"{os.getpid()}\n")
        self._started = True

    def stop(self) -> None:
        """Stop at once (a second SIGTERM): no waiting for a successor."""
        self._stop.set()
        self._poke()

    def request_exit(self) -> None:
        """Stop as soon as nothing depends on this process alone (:func:`succession.decide_exit`):
        a successor took the fds, or the handover timeout ran out. Safe in a signal handler."""
        if self._exit_requested_at is None:
            self._exit_requested_at = time.monotonic()
        self._poke()

    def serve(self) -> None:
        """Run until stopped; then close the sockets (the fds stay open until :meth:`close`)."""
        if not self._started:
            self.start()
        while not self._stop.is_set():
            try:
                events = self._epoll.poll(self._next_timeout())
            except InterruptedError:
                continue
            for fd, mask in events:
                try:
                    self._dispatch(fd, mask)
                except Exception:  # never let one bad event end the process that keeps the fds
                    log.exception("guard holder: handling an event on fd %d failed", fd)
            for step in (
                self._adopt_incoming,
                self._check_guard_silence,
                self._check_handover,
                self._check_quiet,
                self._check_suspects,
                self._prune_lost,
                self._write_ledger,
                self._check_exit,
            ):
                try:
                    step()
                except Exception:
                    log.exception("guard holder: housekeeping (%s) failed", step.__name__)
        self._close_sockets()

    def close(self) -> None:
        """Close every fd (their containers' filtered calls then fail with ENOSYS unless another
        process holds copies: only at exit)."""
        self._close_sockets()
        for held in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(held.fd)
        self._fds.clear()
        self._by_fd.clear()
        for link in (self._successor, self._standby, self._primary):
            if link is not None:
                link.close()
        self._successor = self._standby = self._primary = None
        if self.ready_file is not None:
            with contextlib.suppress(OSError):
                self.ready_file.unlink()
        with contextlib.suppress(OSError):
            os.close(self._wake)
        self._epoll.close()

    @property
    def fd_count(self) -> int:
        return len(self._fds)

    @property
    def guard_attached(self) -> bool:
        return self._guard is not None and self._guard.attached

    @property
    def role(self) -> Role:
        return self._role

    def lost(self) -> list[LedgerEntry]:
        return list(self._lost.values())

    def _poke(self) -> None:
        with contextlib.suppress(OSError):
            os.eventfd_write(self._wake, 1)

    # -- event dispatch --------------------------------------------------------------------
    def _next_timeout(self) -> float:
        now = time.monotonic()
        deadlines = [now + 1.0]
        if self._guard is not None and not self._paused:
            deadlines.append(self._guard.last_seen + self.guard_timeout)
        for deadline in (self._quiet_until, self._suspects_until):
            if deadline is not None:
                deadlines.append(deadline)
        if self._exit_requested_at is not None and self._exit_requested_at + self.handover_timeout > now:
            deadlines.append(self._exit_requested_at + self.handover_timeout)  # (past it: exit is decided)
        if self._role is Role.HANDING_OVER:
            deadlines.append(now + 0.02)  # draining: look again soon
        return max(0.0, min(deadlines) - now)

    def _dispatch(self, fd: int, mask: int) -> None:
        if fd == self._wake:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._wake)
        elif self._listener is not None and fd == self._listener.fileno():
            self._accept_listener()
        elif self._control is not None and fd == self._control.fileno():
            self._accept_control()
        elif fd in self._by_fd:
            self._on_notify_fd(fd, mask)
        elif self._guard is not None and fd == self._guard.sock.fileno():
            self._on_guard(self._guard)
        elif fd in self._pending:
            self._on_guard(self._pending[fd])
        elif self._successor is not None and fd == self._successor.fileno():
            self._on_successor()
        elif self._standby is not None and fd == self._standby.fileno():
            self._on_standby_link()
        elif self._primary is not None and fd == self._primary.fileno():
            self._on_primary_link()

    def _listen(self, on: bool) -> None:
        """Accept (or stop accepting) on the listening sockets; they stay open either way."""
        if on == self._listening:
            return
        for sock in (self._listener, self._control):
            if sock is None:
                continue
            if on:
                self._epoll.register(sock.fileno(), select.EPOLLIN)
            else:
                with contextlib.suppress(OSError):
                    self._epoll.unregister(sock.fileno())
        self._listening = on

    def _sync_answering(self, *, force: bool = False) -> None:
        """Poll the notify fds for calls exactly while this holder is the one to answer them
        (EPOLLHUP, a container's exit, is reported either way)."""
        answering = succession.holder_answers(self._role, self.guard_attached, self._quiet_until is not None)
        if answering == self._answering and not force:
            return
        self._answering = answering
        for held in self._fds.values():
            self._epoll.modify(held.fd, select.EPOLLIN if answering else 0)

    def _accept_listener(self) -> None:
        assert self._listener is not None
        try:
            conn, _ = self._listener.accept()
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
            self._poke()

    def _adopt_incoming(self) -> None:
        if self._role is Role.HANDING_OVER and self._handover_sent_at is not None:
            return  # the state is in flight: decide after the commit or the abort
        if self._role is Role.RETIRED:
            return
        while True:
            try:
                conn = self._incoming.get_nowait()
            except queue.Empty:
                return
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
            held = self._adopt(conn.fd, info)
            if held is None:
                continue
            if self.guard_attached:
                self._send_guard(protocol.fd_message(info), conn.fd)
            if self._primary is not None:  # a late connection reached us after the handover
                self._send_link(self._primary, protocol.encode(Op.FD, fd=held.entry.to_wire()), conn.fd)

    def _adopt(
        self, fd: int, info: NotifyFdInfo, start_time: int | None = None, *, forward: bool = True
    ) -> _Held | None:
        if info.key in self._fds:
            os.close(fd)
            return None
        if start_time is None:
            start_time = ledger.process_start_time(info.pid) or 0
        held = _Held(fd, LedgerEntry(info, start_time))
        self._fds[info.key] = held
        self._by_fd[fd] = info.key
        self._epoll.register(fd, select.EPOLLIN if self._answering else 0)
        self._ledger_dirty = True
        self._suspects.pop(info.key, None)
        if self._lost.pop(info.key, None) is not None:
            log.warning("guard holder: the notify fd of %s came back after all; it is not lost", info.container_id)
            self._publish_lost()
        if forward and self._standby is not None:
            self._send_link(self._standby, protocol.encode(Op.FD, fd=held.entry.to_wire()), fd)
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
        key = self._by_fd[fd]
        if mask & select.EPOLLIN and self._answering:
            try:
                notification = seccomp.recv(fd)
                if notification is not None and seccomp.send_continue(fd, notification.id):
                    self.continued += 1
            except seccomp.SeccompError as exc:
                log.error("guard holder: notify fd %s: %s", key, exc)
        if mask & (select.EPOLLHUP | select.EPOLLERR):
            self._drop(key)

    def _drop(self, key: str) -> None:
        held = self._fds.pop(key)
        del self._by_fd[held.fd]
        with contextlib.suppress(OSError):
            self._epoll.unregister(held.fd)
        os.close(held.fd)
        self._reported = {r for r in self._reported if r[0] != key}
        self._ledger_dirty = True
        log.log(
            logging.DEBUG if held.info.exec else logging.INFO,
            "guard holder: the %s of %s exited; its notify fd is closed",
            "exec'd process" if held.info.exec else "last process",
            held.info.container_id,
        )

    # -- the guard -------------------------------------------------------------------------
    def _accept_control(self) -> None:
        assert self._control is not None
        try:
            conn, _ = self._control.accept()
        except OSError:
            return
        if peer_uid(conn) != os.geteuid():
            log.warning("guard holder: refused a control connection from uid %d", peer_uid(conn))
            conn.close()
            return
        conn.settimeout(0.5)  # a peer that stops reading must not stall this loop for long
        self._pending[conn.fileno()] = _Guard(conn, time.monotonic())
        self._epoll.register(conn.fileno(), select.EPOLLIN)

    def _on_guard(self, guard: _Guard) -> None:
        got = _receive(guard.sock, "a control peer")
        if got is None:
            self._end(guard, "connection closed")
            return
        message, fd = got
        guard.last_seen = time.monotonic()
        try:
            self._handle(guard, message, fd)
        except protocol.ProtocolError as exc:
            if fd is not None:
                os.close(fd)
            log.warning("guard holder: %s; detaching that peer", exc)
            self._end(guard, str(exc), tell=True)

    def _handle(self, guard: _Guard, message: protocol.Message, fd: int | None) -> None:
        if message.op is Op.HANDOVER and not guard.attached:
            self._begin_handover(guard, message)
        elif message.op is Op.ATTACH:
            if guard.attached:
                raise protocol.ProtocolError("attach sent twice on one connection")
            self._attach(guard, set(message.keys_field("have")))
        elif not guard.attached:
            raise protocol.ProtocolError(f"{message.op} before attach")
        elif message.op is Op.FD:
            assert fd is not None
            info = message.fd_info()
            if info.key in self._fds or not seccomp.is_notify_fd(fd):
                os.close(fd)
            else:
                self._adopt(fd, info)
        elif message.op is Op.HOLD:
            self._reported.add((message.str_field("key"), message.int_field("id")))
        elif message.op is Op.DONE:
            self._reported.discard((message.str_field("key"), message.int_field("id")))
        elif message.op is not Op.PING:
            raise protocol.ProtocolError(f"unexpected {message.op} from a guard")

    def _attach(self, guard: _Guard, have: set[str]) -> None:
        if self._guard is not None:
            self._end(self._guard, "another guard attached", tell=True, superseded=True)
        self._pending.pop(guard.sock.fileno(), None)
        self._guard = guard
        guard.attached = True
        self._quiet_until = None
        self._sync_answering()  # stop answering: the guard does from now on
        self._send_guard(
            protocol.encode(
                Op.WELCOME,
                version=protocol.PROTOCOL_VERSION,
                holder_pid=os.getpid(),
                have=sorted(self._fds),
                available=self.support.available,
                support=self.support.summary(),
            )
        )
        for key, held in list(self._fds.items()):
            if key not in have:
                self._send_guard(protocol.fd_message(held.info), held.fd)
        for data in handover.lost_messages(list(self._lost.values())):
            self._send_guard(data)
        self._send_guard(protocol.encode(Op.SYNCED))
        self._send_status()
        log.info("guard holder: guard attached; it answers calls for %d fds now", len(self._fds))

    def _send_guard(self, data: bytes, fd: int | None = None) -> None:
        guard = self._guard
        if guard is None:
            return
        try:
            protocol.send(guard.sock, data, fd)
        except OSError as exc:
            self._end(guard, f"send failed: {exc}")

    def _check_guard_silence(self) -> None:
        if self._paused:
            return  # not reading the guard while the state is in flight
        guard = self._guard
        if guard is not None and time.monotonic() - guard.last_seen > self.guard_timeout:
            self._end(guard, f"silent for more than {self.guard_timeout:g}s", tell=True)
        for pending in list(self._pending.values()):
            if time.monotonic() - pending.last_seen > self.guard_timeout:
                self._end(pending, "no attach")

    def _end(self, guard: _Guard, reason: str, *, tell: bool = False, superseded: bool = False) -> None:
        """Drop a control connection; if it was the attached guard, take every fd back.

        ``superseded``: another guard attached; the dropped one must not come back (two agents
        on one node would otherwise take the fds from each other in turn).
        """
        if tell:
            with contextlib.suppress(OSError):
                protocol.send(guard.sock, protocol.encode(Op.DETACH, reason=reason, superseded=superseded))
        self._pending.pop(guard.sock.fileno(), None)
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(guard.sock.fileno())
        guard.sock.close()
        if guard is not self._guard:
            return
        self._guard = None
        self._takeover(f"guard detached ({reason})")
        self._send_status()

    def _takeover(self, reason: str) -> None:
        """Become the one answering: release the calls a lost guard reported holding, restart
        calls stranded in a notification nobody will answer, then answer everything."""
        started = time.monotonic()
        released = 0
        for key, nid in sorted(self._reported):
            held = self._fds.get(key)
            try:
                if held is not None and seccomp.send_continue(held.fd, nid):
                    released += 1
            except seccomp.SeccompError as exc:
                log.error("guard holder: cannot continue reported call %d: %s", nid, exc)
        self._reported.clear()
        self._quiet_until = None
        report = kick.kick_blocked(self.match, pid_namespaces=self._pid_namespaces())
        self._sync_answering()
        log.warning(
            "guard holder: %s; took back %d fds, released %d held calls, restarted %d stranded calls%s in %.1f ms",
            reason,
            len(self._fds),
            released,
            len(report.restarted),
            f", FAILED to restart {report.failed}" if report.failed else "",
            (time.monotonic() - started) * 1e3,
        )

    def _pid_namespaces(self) -> set[str]:
        namespaces = set()
        for held in self._fds.values():
            for pid in (held.info.pid, held.info.init_pid):
                with contextlib.suppress(OSError):
                    namespaces.add(os.readlink(f"/proc/{pid}/ns/pid"))
        return namespaces

    # -- handover: the successor's side -----------------------------------------------------
    def _install(self, inherited: handover.Inheritance) -> str:
        """Take what a predecessor handed over (at start, before the loop runs). Returns a reason
        when this holder must take over answering right away: its predecessor died part-way and
        no guard answers instead."""
        now = time.monotonic()
        for role, (sock, inode) in inherited.sockets.items():
            if role == "listener":
                self._listener, path = sock, self.listener_path
            else:
                self._control, path = sock, self.control_path
            self._inodes[path] = inode
        for fd, entry in inherited.fds:
            self._adopt(fd, entry.info, entry.start_time, forward=False)
        self._lost = {e.key: e for e in inherited.lost}
        for got in inherited.guards:
            got.sock.settimeout(0.5)
            guard = _Guard(got.sock, now - got.silent_s, attached=got.attached and self._guard is None)
            self._epoll.register(got.sock.fileno(), select.EPOLLIN)
            if guard.attached:
                self._guard, self._reported = guard, set(got.reported)
            else:
                self._pending[got.sock.fileno()] = guard
        pid = inherited.predecessor_pid
        if inherited.complete:
            assert inherited.link is not None
            self._standby = inherited.link
            self._epoll.register(self._standby.fileno(), select.EPOLLIN)
            if inherited.quiet_s > 0 and not self.guard_attached:
                self._quiet_until = now + inherited.quiet_s
            log.info(
                "guard holder: took over %d notify fds%s from holder pid %d, which stands by until it exits",
                len(self._fds),
                " and the attached guard" if self.guard_attached else "",
                pid,
            )
            return ""
        log.error(
            "guard holder: holder pid %d died while handing over; starting with the %d fds received%s",
            pid,
            len(self._fds),
            " and its guard" if self.guard_attached else "",
        )
        if self.guard_attached:
            return ""
        if inherited.guard_expected:  # its guard answers alone until it re-attaches here
            self._quiet_until = now + self.guard_timeout
            return ""
        return f"holder pid {pid} died while handing over"

    # -- handover: the predecessor's side ---------------------------------------------------
    def _begin_handover(self, conn: _Guard, message: protocol.Message) -> None:
        version = message.int_field("version")
        refusal = succession.refuse_handover(self._role, version, protocol.PROTOCOL_VERSION)
        if refusal is not None:
            with contextlib.suppress(OSError):
                protocol.send(conn.sock, protocol.encode(Op.DETACH, reason=refusal.reason, retry=refusal.retry))
            self._end(conn, f"handover refused: {refusal.reason}")
            return
        self._pending.pop(conn.sock.fileno(), None)
        self._successor = conn.sock
        self._role = Role.HANDING_OVER
        self._handover_started = time.monotonic()
        self._handover_sent_at = None
        self._listen(False)  # new connections wait in the backlog for whoever commits
        log.info("guard holder: successor pid %s asks to take over %d fds", message.body.get("pid"), len(self._fds))

    def _check_handover(self) -> None:
        if self._role is not Role.HANDING_OVER:
            return
        now = time.monotonic()
        if self._handover_sent_at is None:
            with self._readers_lock:
                busy = self._readers > 0
            if busy and now - self._handover_started < DRAIN_TIMEOUT:
                return
            self._adopt_incoming()
            self._send_state()
        elif now - self._handover_sent_at > self.guard_timeout:  # as silent as a guard we would detach
            self._abort_handover(f"the successor did not confirm within {self.guard_timeout:g}s")

    def _send_state(self) -> None:
        assert self._successor is not None
        now = time.monotonic()
        self._paused = [g for g in (self._guard, *self._pending.values()) if g is not None]
        for guard in self._paused:  # from here on the guard's messages wait for the successor
            with contextlib.suppress(OSError):
                self._epoll.unregister(guard.sock.fileno())
        sockets = [
            (role, sock.fileno(), self._inodes.get(path, -1))
            for role, sock, path in (
                ("listener", self._listener, self.listener_path),
                ("control", self._control, self.control_path),
            )
            if sock is not None
        ]
        try:
            handover.send_state(
                self._successor,
                sockets=sockets,
                fds=[(h.fd, h.entry) for h in self._fds.values()],
                guards=[
                    handover.OutgoingGuard(
                        g.sock.fileno(),
                        g.attached,
                        tuple(sorted(self._reported)) if g.attached else (),
                        now - g.last_seen,
                    )
                    for g in self._paused
                ],
                lost=list(self._lost.values()),
                quiet_s=0.0 if self._quiet_until is None else self._quiet_until - now,
            )
        except OSError as exc:
            self._abort_handover(f"sending the state failed: {exc}")
            return
        self._handover_sent_at = now

    def _on_successor(self) -> None:
        assert self._successor is not None
        got = _receive(self._successor, "the successor")
        if got is None:
            self._abort_handover("the successor went away")
        elif got[0].op is Op.TAKEN and self._handover_sent_at is not None:
            self._commit()
        else:
            if got[1] is not None:
                os.close(got[1])
            self._abort_handover(f"unexpected {got[0].op} from the successor")

    def _commit(self) -> None:
        link = self._successor
        assert link is not None
        self._role = Role.STANDBY
        self._sync_answering()  # stop answering *before* the successor may start
        try:
            protocol.send(link, protocol.encode(Op.STANDBY, pid=os.getpid()))
        except OSError as exc:
            self._abort_handover(f"cannot confirm to the successor: {exc}")
            return
        had_guard = self.guard_attached
        for guard in self._paused:  # the successor owns these connections now
            guard.sock.close()
        self._paused, self._guard, self._pending, self._reported = [], None, {}, set()
        if self._standby is not None:  # our own standby is obsolete: the successor has a newer one
            self._send_link(self._standby, protocol.encode(Op.RETIRE))
            self._drop_link(self._standby)
            self._standby = None
        self._successor, self._primary = None, link
        self._primary_has_guard = had_guard
        self._quiet_until = None
        self._suspects, self._suspects_until = {}, None
        log.info(
            "guard holder: handed %d fds%s over to successor pid %d in %.1f ms; standing by",
            len(self._fds),
            " and the attached guard" if had_guard else "",
            handover.peer_pid(link),
            (time.monotonic() - self._handover_started) * 1e3,
        )

    def _abort_handover(self, reason: str) -> None:
        link = self._successor
        self._successor = None
        if link is not None:
            with contextlib.suppress(OSError):
                protocol.send(link, protocol.encode(Op.DETACH, reason=f"handover aborted: {reason}", retry=True))
            self._drop_link(link)
        self._role = Role.PRIMARY
        self._handover_sent_at = None
        now = time.monotonic()
        for guard in self._paused:
            guard.last_seen = now
            self._epoll.register(guard.sock.fileno(), select.EPOLLIN)
        self._paused = []
        self._listen(True)
        self._sync_answering()
        log.warning("guard holder: handover aborted (%s); serving on", reason)

    # -- handover: the links between primary and standby ------------------------------------
    def _send_link(self, link: socket.socket, data: bytes, fd: int | None = None) -> None:
        try:
            protocol.send(link, data, fd)
        except OSError as exc:
            log.warning(
                "guard holder: the link to the %s broke: %s", "standby" if link is self._standby else "peer", exc
            )

    def _drop_link(self, link: socket.socket) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(link.fileno())
        link.close()

    def _send_status(self) -> None:
        if self._standby is not None:
            self._send_link(self._standby, protocol.encode(Op.STATUS, guard=self.guard_attached))

    def _on_standby_link(self) -> None:
        """PRIMARY: our standby writes only to hand us a connection that reached it late."""
        assert self._standby is not None
        got = _receive(self._standby, "the standby")
        if got is None:
            log.info("guard holder: the standby holder exited")
            self._drop_link(self._standby)
            self._standby = None
            return
        message, fd = got
        if message.op is Op.FD and fd is not None:
            entry = ledger.LedgerEntry.from_wire(message.body.get("fd"))
            held = self._adopt(fd, entry.info, entry.start_time, forward=False)
            if held is not None and self.guard_attached:
                self._send_guard(protocol.fd_message(held.info), held.fd)
        else:
            if fd is not None:
                os.close(fd)
            log.warning("guard holder: unexpected %s from the standby", message.op)

    def _on_primary_link(self) -> None:
        """STANDBY: copies of later fds, the primary's guard status, or our retirement."""
        assert self._primary is not None
        got = _receive(self._primary, "the primary")
        if got is None:
            self._resume()
            return
        message, fd = got
        if message.op is Op.FD and fd is not None:
            entry = ledger.LedgerEntry.from_wire(message.body.get("fd"))
            self._adopt(fd, entry.info, entry.start_time, forward=False)
        elif message.op is Op.STATUS:
            self._primary_has_guard = message.bool_field("guard")
        elif message.op is Op.LOST:
            first, entries = handover.parse_lost(message)
            if first:
                self._lost = {}
            self._lost.update((e.key, e) for e in entries)
        elif message.op is Op.RETIRE:
            self._retire()
        else:
            if fd is not None:
                os.close(fd)
            log.warning("guard holder: unexpected %s from the primary", message.op)

    def _resume(self) -> None:
        """STANDBY -> PRIMARY: the successor died (or exited). We hold every fd it held."""
        assert self._primary is not None
        self._drop_link(self._primary)
        self._primary = None
        self._role = Role.PRIMARY
        self._listen(True)
        self._ledger_dirty = True
        self._quiet_until = succession.quiet_until(self._primary_has_guard, self.guard_timeout, time.monotonic())
        if self._quiet_until is None:
            self._takeover("the successor holder is gone; resuming as primary")
        else:
            self._sync_answering()
            log.warning(
                "guard holder: the successor holder is gone; resuming as primary with %d fds, waiting up to "
                "%gs for its guard (which answers alone meanwhile) to attach here",
                len(self._fds),
                self.guard_timeout,
            )

    def _retire(self) -> None:
        """STANDBY -> RETIRED: our primary handed over to a newer holder, whose standby it is."""
        assert self._primary is not None
        for key in list(self._fds):
            held = self._fds.pop(key)
            with contextlib.suppress(OSError):
                self._epoll.unregister(held.fd)
            os.close(held.fd)
        self._by_fd.clear()
        self._drop_link(self._primary)
        self._primary = None
        for sock in (self._listener, self._control):
            if sock is not None:
                sock.close()  # our copies only: the same sockets live on in the newer holders
        self._listener = self._control = None
        self._inodes.clear()
        self._role = Role.RETIRED
        log.info("guard holder: a newer standby replaced this one; holding nothing, waiting to be stopped")

    def _check_quiet(self) -> None:
        if self._quiet_until is not None and time.monotonic() >= self._quiet_until:
            self._quiet_until = None
            if not self.guard_attached:
                self._takeover(f"no guard attached within {self.guard_timeout:g}s of resuming")

    # -- losses ------------------------------------------------------------------------------
    def _load_suspects(self) -> None:
        """After a start without a complete handover: which fds did the last holder hold that
        are not here? A live guard brings them back within its reconnect interval."""
        book = ledger.read(self.ledger_path)
        if book is None:
            return
        self._suspects = ledger.unreturned([*book.held, *book.lost], self._fds.keys(), ledger.is_running)
        if self._suspects:
            self._suspects_until = time.monotonic() + self.guard_timeout + SUSPECT_SLACK
            log.info(
                "guard holder: the previous holder (pid %d) held %d notify fds of running processes that are "
                "not here; waiting %.1fs for a guard to bring them back",
                book.holder_pid,
                len(self._suspects),
                self.guard_timeout + SUSPECT_SLACK,
            )

    def _check_suspects(self) -> None:
        # Only a plain primary: mid-handover the guard's connection may be on its way.
        if self._suspects_until is None or time.monotonic() < self._suspects_until or self._role is not Role.PRIMARY:
            return
        self._suspects_until = None
        lost = ledger.unreturned(self._suspects.values(), self._fds.keys(), ledger.is_running)
        self._suspects = {}
        if not lost:
            return
        self._lost.update(lost)
        for entry in lost.values():
            log.error(
                "guard holder: the notify fd of %s %s (pid %d, owner %s) was LOST: its holder and guard died "
                "together; its caught GPU session starts fail with ENOSYS until the container restarts",
                "exec in" if entry.info.exec else "container",
                entry.info.container_id,
                entry.info.pid,
                entry.info.owner or "unknown",
            )
        self._publish_lost()

    def _prune_lost(self) -> None:
        now = time.monotonic()
        if not self._lost or now < self._next_prune or self._role is not Role.PRIMARY:
            return
        self._next_prune = now + PRUNE_INTERVAL
        gone = [key for key, entry in self._lost.items() if not ledger.is_running(entry)]
        for key in gone:
            log.info(
                "guard holder: %s exited; its lost notify fd no longer matters", self._lost.pop(key).info.container_id
            )
        if gone:
            self._publish_lost()

    def _publish_lost(self) -> None:
        self._ledger_dirty = True
        messages = handover.lost_messages(list(self._lost.values()))
        for data in messages:
            self._send_guard(data)
            if self._standby is not None:
                self._send_link(self._standby, data)

    def _write_ledger(self) -> None:
        if not self._ledger_dirty or self._role not in (Role.PRIMARY, Role.HANDING_OVER):
            return
        self._ledger_dirty = False
        book = ledger.Ledger(os.getpid(), tuple(h.entry for h in self._fds.values()), tuple(self._lost.values()))
        try:
            ledger.write(self.ledger_path, book)
        except OSError as exc:
            if not self._ledger_warned:
                log.warning(
                    "guard holder: cannot write the fd ledger %s: %s (losses go unreported)", self.ledger_path, exc
                )
                self._ledger_warned = True

    # -- exit ------------------------------------------------------------------------------
    def _check_exit(self) -> None:
        if self._exit_requested_at is None or self._stop.is_set():
            return
        state = succession.HolderState(
            role=self._role,
            fds=len(self._fds),
            guard_attached=self.guard_attached,
            has_standby=self._standby is not None,
            exit_requested_at=self._exit_requested_at,
            handover_timeout=self.handover_timeout,
            now=time.monotonic(),
        )
        decision = succession.decide_exit(state)
        if decision is None:
            if not self._exit_announced:
                self._exit_announced = True
                log.warning(
                    "guard holder: asked to stop while holding %d notify fds (%s); waiting up to %gs for a "
                    "successor holder to take them, answering as usual meanwhile (signal again to exit at once)",
                    len(self._fds),
                    "a guard holds copies" if self.guard_attached else "no guard attached: this is the only copy",
                    self.handover_timeout,
                )
            return
        self.exit_reason = decision.reason
        self._log_exit(decision.reason)
        self._stop.set()

    def _log_exit(self, reason: ExitReason) -> None:
        count = len(self._fds)
        if reason is ExitReason.FDS_LOST:
            log.error(
                "guard holder: no successor holder within %gs and no guard attached: exiting closes the last "
                "copies of %d notify fds; GPU session starts in these fail with ENOSYS until they restart: %s",
                self.handover_timeout,
                count,
                ", ".join(sorted(f"{h.info.container_id} ({h.info.owner or 'unknown'})" for h in self._fds.values())),
            )
        elif reason is ExitReason.GUARD_HOLDS_ALONE:
            log.warning(
                "guard holder: no successor holder within %gs; exiting; the attached guard keeps the only copies "
                "of %d notify fds until a holder starts",
                self.handover_timeout,
                count,
            )
        else:
            log.info("guard holder: exiting (%s)", reason.value)

    def _close_sockets(self) -> None:
        # A listening socket file is removed only by the last holder using it: never by one that
        # handed over (its successor serves on the same socket) or that has a standby to resume.
        unlink = self._role in (Role.PRIMARY, Role.HANDING_OVER) and self._standby is None
        self._listen(False)
        for sock, path in ((self._listener, self.listener_path), (self._control, self.control_path)):
            if sock is None:
                continue
            inode = self._inodes.pop(path, -1)
            if unlink:
                unlink_if_ours(path, inode)
            sock.close()
        self._listener = self._control = None
        for guard in (self._guard, *self._pending.values(), *self._paused):
            if guard is not None:
                guard.sock.close()
        self._guard = None
        self._pending.clear()
        self._paused = []


__all__ = ["DEFAULT_GUARD_TIMEOUT", "DEFAULT_HANDOVER_TIMEOUT", "FdHolder", "bind_unix", "peer_uid", "unlink_if_ours"]
