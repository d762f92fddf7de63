"""SIGKILL a set of processes at once and wait until every one has exited, through pidfds.

Decides nothing: the caller says which processes (PIDs it has just read from a trusted
source, such as containerd's task list, or pidfds it pinned earlier). Side effects:
``pidfd_open``, ``pidfd_send_signal(SIGKILL)`` and ``poll`` on the pidfds; nothing else (no
``/proc`` reads, no subprocess, no containerd call).

Why: on a busy node the return path is a chain of wake-ups. Through containerd, the exit of a
spot container's init is seen by its shim (reap), reported to containerd, then answered to our
``Wait``: three processes that each must get a CPU the busy cores do not give up at once. A
pidfd turns readable when the process has exited, and a process closes its file descriptors
(the GPU's among them) before that, so readiness alone proves "no longer holds the GPU". When
the process is its PID namespace's init (every container without a shared PID namespace), it
only becomes a zombie after the kernel has killed every other process of the namespace, so
the init's readiness covers the whole container.

PID reuse: a PID can name another process once the one meant has exited and been reaped.
:func:`pin` opens the pidfds; signals and readiness then refer to exactly those processes. Pin
as soon as the PIDs are known (:func:`kill_all_and_wait` pins just before it signals, so the
window is the time since the caller read the PIDs).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KillResult:
    """What :func:`kill_pinned_and_wait` and :func:`kill_all_and_wait` saw, by PID."""

    exited: tuple[int, ...]
    """Signalled (or already exiting) and seen to exit: their file descriptors are closed."""
    alive: tuple[int, ...]
    """Still running at the deadline (the signal failed, or the exit did not come in time)."""
    missing: tuple[int, ...] = ()
    """No such process when pinned: exited (and reaped) before, or not visible from here."""

    @property
    def all_exited(self) -> bool:
        return not self.alive


def pin(pids: Iterable[int]) -> tuple[dict[int, int], tuple[int, ...]]:
    """Open a pidfd for every PID; returns ``({pid: fd}, missing PIDs)``. The caller closes the
    fds (:func:`close_all`); :func:`kill_pinned_and_wait` does not."""
    pinned: dict[int, int] = {}
    missing: list[int] = []
    for pid in dict.fromkeys(pids):
        if pid <= 0:
            missing.append(pid)
            continue
        try:
            pinned[pid] = os.pidfd_open(pid)
        except OSError:
            missing.append(pid)
    return pinned, tuple(missing)


def close_all(pinned: Mapping[int, int]) -> None:
    for fd in pinned.values():
        os.close(fd)


def wait_exited(fds: Iterable[int], deadline: float) -> set[int]:
    """Wait until every pidfd is readable (its process exited) or ``deadline`` (monotonic
    seconds) passes; returns the fds seen readable."""
    waiting = set(fds)
    done: set[int] = set()
    if not waiting:
        return done
    poller = select.poll()
    for fd in waiting:
        poller.register(fd, select.POLLIN)
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        for fd, _ in poller.poll(max(1, int(remaining * 1000 + 0.5))):
            if fd in waiting:
                waiting.discard(fd)
                done.add(fd)
                poller.unregister(fd)
    return done


def signal_all(fds: Iterable[int], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` through every pidfd; a process already exiting, or one we may not signal,
    is skipped (its readiness, or its absence, shows in the wait that follows)."""
    for fd in fds:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(fd, sig)


def kill_pinned_and_wait(pinned: Mapping[int, int], timeout: float) -> KillResult:
    """SIGKILL every pinned process (all signals first, then one wait for all of them) and wait
    up to ``timeout`` seconds for every exit."""
    deadline = time.monotonic() + timeout
    signal_all(pinned.values())
    seen = wait_exited(pinned.values(), deadline)
    exited = tuple(pid for pid, fd in pinned.items() if fd in seen)
    alive = tuple(pid for pid, fd in pinned.items() if fd not in seen)
    return KillResult(exited, alive)


def kill_all_and_wait(pids: Iterable[int], timeout: float) -> KillResult:
    """Pin, SIGKILL and wait for every PID (see module docstring for the PID-reuse window)."""
    pinned, missing = pin(pids)
    try:
        result = kill_pinned_and_wait(pinned, timeout)
    finally:
        close_all(pinned)
    return KillResult(result.exited, result.alive, missing)


__all__ = ["KillResult", "close_all", "kill_all_and_wait", "kill_pinned_and_wait", "pin", "signal_all", "wait_exited"]
