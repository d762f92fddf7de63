"""Killing host processes safely: pin each by pidfd, check whose it is, SIGKILL, wait for the exit.

Decides nothing: the caller says which processes are candidates and, from a process's cgroup
identity (:mod:`spotgpu.adapters.procattr`), to whom it belongs. Side effects: ``pidfd_open``
and SIGKILL of the processes that belong to someone, reads of ``/proc/<pid>/cgroup``.

Used where the normal way (containerd's ``Kill``) cannot do the job: containerd unreachable, or
a spot process whose container ID nobody knows yet. A PID is pinned with a pidfd *before* its
cgroup is (re)read, so a PID reused by an unrelated process after the candidate list was made
is never signalled. An exited process has closed its file descriptors (the kernel closes them
before it notifies the exit), so "pidfd readable" means "no longer holds any GPU". Needs the
host's PID namespace (the agent runs with ``hostPID``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from spotgpu.adapters.pidkill import wait_exited
from spotgpu.adapters.procattr import CgroupIdentity, read_cgroup

Owner = Callable[[CgroupIdentity], str | None]
"""Whose a process is (a container ID, a pod, ...), from its cgroup identity; None: not ours to kill."""


@dataclass(slots=True)
class Reaped:
    """What :func:`kill_and_wait` did, per owner key."""

    killed: dict[str, list[int]] = field(default_factory=dict)
    """Processes SIGKILLed."""
    alive: dict[str, list[int]] = field(default_factory=dict)
    """Of those, the ones still running at the deadline."""


def kill_and_wait(
    candidates: Iterable[int], owner_of: Owner, deadline: float, proc_root: Path = Path("/proc")
) -> Reaped:
    """SIGKILL every candidate PID that ``owner_of`` claims and wait (until ``deadline``,
    monotonic seconds) for them to exit."""
    pinned: dict[int, tuple[str, int]] = {}
    for pid in sorted(set(candidates)):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # exited meanwhile
        identity = read_cgroup(pid, proc_root)  # pinned now: this is the process we will signal
        key = owner_of(identity) if identity is not None else None
        if key is None:
            os.close(fd)
            continue
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            os.close(fd)
            continue
        pinned[fd] = (key, pid)
    result = Reaped()
    try:
        seen = wait_exited(pinned, deadline)
    finally:
        for fd in pinned:
            os.close(fd)
    alive = {fd: entry for fd, entry in pinned.items() if fd not in seen}
    for key, pid in pinned.values():
        result.killed.setdefault(key, []).append(pid)
    for key, pid in alive.values():
        result.alive.setdefault(key, []).append(pid)
    return result


__all__ = ["Owner", "Reaped", "kill_and_wait"]
