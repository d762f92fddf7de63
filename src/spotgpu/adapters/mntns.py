"""Hold the killed spot containers' mount namespaces across their exits; drop them after the release.

Decides nothing: the caller says which processes it is about to SIGKILL (their pidfds) and
when the owner has been released. Side effects: ``ioctl(PIDFD_GET_MNT_NAMESPACE)`` on the
caller's pidfds (Linux 6.11+; before that ``open("/proc/<pid>/ns/mnt")`` checked against the
pidfd), ``fstat`` and ``close`` of the namespace fds it gets, one short-lived thread per release.

Why (measured, docs/node-e2e.md "Where the hold goes"): a container's
processes are the only holders of its mount namespace (runc and the shim do not keep it), so
the last of them to exit tears it down inside ``do_exit``, *before* the exit completes:
``free_nsproxy`` -> ``put_mnt_ns`` -> ``umount_tree`` -> ``namespace_unlock`` ->
``synchronize_rcu_expedited()``. On a busy node with preemptible RCU that grace period waits for
every reader preempted inside a read-side section, and the dying process sits in ``D`` state for
it: 25-70 ms in some returns on a 2-core node (the stack of every slow exit sampled there ends in
``namespace_unlock``), and the owner's hold waits for the slowest victim. Holding a reference to
each victim's mount namespace turns that step of its exit into a reference drop: its files (the
GPU's) are closed as before, its pidfd turns readable at once, and the teardown (the grace period
and the unmounts) runs when we close our fd, on a thread of our own after the owner's release,
where nobody waits for it.

Safety: a held namespace keeps the container's mounts (its rootfs, its volumes) alive, not any
open file: no device is held, and an exited process has closed its files whatever namespaces
outlive it. The hold is short (from the signal to the release, then one close each) and bounded:
whatever is still held :data:`MAX_HOLD_S` after the oldest hold was taken is dropped anyway, so a
caller that never reports a release leaks nothing. The agent's own mount namespace is never held (it
never reaches zero references). A failure to get a namespace only costs the latency it would
have saved: the kill goes on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections.abc import Iterable
from pathlib import Path

from spotgpu.adapters.pidpins import exited_fds

PIDFD_GET_MNT_NAMESPACE = 0xFF03
"""``_IO(PIDFS_IOCTL_MAGIC 0xFF, 3)`` (``include/uapi/linux/pidfd.h``, Linux 6.11): a new fd of
the pidfd's process's mount namespace; ``ESRCH`` once that process has exited."""

MAX_HOLD_S = 5.0
"""Every held namespace is dropped at most this long after the oldest of them was taken, even if
no release was reported (a later return's namespaces may go with it: that costs only the latency
the hold saves, never a leak)."""

_UNSUPPORTED = (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP)


def _close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def open_mount_namespace(pidfd: int, pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """A new fd of the mount namespace of the process behind ``pidfd`` (PID ``pid`` in our PID
    namespace), or None (exited, not ours to see, no namespace). Through the pidfd when the kernel
    can; otherwise ``/proc/<pid>/ns/mnt``, kept only if the pidfd's process is still alive after
    the open (then the PID named it at the open: a PID is not reused while its process lives)."""
    try:
        return int(fcntl.ioctl(pidfd, PIDFD_GET_MNT_NAMESPACE))
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            return None  # ESRCH: exited; EPERM: not ours to see
    try:
        fd = os.open(proc_root / str(pid) / "ns" / "mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    if exited_fds([pidfd]):
        os.close(fd)
        return None
    return fd


class MountNamespaceHold:
    """The mount namespaces held for the victims of the returns in flight (module docstring).
    Thread-safe: :meth:`hold` runs on the eviction executor, :meth:`release` after the release."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root
        self._lock = threading.Lock()
        self._held: dict[tuple[int, int], int] = {}
        """(st_dev, st_ino) of a namespace -> our fd of it."""
        self._own: tuple[int, int] | None = None
        with contextlib.suppress(OSError):
            st = os.stat(proc_root / "self" / "ns" / "mnt")
            self._own = (st.st_dev, st.st_ino)
        self._timer: threading.Timer | None = None
        self.held_total = 0
        """Namespaces held so far (for tests and benchmarks)."""

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def held(self) -> list[int]:
        """Our fds of the namespaces held now (diagnostics, tests)."""
        with self._lock:
            return list(self._held.values())

    def hold(self, pins: Iterable[tuple[int, int]]) -> int:
        """Hold the mount namespace of each ``(pidfd, pid)`` (call before signalling them); returns
        how many new namespaces are held. Never raises."""
        added = 0
        for pidfd, pid in pins:
            if pidfd < 0:
                continue
            fd = open_mount_namespace(pidfd, pid, self.proc_root)
            if fd is None:
                continue
            try:
                st = os.fstat(fd)
            except OSError:
                os.close(fd)
                continue
            key = (st.st_dev, st.st_ino)
            with self._lock:
                if key == self._own or key in self._held:
                    os.close(fd)
                    continue
                self._held[key] = fd
            added += 1
        if added:
            with self._lock:
                self.held_total += added
                if self._timer is None:
                    self._timer = threading.Timer(MAX_HOLD_S, self.release)
                    self._timer.name = "mntns-max-hold"
                    self._timer.daemon = True
                    self._timer.start()
        return added

    def release(self, *, wait: bool = False) -> None:
        """Drop every held namespace, on a thread of its own (each last close runs that
        namespace's teardown, an RCU grace period among it); ``wait``: on the caller's thread."""
        with self._lock:
            fds = list(self._held.values())
            self._held.clear()
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        if not fds:
            return
        if wait:
            _close_all(fds)
            return
        threading.Thread(target=_close_all, args=(fds,), name="mntns-release", daemon=True).start()


__all__ = ["MAX_HOLD_S", "PIDFD_GET_MNT_NAMESPACE", "MountNamespaceHold", "open_mount_namespace"]
