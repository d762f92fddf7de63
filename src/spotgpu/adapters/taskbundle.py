"""A running containerd task's init process from its shim's bundle, with no containerd call.

Decides nothing: the caller names the container (an ID from a trusted source: containerd's or
the kubelet's) and what to do with the process. Side effects: reads of
``<state>/io.containerd.runtime.v2.task/<namespace>/<id>/init.pid`` and of
``/proc/<pid>/cgroup``, ``pidfd_open``.

Why (measured, docs/node-e2e.md "Where the hold goes"): a spot container
started moments before its owner returns is not pinned yet (:mod:`spotgpu.adapters.pidpins`),
and asking containerd for its init PID (``Tasks.Get``: containerd, then the task's shim, two
processes to wake on a saturated CPU) took 64 ms in a traced return on a 2-core node under load
while every pinned victim had exited. The shim writes the init's PID into the task's bundle
when it creates the task (runc's ``--pid-file``; the same layout in containerd 1.6 to 2.2), in
containerd's state folder, which only root can write; the agent mounts that folder with the
socket (the chart's ``hostPaths.containerd``).

Trust: the file names a PID, not a process. The PID is pinned with a pidfd first, then its
cgroup is read and must name this very container ID (the kubelet's and containerd's cgroup
layouts, :mod:`spotgpu.adapters.procattr`), then the pidfd must show the process still alive:
a PID that an unrelated process reused after the task exited is never accepted. The container
ID must be a CRI ID (64 hex digits) and the namespace a containerd namespace name, so no path
can climb out of the state folder. Anything missing or odd answers None: the caller asks
containerd instead.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Final

from spotgpu.adapters.pidpins import exited_fds
from spotgpu.adapters.procattr import read_cgroup

TASK_DIR: Final = "io.containerd.runtime.v2.task"
"""The runtime v2 shims' bundles, under containerd's ``state`` folder."""

_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_NAMESPACE: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]|\.(?!\.)){0,75}")
_MAX_PID_FILE: Final = 32


def pid_file(state_dir: Path, namespace: str, container_id: str) -> Path | None:
    """Where the task's shim keeps its init's PID; None for a name that is not a CRI container
    ID or not a containerd namespace name (no such name leaves ``<state>/TASK_DIR/<ns>/``)."""
    if not _HEX64.fullmatch(container_id) or not _NAMESPACE.fullmatch(namespace):
        return None
    return state_dir / TASK_DIR / namespace / container_id / "init.pid"


def init_pid(state_dir: Path, namespace: str, container_id: str) -> int | None:
    """The PID the task's ``init.pid`` names, or None (no such file, not a PID, odd names)."""
    path = pid_file(state_dir, namespace, container_id)
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        text = os.read(fd, _MAX_PID_FILE).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    if not text.isdigit() or len(text) > 10:
        return None
    pid = int(text)
    return pid if pid > 1 else None


def pin_init(
    state_dir: Path, namespace: str, container_id: str, proc_root: Path = Path("/proc")
) -> tuple[int, int] | None:
    """``(pid, pidfd)`` of the task's running init, verified as the module docstring says (the
    caller closes the pidfd), or None."""
    pid = init_pid(state_dir, namespace, container_id)
    if pid is None:
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None  # exited (or not visible from here: no hostPID)
    identity = read_cgroup(pid, proc_root)  # read after the pin: this is the pinned process
    if identity is None or identity.container_id != container_id or exited_fds([fd]):
        with contextlib.suppress(OSError):
            os.close(fd)
        return None
    return pid, fd


__all__ = ["TASK_DIR", "init_pid", "pid_file", "pin_init"]
