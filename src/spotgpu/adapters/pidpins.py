"""Pidfds of spot containers' processes, pinned while their GPUs are lent, so that an owner's
return kills them with no containerd call first.

Decides nothing: the caller names the containers (the spot containers on lent GPUs) and
supplies the lookup of their init PIDs (containerd's ``Tasks.Get``). Side effects:
``pidfd_open``, ``poll`` and (only in :func:`signal_pinned`) ``pidfd_send_signal`` on the
pinned processes; reads of ``/proc/self/fdinfo/<fd>``, ``/proc/<pid>/cgroup`` and of a
container's ``cgroup.procs`` under ``/sys/fs/cgroup``.

Why: on a busy node containerd's ``Tasks.Get`` before the kill is the largest part of an
owner's hold (docs/agent.md, "Where the return path's time goes under load": each task's shim
is a process to wake on a saturated CPU). The init PID is known long before the return; a
pidfd pins exactly that process (a pidfd never names another process, even after its PID is
reused), so the return only signals.

What is pinned, per container (:class:`Pinned`):

* its init, identified by two lookups around the ``pidfd_open`` (the same PID, running, both
  times: the pidfd names the init and no process that reused its PID);
* whether that init is PID 1 of its PID namespace (``NSpid`` in the pidfd's fdinfo): then the
  init turns readable only after the kernel killed every other process of the namespace, and
  its pidfd alone proves the whole container gone;
* otherwise (``shareProcessNamespace``, ``hostPID``) the container's ``cgroup.procs`` file
  and a pidfd of each process it lists: at the kill every listed process is signalled, the file
  is read again for processes started since, and the stop counts as verified once every one
  exited and the file lists no other process. A container whose cgroup cannot be found that
  way (an unknown layout, the root cgroup, the agent's own) has no file: containerd's
  ``Kill(all)`` and ``Wait`` verify it (the caller's fallback).

Stale pins: :meth:`PinTable.refresh` (every detection cycle, and whenever the pod watch shows a
spot container that started) pins what it is named and drops pins not named for ``keep``
seconds (so a container named by the pod watch before any detection cycle knows it stays
pinned) and pins whose init exited (a finished or restarted container: pinned again from a new
lookup); :meth:`PinTable.take` returns only pins whose init still runs, as duplicated fds the
caller owns, so a refresh on another thread never closes an fd in use.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spotgpu.adapters.pidkill import signal_all, wait_exited
from spotgpu.util.cgroupfile import cgroup_lines
from spotgpu.util.cpuboost import Knob, cpu_knobs

log = logging.getLogger(__name__)

Lookup = Callable[[Sequence[str]], Mapping[str, int | None]]
"""Container IDs -> the host PID of each running task's init (None: not running, unknown)."""

_V1_CONTROLLERS = ("pids", "memory", "devices", "freezer", "cpu", "cpuacct", "name=systemd")


@dataclass(slots=True)
class Pinned:
    """One container's pinned processes (see module docstring)."""

    container_id: str
    pid: int
    fd: int
    namespace_init: bool
    procs: Path | None = None
    """The container's ``cgroup.procs`` (only when its init is not its namespace's PID 1)."""
    members: dict[int, int] = field(default_factory=dict)
    """Its other processes (``procs`` only): PID -> pidfd."""
    knobs: tuple[Knob, ...] = ()
    """The CPU-weight knobs of its init's cgroup and ancestors, raised at the kill
    (:mod:`spotgpu.util.cpuboost`; resolved at pin time when the table is asked to)."""

    @property
    def verifiable(self) -> bool:
        """Whether pidfds alone can prove the whole container gone."""
        return self.namespace_init or self.procs is not None

    def fds(self) -> list[int]:
        return [self.fd, *self.members.values()]

    def close(self) -> None:
        for fd in self.fds():
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd = -1
        self.members = {}


def namespace_init(pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` is PID 1 of its PID namespace: the ``NSpid`` line of
    the pidfd's own fdinfo ends with 1 (read through our fd, so no PID reuse can mislead it; a
    process already gone reads -1). Not so for a container that shares its pod's or the host's
    PID namespace: its init's exit leaves the others running."""
    try:
        info = Path(f"/proc/self/fdinfo/{pidfd}").read_text()
    except OSError:
        return False
    line = next((ln for ln in info.splitlines() if ln.startswith("NSpid:")), "")
    return line.split()[-1:] == ["1"]


def exited_fds(fds: Iterable[int]) -> set[int]:
    """The pidfds among ``fds`` whose process has exited (one ``poll`` with no wait)."""
    poller = select.poll()
    wanted = list(fds)
    for fd in wanted:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(0)} if wanted else set()


def _read_procs(path: Path) -> list[int]:
    try:
        return [int(line) for line in path.read_text().split()]
    except (OSError, ValueError):
        return []


def procs_file(pid: int, *, proc_root: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> Path | None:
    """The ``cgroup.procs`` of ``pid``'s own cgroup (cgroup v2, or a v1 hierarchy), verified to
    list ``pid``; None for the root cgroup, for the cgroup this process itself is in, and when
    no such file is found."""
    try:
        theirs = cgroup_lines((proc_root / str(pid) / "cgroup").read_text())
        ours = cgroup_lines((proc_root / "self" / "cgroup").read_text())
    except OSError:
        return None
    candidates: list[tuple[str, Path]] = []
    if "" in theirs:
        candidates += [("", cgroup_root), ("", cgroup_root / "unified")]
    candidates += [(c, cgroup_root / c.removeprefix("name=")) for c in _V1_CONTROLLERS if c in theirs]
    for controller, mount in candidates:
        path = theirs[controller]
        if path in ("/", "") or path == ours.get(controller):
            continue
        procs = mount / path.lstrip("/") / "cgroup.procs"
        if pid in _read_procs(procs):
            return procs
    return None


def _pin_members(pinned: Pinned, own_pid: int) -> None:
    """Pin every process ``pinned.procs`` lists that is not pinned yet (a snapshot: the caller
    reads it again when it must be complete)."""
    assert pinned.procs is not None
    for pid in _read_procs(pinned.procs):
        if pid in (pinned.pid, own_pid) or pid in pinned.members:
            continue
        with contextlib.suppress(OSError):
            pinned.members[pid] = os.pidfd_open(pid)


def _refresh_members(pinned: Pinned) -> None:
    """Forget the members that exited, pin the ones started since the last look."""
    gone = exited_fds(pinned.members.values())
    for pid in [pid for pid, fd in pinned.members.items() if fd in gone]:
        os.close(pinned.members.pop(pid))
    _pin_members(pinned, os.getpid())


def signal_pinned(pins: Iterable[Pinned], sig: int = 9) -> None:
    """Signal every pinned process (inits first, all at once), then, for containers with a
    ``cgroup.procs``, any process it lists that was not pinned yet (pinned and signalled now)."""
    pins = list(pins)
    signal_all([p.fd for p in pins], sig)
    signal_all([fd for p in pins for fd in p.members.values()], sig)
    own = os.getpid()
    for p in pins:
        if p.procs is not None:
            before = set(p.members)
            _pin_members(p, own)
            signal_all([fd for pid, fd in p.members.items() if pid not in before], sig)


def wait_pinned(pins: Sequence[Pinned], deadline: float, sig: int = 9) -> set[str]:
    """Wait (until ``deadline``, monotonic seconds) for every signalled container to be gone;
    returns the container IDs verified gone. A namespace init: its pidfd readable. A container
    with ``cgroup.procs``: every pinned process exited and the file lists none that was not
    (a process that appeared meanwhile is pinned, signalled and waited for too)."""
    waiting = [p for p in pins if p.verifiable]
    seen = wait_exited([fd for p in waiting for fd in p.fds()], deadline)
    done = {p.container_id for p in waiting if all(fd in seen for fd in p.fds())}
    own = os.getpid()
    for p in [p for p in waiting if p.procs is not None and p.container_id in done]:
        while True:
            before = set(p.members)
            _pin_members(p, own)
            new = [fd for pid, fd in p.members.items() if pid not in before]
            if not new:
                break
            signal_all(new, sig)
            if wait_exited(new, deadline) != set(new):
                done.discard(p.container_id)
                break
    return done


class PinTable:
    """The pins of the containers last named to :meth:`refresh` (see module docstring)."""

    def __init__(
        self,
        lookup: Lookup,
        *,
        proc_root: Path = Path("/proc"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        retry_interval: float = 2.0,
        keep: float = 30.0,
        cpu_knobs: bool = False,
    ) -> None:
        self._lookup = lookup
        self.cpu_knobs = cpu_knobs
        """Whether each pin carries its CPU-weight knobs (:attr:`Pinned.knobs`)."""
        self.proc_root = proc_root
        self.cgroup_root = cgroup_root
        self.retry_interval = retry_interval
        self.keep = keep
        """Seconds a pin outlives the last :meth:`refresh` that named its container."""
        self._lock = threading.Lock()
        self._pins: dict[str, Pinned] = {}
        self._named: dict[str, float] = {}
        """Container ID -> when a refresh last named it (monotonic seconds)."""
        self._retry_at: dict[str, float] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._pins)

    def pinned(self) -> dict[str, int]:
        """Container ID -> pinned init PID (diagnostics, tests)."""
        with self._lock:
            return {cid: p.pid for cid, p in self._pins.items()}

    def refresh(self, container_ids: Collection[str]) -> None:
        """Pin the named containers not pinned yet (or whose init exited); forget those not
        named for ``keep`` seconds. A container that could not be pinned (not running, not
        visible) is tried again after ``retry_interval`` seconds."""
        now = time.monotonic()
        with self._lock:
            self._named.update(dict.fromkeys(container_ids, now))
            for cid in [c for c, at in self._named.items() if now - at > self.keep]:
                del self._named[cid]
            wanted = set(self._named)
            for cid in [c for c in self._pins if c not in wanted]:
                self._pins.pop(cid).close()
            stale = exited_fds(p.fd for p in self._pins.values())
            for cid in [c for c, p in self._pins.items() if p.fd in stale]:
                self._pins.pop(cid).close()
            for cid in [c for c in self._retry_at if c not in wanted]:
                del self._retry_at[cid]
            named = set(container_ids)  # only those named now are looked up (others retry when named again)
            need = sorted(c for c in named if c not in self._pins and self._retry_at.get(c, 0.0) <= now)
            for p in self._pins.values():
                if p.procs is not None:
                    _refresh_members(p)
        if not need:
            return
        fresh = self._pin_new(need)
        with self._lock:
            for cid in need:
                pin = fresh.get(cid)
                if pin is None:
                    self._retry_at[cid] = now + self.retry_interval
                elif cid in self._pins or cid not in self._named:
                    pin.close()
                else:
                    self._retry_at.pop(cid, None)
                    self._pins[cid] = pin

    def _pin_new(self, container_ids: Sequence[str]) -> dict[str, Pinned]:
        try:
            first = self._lookup(container_ids)
        except Exception as exc:  # containerd unreachable: keep the pins we have
            log.debug("pinning %s: lookup failed: %s", container_ids, exc)
            return {}
        opened: dict[str, tuple[int, int]] = {}
        for cid in container_ids:
            pid = first.get(cid)
            if pid is None or pid <= 1:
                continue
            with contextlib.suppress(OSError):
                opened[cid] = (pid, os.pidfd_open(pid))
        if not opened:
            return {}
        try:
            second = self._lookup(list(opened))
        except Exception:
            second = {}
        pins: dict[str, Pinned] = {}
        for cid, (pid, fd) in opened.items():
            if second.get(cid) != pid or exited_fds([fd]):  # exited (maybe reused) in between
                os.close(fd)
                continue
            pin = Pinned(cid, pid, fd, namespace_init(fd))
            if self.cpu_knobs:
                pin.knobs = cpu_knobs(pid, proc_root=self.proc_root, cgroup_root=self.cgroup_root)
            if not pin.namespace_init:
                pin.procs = procs_file(pid, proc_root=self.proc_root, cgroup_root=self.cgroup_root)
                if pin.procs is not None:
                    _pin_members(pin, os.getpid())
            pins[cid] = pin
        return pins

    def take(self, container_ids: Iterable[str]) -> dict[str, Pinned]:
        """Copies (duplicated fds, the caller closes them with :meth:`Pinned.close`) of the pins
        of ``container_ids`` whose init still runs."""
        with self._lock:
            pins = {cid: self._pins[cid] for cid in container_ids if cid in self._pins}
            stale = exited_fds(p.fd for p in pins.values())
            taken: dict[str, Pinned] = {}
            for cid, p in pins.items():
                if p.fd in stale:
                    continue
                copy = Pinned(cid, p.pid, -1, p.namespace_init, p.procs, knobs=p.knobs)
                try:
                    copy.fd = os.dup(p.fd)
                    for pid, fd in p.members.items():
                        copy.members[pid] = os.dup(fd)
                except OSError as exc:  # out of fds: this container goes the containerd way
                    log.warning("cannot duplicate the pidfds of %s: %s", cid, exc)
                    copy.close()
                    continue
                taken[cid] = copy
            return taken

    def close(self) -> None:
        with self._lock:
            for pin in self._pins.values():
                pin.close()
            self._pins.clear()
            self._named.clear()


__all__ = [
    "Lookup",
    "PinTable",
    "Pinned",
    "exited_fds",
    "namespace_init",
    "procs_file",
    "signal_pinned",
    "wait_pinned",
]
