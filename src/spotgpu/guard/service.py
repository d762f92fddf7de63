"""The agent's return guard: implements :class:`~spotgpu.ports.guard.GuardPort`.

Decisions come from :class:`~spotgpu.guard.policy.GuardPolicy`; this module applies them.
Side effects: one loop thread that attaches to the fd holder's control socket, receives copies
of every owner's notify fds, and answers the calls they catch (CONTINUE at once, or hold);
short-lived threads that call the agent's :data:`~spotgpu.ports.guard.OwnerBackHandler`;
Prometheus metrics; log lines. With ``realtime`` (the agent's ``agent.eviction.realtime``)
the loop thread raises its own scheduling priority when it starts
(:func:`spotgpu.util.priority.raise_thread`: ``SCHED_RR`` 10, or nice -10), and the handler
threads it starts inherit it: a returning owner's held call is received, handed to the agent
and answered without waiting behind the node's normal-priority work.

Life of a caught call (see docs/guard.md for the whole design):

1. The owner container starts a GPU session; its filter stops the version-check ioctl and
   the notify fd polls readable here.
2. Disarmed owner (or not an owner): CONTINUE at once. Armed owner: the call is held, the
   holder is told (``hold``, so it can release the call if this process dies), and the owner
   back handler runs on its own thread at once, with no polling delay.
3. :meth:`GuardService.disarm` (eviction done) releases every held call of the owner; the
   ``fail_open_timeout`` releases them anyway, with a metric and a warning.

The guard answers calls only for fds it holds; the holder answers whenever no guard is
attached. If the holder dies the guard keeps answering and hands its fds to the next holder;
if the holder detaches it (another guard attached, or this one was silent too long) it
releases everything and lets go of its fds.
"""

from __future__ import annotations

import errno
import logging
import select
import socket
import threading
import time
from collections.abc import Callable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from spotgpu.core.config import GuardConfig
from spotgpu.core.refs import ContainerRef
from spotgpu.guard import handover, protocol, seccomp
from spotgpu.guard.fdtable import NotifyFds
from spotgpu.guard.listener import NotifyFdInfo
from spotgpu.guard.loop import EventLoop
from spotgpu.guard.policy import GuardPolicy, Hold, OwnerState, Release, ReleaseReason, Verdict
from spotgpu.guard.protocol import Op
from spotgpu.guard.support import GuardSupport, probe
from spotgpu.ports.guard import GuardPort, OwnerBackHandler
from spotgpu.util.cpuboost import CpuBoost, Knob, Raised, cpu_knobs
from spotgpu.util.priority import Priority, raise_thread

log = logging.getLogger(__name__)

RELEASE_BOOST_S = 0.1
"""Seconds the cgroups of released owner threads keep their raised CPU weight (``boost_cpu``)."""

_HOLD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class GuardMetrics:
    """The guard's Prometheus metrics (prefix ``spotgpu_guard_``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.available = Gauge("spotgpu_guard_available", "1 when seccomp user notification works here", registry=r)
        self.holder_attached = Gauge("spotgpu_guard_holder_attached", "1 while attached to the fd holder", registry=r)
        self.notify_fds = Gauge("spotgpu_guard_notify_fds", "Owner notify fds this guard answers for", registry=r)
        self.notifications = Counter(
            "spotgpu_guard_notifications_total", "Caught GPU session starts, by verdict", ["verdict"], registry=r
        )
        self.owner_back = Counter(
            "spotgpu_guard_owner_back_total", "Armed owners caught starting a GPU session", registry=r
        )
        self.releases = Counter(
            "spotgpu_guard_releases_total", "Held calls released, by reason", ["reason"], registry=r
        )
        self.fail_open = Counter(
            "spotgpu_guard_fail_open_total",
            "Held calls released by the fail-open timeout before eviction finished",
            registry=r,
        )
        self.lost_fds = Gauge(
            "spotgpu_guard_lost_notify_fds",
            "Owner processes whose notify fd was lost (holder and guard died together): their GPU session "
            "starts fail with ENOSYS until the container restarts",
            registry=r,
        )
        self.hold_seconds = Histogram(
            "spotgpu_guard_hold_seconds", "How long owner calls were held", buckets=_HOLD_BUCKETS, registry=r
        )


class GuardService:
    """The return guard of one agent. ``start()`` it, drive it with arm/disarm, ``stop()`` it."""

    def __init__(
        self,
        config: GuardConfig,
        on_owner_back: OwnerBackHandler,
        *,
        registry: CollectorRegistry | None = None,
        support: GuardSupport | None = None,
        clock: Callable[[], float] = time.monotonic,
        reconnect_interval: float = 0.5,
        realtime: bool = False,
        boost_cpu: bool = False,
        boost: CpuBoost | None = None,
    ) -> None:
        self.config = config
        self.realtime = realtime
        """Raise the loop thread's priority (``SCHED_RR`` 10, or nice -10 when refused)."""
        self.boost = (boost or CpuBoost()) if boost_cpu else None
        """Raises the CPU weight of a released owner thread's cgroups for ``RELEASE_BOOST_S``
        (the agent's ``agent.eviction.boostCpu``; :mod:`spotgpu.util.cpuboost`): the thread
        must run to return from its held call, on a node whose CPUs other pods keep busy.
        ``boost``: a counter shared with the agent's kills (one count per cgroup file)."""
        self._hold_knobs: dict[tuple[str, int], tuple[Knob, ...]] = {}
        """(notify fd key, notification id) of a held call -> its thread's CPU-weight knobs."""
        self._boosts: set[Raised] = set()
        self.priority: Priority | None = None
        """What the loop thread got (None until it started, or when not raised)."""
        self._on_owner_back = on_owner_back
        self._support = support
        self._clock = clock
        self._reconnect_interval = reconnect_interval
        self.metrics = GuardMetrics(REGISTRY if registry is None else registry)
        self._policy = GuardPolicy(config.fail_open_timeout)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._send_lock = threading.Lock()
        self._fds = NotifyFds(self._watch_fd, self._unwatch_fd)
        self._sock: socket.socket | None = None
        self._holder_keys: set[str] = set()
        self._lost: dict[str, NotifyFdInfo] = {}
        self._synced = False
        self._next_connect = 0.0
        self._next_ping = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop = EventLoop("guard")
        self._warned_no_holder_at = 0.0
        self.detaches = 0
        """How often the holder told this guard to let go (for diagnostics and tests)."""
        self.superseded = False
        """Another guard attached to the holder: this one stays detached until restarted."""

    # -- GuardPort -------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return self.config.enabled and self._support is not None and self._support.available

    @property
    def support(self) -> GuardSupport | None:
        return self._support

    def arm(self, owner: ContainerRef) -> None:
        with self._lock:
            if not self._policy.is_armed(owner):
                if self.covers(owner):
                    log.info("guard: armed for %s", owner)
                else:
                    log.warning("guard: armed for %s, but no notify fd of it is here (rule not injected?)", owner)
            self._policy.arm(owner)
            self._changed.notify_all()

    def disarm(self, owner: ContainerRef) -> None:
        with self._lock:
            was = self._policy.state(owner)
            releases = self._policy.disarm(owner)
            self._apply_releases(releases)
            self._changed.notify_all()
        if was is not OwnerState.DISARMED:
            log.info("guard: disarmed %s; released %d held call(s)", owner, len(releases))

    def is_armed(self, owner: ContainerRef) -> bool:
        with self._lock:
            return self._policy.is_armed(owner)

    # -- diagnostics -----------------------------------------------------------------------
    def state(self, owner: ContainerRef) -> OwnerState:
        with self._lock:
            return self._policy.state(owner)

    @property
    def attached(self) -> bool:
        """Attached to the fd holder and synced (the holder has every fd this guard has)."""
        with self._lock:
            return self._sock is not None and self._synced

    def covers(self, owner: ContainerRef) -> bool:
        """True when some process of ``owner`` runs under the rule and its fd is here: only then
        can the guard catch the owner's return (otherwise polling detection has to)."""
        with self._lock:
            return self._fds.owned_by(owner)

    def fds(self) -> list[NotifyFdInfo]:
        with self._lock:
            return [f.info for f in self._fds]

    def lost(self) -> list[NotifyFdInfo]:
        """Owner processes whose notify fd was lost, as the fd holder reports them: the holder and
        the guard died together, so their filters have no listener and every caught GPU session
        start fails with ENOSYS until the container restarts. The guard cannot catch these owners'
        return (``covers`` is false for them); the agent should surface them (restart the
        container when its owner agrees) and rely on polling detection for them meanwhile."""
        with self._lock:
            return list(self._lost.values())

    def holds(self) -> tuple[Hold, ...]:
        with self._lock:
            return self._policy.holds()

    def wait_attached(self, timeout: float) -> bool:
        return self.wait_until(lambda g: g.attached, timeout)

    def wait_until(self, predicate: Callable[[GuardService], bool], timeout: float) -> bool:
        """Block until ``predicate(self)`` holds (checked on every state change) or ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, 0.1))
            return True

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Check support (once) and start the loop thread. Without support: report and return;
        the agent then relies on polling detection (``available`` is False)."""
        if not self.config.enabled:
            log.warning("guard: disabled by configuration; return detection falls back to polling")
            self.metrics.available.set(0)
            return
        if self._support is None:
            self._support = probe(self.config.runtime_binary)
        self.metrics.available.set(1 if self._support.available else 0)
        if not self._support.available:
            log.warning("guard: %s; return detection falls back to polling", self._support.summary())
            return
        log.info("guard: %s", self._support.summary())
        self._stop.clear()
        if self._loop.closed:  # started again after stop()
            self._loop = EventLoop("guard")
        self._warned_no_holder_at = self._clock()
        self._thread = threading.Thread(target=self._run, name="spotgpu-guard", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Release every held call, make sure the holder has every fd, detach, close."""
        if self._thread is None:
            return
        self._stop.set()
        self._poke()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("guard: the loop did not stop within %.0fs", timeout)
            return
        self._thread = None
        self._loop.close()
        for raised in list(self._boosts):
            raised.restore()

    def _poke(self) -> None:
        self._loop.poke()

    # -- the loop --------------------------------------------------------------------------
    def _run(self) -> None:
        if self.realtime:
            self.priority = raise_thread()  # the owner-back threads inherit it
        try:
            while not self._stop.is_set():
                now = self._clock()
                if self._sock is None and now >= self._next_connect and not self.superseded:
                    self._connect()
                self._loop.poll(self._timeout())
                self._expire()
                self._ping()
            self._shutdown()
        except Exception:
            log.exception("guard: loop failed; releasing every call and letting the holder answer")
            self._shutdown()
            raise

    def _timeout(self) -> float:
        now = self._clock()
        if self._sock is not None:
            candidates = [self._next_ping]
        else:
            candidates = [now + 1.0 if self.superseded else self._next_connect]
        with self._lock:
            deadline = self._policy.next_deadline()
        if deadline is not None:
            candidates.append(deadline)
        return max(0.0, min(candidates) - now)

    def _on_notify_fd(self, fd: int, mask: int) -> None:
        owner_back: ContainerRef | None = None
        held: tuple[str, int, int] | None = None
        with self._lock:
            entry = self._fds.by_fd(fd)
            if entry is None:
                return
            key = entry.key
            if mask & select.EPOLLIN:
                try:
                    notification = seccomp.recv(fd)
                except seccomp.SeccompError as exc:
                    log.error("guard: notify fd of %s: %s", entry.info.container_id, exc)
                    notification = None
                if notification is not None:
                    decision = self._policy.on_notification(entry.info.owner, key, notification.id, self._clock())
                    self.metrics.notifications.labels(decision.verdict.value).inc()
                    if decision.verdict is Verdict.CONTINUE:
                        _continue(fd, notification.id)
                    else:
                        self._tell_holder(protocol.encode(Op.HOLD, key=key, id=notification.id))
                        held = (key, notification.id, notification.pid)
                        log.info(
                            "guard: holding a new GPU session of %s (container %s, tid %d, request %#x)",
                            entry.info.owner,
                            entry.info.container_id,
                            notification.pid,
                            notification.request,
                        )
                        if decision.owner_back:
                            owner_back = entry.info.owner
                    self._changed.notify_all()
            if mask & (select.EPOLLHUP | select.EPOLLERR):
                self._drop(key)
        if owner_back is not None:
            self.metrics.owner_back.inc()
            threading.Thread(
                target=self._call_owner_back, args=(owner_back,), name="spotgpu-guard-owner-back", daemon=True
            ).start()
        if held is not None and self.boost is not None:
            self._note_knobs(*held)

    def _note_knobs(self, key: str, notification: int, tid: int) -> None:
        """Remember the CPU-weight knobs of a held thread's cgroups (read while the eviction runs;
        a call released before this is done is released without a raise)."""
        knobs = cpu_knobs(tid)
        with self._lock:
            if knobs and self._policy.is_held(key, notification):
                self._hold_knobs[(key, notification)] = knobs

    def _call_owner_back(self, owner: ContainerRef) -> None:
        try:
            self._on_owner_back(owner)
        except Exception:
            log.exception("guard: the owner-back handler failed for %s; the call stays held until fail-open", owner)

    def _expire(self) -> None:
        with self._lock:
            releases = self._policy.expire(self._clock())
            if not releases:
                return
            self._apply_releases(releases)
            self._changed.notify_all()
        for owner in sorted({r.hold.owner for r in releases}):
            log.warning(
                "guard: failed open for %s after %.1fs: eviction did not finish in time; released %d call(s)",
                owner,
                self.config.fail_open_timeout,
                sum(1 for r in releases if r.hold.owner == owner),
            )

    def _apply_releases(self, releases: list[Release]) -> None:
        """Continue released calls; caller holds the lock."""
        now = self._clock()
        knobs = [k for r in releases for k in self._hold_knobs.pop((r.hold.key, r.hold.id), ())]
        if knobs and self.boost is not None:
            self._boost_for_a_while(self.boost.raise_(knobs))
        for release in releases:
            hold = release.hold
            # Count first: once continued, the owner's call returns and anyone may look.
            self.metrics.releases.labels(release.reason.value).inc()
            self.metrics.hold_seconds.observe(max(0.0, now - hold.since))
            if release.reason is ReleaseReason.FAIL_OPEN:
                self.metrics.fail_open.inc()
            entry = self._fds.get(hold.key)
            if entry is not None:
                _continue(entry.fd, hold.id)
            self._tell_holder(protocol.encode(Op.DONE, key=hold.key, id=hold.id))

    def _boost_for_a_while(self, raised: Raised) -> None:
        """Keep ``raised`` for ``RELEASE_BOOST_S``, then restore it (at once when stopping)."""
        self._boosts.add(raised)

        def restore() -> None:
            self._boosts.discard(raised)
            raised.restore()

        timer = threading.Timer(RELEASE_BOOST_S, restore)
        timer.daemon = True
        timer.name = "spotgpu-guard-unboost"
        timer.start()

    # -- fds -------------------------------------------------------------------------------
    def _watch_fd(self, fd: int) -> None:
        self._loop.watch(fd, self._on_notify_fd)

    def _unwatch_fd(self, fd: int) -> None:
        self._loop.forget(fd)

    def _adopt(self, fd: int, info: NotifyFdInfo) -> None:
        """Caller holds the lock."""
        if self._fds.adopt(fd, info, verify=True) is None:
            return
        self.metrics.notify_fds.set(len(self._fds))
        self._changed.notify_all()

    def _drop(self, key: str) -> None:
        """Caller holds the lock."""
        entry = self._fds.pop(key)
        self._apply_releases(self._policy.drop_fd(key))  # the fd is out of the table: nothing to continue
        self._fds.discard(entry)
        self.metrics.notify_fds.set(len(self._fds))
        self._changed.notify_all()

    def _drop_all(self) -> None:
        with self._lock:
            self._apply_releases(self._policy.release_all())
            for key in list(self._fds.keys()):
                self._drop(key)

    # -- the holder ------------------------------------------------------------------------
    def _connect(self) -> None:
        self._next_connect = self._clock() + self._reconnect_interval
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        sock.settimeout(0.2)  # a stuck holder must never block the guard (sends happen under its lock)
        try:
            sock.connect(str(self.config.holder_path))
            with self._lock:
                have = sorted(self._fds.keys())
            protocol.send(sock, protocol.encode(Op.ATTACH, version=protocol.PROTOCOL_VERSION, have=have))
        except OSError as exc:
            sock.close()
            quiet = exc.errno in (errno.ENOENT, errno.ECONNREFUSED)
            if not quiet or self._clock() - self._warned_no_holder_at > 30:
                self._warned_no_holder_at = self._clock()
                log.warning(
                    "guard: no fd holder at %s (%s); owner containers get no guard rule until one runs",
                    self.config.holder_path,
                    exc.strerror,
                )
            return
        self._sock = sock
        self._synced = False
        self._next_ping = self._clock() + self.config.holder_timeout / 4
        self._loop.watch(sock.fileno(), self._on_holder)

    def _on_holder(self, _fd: int, _mask: int) -> None:
        assert self._sock is not None
        try:
            got = protocol.receive(self._sock)
        except (OSError, protocol.ProtocolError) as exc:
            log.warning("guard: bad message from the fd holder: %s", exc)
            got = None
        if got is None:
            log.warning("guard: the fd holder went away; answering on our own and waiting for the next one")
            self._disconnect()
            return
        message, fd = got
        if message.op is Op.WELCOME:
            self._holder_keys = set(message.keys_field("have")) if "have" in message.body else set()
            log.info("guard: attached to the fd holder (pid %s)", message.body.get("holder_pid"))
        elif message.op is Op.FD:
            assert fd is not None
            info = message.fd_info()
            with self._lock:
                self._adopt(fd, info)
            self._holder_keys.add(info.key)
        elif message.op is Op.LOST:
            self._on_lost(message)
        elif message.op is Op.SYNCED:
            self._sync()
        elif message.op is Op.DETACH:
            superseded = message.body.get("superseded") is True
            self.superseded = self.superseded or superseded  # before the fds go: observers wait on that
            self.detaches += 1
            self._drop_all()
            self._disconnect()
            if superseded:
                log.error(
                    "guard: another guard attached to the fd holder; this one stops answering calls "
                    "(is a second agent running on this node?)"
                )
            else:
                log.warning("guard: the fd holder took the fds back (%s); attaching again", message.body.get("reason"))
        else:
            log.warning("guard: unexpected %s from the fd holder", message.op)

    def _on_lost(self, message: protocol.Message) -> None:
        first, entries = handover.parse_lost(message)
        with self._lock:
            before = set(self._lost)
            if first:
                self._lost = {}
            self._lost.update((e.key, e.info) for e in entries)
            self.metrics.lost_fds.set(len(self._lost))
            new = [self._lost[k] for k in sorted(set(self._lost) - before)]
            self._changed.notify_all()
        for info in new:
            log.error(
                "guard: the notify fd of %s (container %s, pid %d) was lost in a crash of the fd holder and the "
                "guard together; its GPU session starts fail with ENOSYS until the container restarts",
                info.owner or "an unknown owner",
                info.container_id,
                info.pid,
            )

    def _sync(self) -> None:
        """Give the holder every fd it lacks and every call we hold; we are attached then."""
        with self._lock:
            for entry in self._fds:
                if entry.key not in self._holder_keys:
                    self._tell_holder(protocol.fd_message(entry.info), entry.fd)
            for hold in self._policy.holds():
                self._tell_holder(protocol.encode(Op.HOLD, key=hold.key, id=hold.id))
            self._synced = self._sock is not None
            self.metrics.holder_attached.set(1 if self._synced else 0)
            self._changed.notify_all()

    def _tell_holder(self, data: bytes, fd: int | None = None) -> None:
        sock = self._sock
        if sock is None:
            return
        with self._send_lock:
            try:
                protocol.send(sock, data, fd)
            except OSError as exc:
                log.warning("guard: cannot write to the fd holder: %s", exc)

    def _ping(self) -> None:
        if self._sock is not None and self._clock() >= self._next_ping:
            self._next_ping = self._clock() + self.config.holder_timeout / 4
            self._tell_holder(protocol.encode(Op.PING))

    def _disconnect(self) -> None:
        sock = self._sock
        if sock is None:
            return
        with self._lock:
            self._sock = None
            self._synced = False
            self._holder_keys = set()
            self.metrics.holder_attached.set(0)
            self._changed.notify_all()
        self._loop.forget(sock.fileno())
        sock.close()
        self._next_connect = self._clock() + self._reconnect_interval

    def _shutdown(self) -> None:
        """Release every call; hand the fds to a holder if we can; close everything."""
        with self._lock:
            self._apply_releases(self._policy.release_all())
            needs_holder = bool(self._fds) and not self._synced
        if needs_holder:
            self._attach_before_exit()
        if self._fds and not self.attached:
            log.error(
                "guard: stopping without an fd holder: %d owner container(s) lose their notify fds "
                "(their GPU session starts fail with ENOSYS until they restart)",
                len(self._fds),
            )
        self._disconnect()  # the holder takes over: nothing is held, nothing is stranded
        with self._lock:
            for key in list(self._fds.keys()):
                self._drop(key)

    def _attach_before_exit(self) -> None:
        deadline = self._clock() + self.config.holder_timeout
        while self._clock() < deadline and not self.attached:
            if self._sock is None:
                self._connect()
                if self._sock is None:
                    time.sleep(0.05)
                    continue
            self._loop.poll(0.05)


def _continue(fd: int, notification_id: int) -> None:
    """CONTINUE a call; a failure is logged, never raised into the loop or the agent's thread."""
    try:
        seccomp.send_continue(fd, notification_id)
    except seccomp.SeccompError as exc:
        log.error("guard: cannot continue call %d: %s", notification_id, exc)


def _conforms(service: GuardService) -> GuardPort:
    return service  # mypy checks that GuardService implements the guard's port


__all__ = ["GuardMetrics", "GuardService"]
