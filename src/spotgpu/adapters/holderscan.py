"""Who holds a GPU's device nodes: a walk of the pod cgroups, their processes' open files and
mappings; and the release check that kills the ones :func:`spotgpu.core.holders.judge` condemns.

Decides nothing (the judgement is :mod:`spotgpu.core.holders`). Side effects: reads of
``cgroup.procs`` under the configured pod cgroup roots, of ``/proc/<pid>/fd`` and
``/proc/<pid>/map_files`` (``stat`` of each entry), ``pidfd_open`` and SIGKILL of condemned
processes (:func:`spotgpu.adapters.reaper.kill_and_wait`: pinned by pidfd, cgroup read again
after the pin, so a reused PID is never signalled).

**Cost**: only processes in the kubelet's pod cgroups are looked at (``kubepods.slice`` /
``kubepods`` under the cgroup v2 mount or a v1 hierarchy, or the roots configured), so unrelated host processes
cost nothing; the owner's own processes and exempt pods' are not read either (they may hold the
GPUs). Per process looked at: one ``listdir`` of its fds and one ``stat`` per fd, and the same
for its file mappings (a device mapped and its fd closed still reaches the GPU).

**Which file is a GPU's**: a character device whose number is the GPU node's. Numbers of real
GPU nodes are unique, so a node made under another path (``mknod`` in a container) is found as
well. A stand-in GPU that shares its number with a device every container has (``/dev/null``'s,
in tests and the node end-to-end run) is matched by number *and* path (the paths the node has
on the host and in containers), as the device-node backend does.

What it cannot see: a file descriptor in flight in a unix socket's queue (sent with SCM_RIGHTS
and not received yet) is held by no process. The victims are dead before the scan, so nothing
they sent can be *sent* again, but a message queued on a stranger's socket can still be
*received* after the release; the agent's holder watch (each detection cycle) kills such a
holder when it appears (docs/security.md, "What is not covered").
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from spotgpu.adapters.procattr import CgroupIdentity, identity_of_path
from spotgpu.adapters.reaper import kill_and_wait
from spotgpu.core.holders import Holding, ReleaseReport, ReleaseScope, Verdict, judge
from spotgpu.core.ids import DeviceID

log = logging.getLogger(__name__)

CGROUP_MOUNT: Final = Path("/sys/fs/cgroup")
V1_HIERARCHIES: Final = ("pids", "memory", "devices", "cpu", "systemd")
"""Under cgroup v1, the hierarchy walked (the first mounted): every container is in each."""
DEFAULT_ROOTS: Final = ("kubepods.slice", "kubepods")
OCI_DEFAULT_DEVICES: Final = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
"""The devices every OCI container gets: a stand-in sharing one of their numbers needs its path."""
MAX_ROUNDS: Final = 5
"""Scans per release check (each after the kills of the one before) before it gives up."""


@dataclass(frozen=True, slots=True)
class DeviceFile:
    """One device node to look for."""

    rdev: int
    paths: frozenset[str] | None = None
    """The paths it has on the host and in containers, when its number alone cannot tell it
    (a stand-in); None: any file with this device number is it."""

    def matches(self, rdev: int, link: Callable[[], str | None]) -> bool:
        if rdev != self.rdev:
            return False
        return self.paths is None or link() in self.paths


def _shared_numbers() -> frozenset[int]:
    numbers = set()
    for path in OCI_DEFAULT_DEVICES:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            numbers.add(st.st_rdev)
    return frozenset(numbers)


def device_file(path: str, container_paths: Sequence[str] = ()) -> DeviceFile | None:
    """The :class:`DeviceFile` of the character device at ``path`` (None: no such device).

    For a stand-in matched by path, a container path also matches in the form the kernel shows
    once the container's ``/dev`` mount is gone while the file stays open (an fd passed out of a
    dead container): the path below that mount, ``/nvidia0`` for ``/dev/nvidia0``."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    if st.st_rdev not in _shared_numbers():
        return DeviceFile(st.st_rdev)
    detached = {"/" + p.removeprefix("/dev/") for p in container_paths if p.startswith("/dev/")}
    return DeviceFile(st.st_rdev, frozenset((path, *container_paths, *detached)))


def cgroup_pids(root: Path) -> Iterator[tuple[str, list[int]]]:
    """``(cgroup path relative to the mount, pids)`` for ``root`` and every cgroup below it."""
    stack = [str(root)]  # plain strings, no pathlib: the detection cycle walks this every round
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
            with open(folder + "/cgroup.procs") as procs:
                text = procs.read()
        except OSError:
            continue
        pids = [int(p) for p in text.split() if p.isdigit()]
        if pids:
            yield folder, pids


def hierarchy(base: Path = CGROUP_MOUNT) -> Path:
    """The cgroup hierarchy to walk: the v2 mount itself, or the first v1 hierarchy mounted."""
    if (base / "cgroup.controllers").exists():
        return base
    for name in V1_HIERARCHIES:
        if (base / name / "cgroup.procs").exists():
            return base / name
    return base


class HolderScanner:
    """Finds the holders of device files among the processes of the pod cgroups."""

    def __init__(
        self, roots: Sequence[str] = DEFAULT_ROOTS, *, mount: Path | None = None, proc_root: Path = Path("/proc")
    ) -> None:
        self.mount = mount if mount is not None else hierarchy()
        self.roots = tuple(roots)
        self.proc_root = proc_root

    def scan(self, gpu: Sequence[DeviceFile], control: Sequence[DeviceFile], scope: ReleaseScope) -> list[Holding]:
        """Every process of the pod cgroups the scope does not skip, with what it holds."""
        found = []
        for root in self.roots:
            for folder, pids in cgroup_pids(self.mount / root):
                identity = identity_of_path("/" + os.path.relpath(folder, self.mount))
                if scope.skips_files(identity.pod_uid, identity.container_id):
                    continue
                for pid in pids:
                    holds_gpu, holds_control = self._holds(pid, gpu, control)
                    found.append(Holding(pid, identity.pod_uid, identity.container_id, holds_gpu, holds_control))
        return found

    def _holds(self, pid: int, gpu: Sequence[DeviceFile], control: Sequence[DeviceFile]) -> tuple[bool, bool]:
        holds_gpu = holds_control = False
        for folder in (f"{self.proc_root}/{pid}/fd", f"{self.proc_root}/{pid}/map_files"):
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                entry = f"{folder}/{name}"
                try:
                    st = os.stat(entry)
                except OSError:
                    continue
                if not stat.S_ISCHR(st.st_mode):
                    continue

                def link(entry: str = entry) -> str | None:
                    try:
                        return os.readlink(entry)
                    except OSError:
                        return None

                holds_gpu = holds_gpu or any(f.matches(st.st_rdev, link) for f in gpu)
                holds_control = holds_control or any(f.matches(st.st_rdev, link) for f in control)
                if holds_gpu and holds_control:
                    return True, True
        return holds_gpu, holds_control


DeviceFiles = Callable[[DeviceID], Sequence[DeviceFile]]
"""The device files of one GPU (looked up at each check: nodes can appear late)."""


class ReleaseChecker:
    """The :class:`~spotgpu.ports.node.ReleaseCheck` of a real node: scan, judge, kill, scan
    again, until no condemned process is left or the deadline passes."""

    def __init__(
        self,
        scanner: HolderScanner,
        gpu_files: DeviceFiles,
        control_files: Callable[[], Sequence[DeviceFile]],
        *,
        proc_root: Path = Path("/proc"),
    ) -> None:
        self.scanner = scanner
        self.gpu_files = gpu_files
        self.control_files = control_files
        self.proc_root = proc_root

    def clear(self, devices: Sequence[DeviceID], scope: ReleaseScope, deadline: float) -> ReleaseReport:
        began = time.monotonic()
        gpu = [f for d in devices for f in self.gpu_files(d)]
        control = list(self.control_files())
        killed: dict[Verdict, int] = {}
        looked_at = 0
        rounds = 0
        while True:
            rounds += 1
            holdings = self.scanner.scan(gpu, control, scope)
            looked_at += len(holdings)
            condemned = [(h, v) for h in holdings if (v := judge(h, scope)) is not None]
            if not condemned or rounds >= MAX_ROUNDS or time.monotonic() >= deadline:
                break
            self._kill(condemned, deadline, killed)
        remaining = tuple(h for h, _ in condemned)
        return ReleaseReport(killed, remaining, rounds, looked_at, time.monotonic() - began, scope.owner_known)

    def _kill(self, condemned: Sequence[tuple[Holding, Verdict]], deadline: float, killed: dict[Verdict, int]) -> None:
        """SIGKILL every condemned process at once and wait for their exits. A PID is signalled
        only if, read again after its pidfd pinned it, its cgroup is still the condemned one."""
        verdicts = {(h.pod_uid, h.container_id): v for h, v in condemned}

        def owner(identity: CgroupIdentity) -> str | None:
            verdict = verdicts.get((identity.pod_uid, identity.container_id))
            return verdict.value if verdict is not None else None

        reaped = kill_and_wait([h.pid for h, _ in condemned], owner, deadline, self.proc_root)
        for key, pids in reaped.killed.items():
            killed[Verdict(key)] = killed.get(Verdict(key), 0) + len(pids)


__all__ = [
    "CGROUP_MOUNT",
    "DEFAULT_ROOTS",
    "DeviceFile",
    "DeviceFiles",
    "HolderScanner",
    "ReleaseChecker",
    "cgroup_pids",
    "device_file",
    "hierarchy",
]
