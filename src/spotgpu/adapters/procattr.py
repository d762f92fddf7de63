"""Process attribution: which container (and pod) a host PID belongs to.

Decides nothing; it answers "whose process is this?" for the detector. Pure parsing of the
text of ``/proc/<pid>/cgroup`` (:func:`parse_cgroup`) plus thin readers of ``/proc`` (the
only side effects: file reads under a ``proc_root`` the caller chooses, ``/proc`` by default).

Path shapes understood (protocols.md section 8.2), cgroup v1 and v2, both kubelet drivers:

* systemd driver, containerd: ``/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid with '_'>.slice/cri-containerd-<64hex>.scope`` (also
  ``besteffort`` and Guaranteed pods without a QoS level);
* systemd driver, CRI-O: ``.../crio-<64hex>.scope``; ``crio-conmon-<id>.scope`` is the
  container monitor, not the container, and is reported without a container ID;
* cgroupfs driver: ``/kubepods/burstable/pod<uid>/<64hex>``, ``/kubepods/pod<uid>/<64hex>``;
* Docker outside Kubernetes: ``/system.slice/docker-<64hex>.scope``;
* any of these behind ``../`` components, as seen from inside a cgroup namespace.

A container the cgroup path does not name by a 64-hex ID (e.g. ``ctr run`` containers,
``/<namespace>/<id>``) can still be matched by comparing whole cgroup paths or PID-namespace
inodes with the container's init process, which :class:`ProcessAttributor` does.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from spotgpu.util.cgroupfile import cgroup_lines

_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_POD_UID: Final = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?"
)
_SCOPE_PREFIXES: Final = ("cri-containerd-", "crio-", "docker-", "containerd-", "libpod-")
_CONMON_PREFIX: Final = "crio-conmon-"
_V1_PREFERENCE: Final = ("devices", "memory", "pids", "cpu", "cpuacct", "name=systemd")


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """What a cgroup path says about a process."""

    path: str
    """The path with ``..`` components removed (``/`` for the root)."""
    pod_uid: str | None
    """The pod UID with dashes, when the path is under a kubelet pod cgroup."""
    container_id: str | None
    """The 64-hex container ID, when the last component names one."""


def _container_id(component: str) -> str | None:
    name = component.removesuffix(".scope")
    if name.startswith(_CONMON_PREFIX):
        return None
    for prefix in _SCOPE_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return name if _HEX64.fullmatch(name) else None


@functools.lru_cache(maxsize=4096)
def identity_of_path(path: str) -> CgroupIdentity:
    """Interpret one cgroup path (any driver, any runtime, with or without ``../`` prefixes).
    Pure: cached (a detection cycle sees the same containers' paths every round)."""
    parts = [p for p in path.split("/") if p and p not in ("..", ".")]
    pod_uid = None
    for part in parts:
        match = _POD_UID.search(part)
        if match is not None and (part.startswith("pod") or "-pod" in part):
            pod_uid = match.group(1).replace("_", "-")
    container_id = _container_id(parts[-1]) if parts else None
    return CgroupIdentity("/" + "/".join(parts), pod_uid, container_id)


def parse_cgroup(text: str) -> CgroupIdentity | None:
    """The identity of a process from its ``/proc/<pid>/cgroup`` text; ``None`` if empty.

    Prefers the line that names a container (v2 first, then the v1 ``devices``, ``memory``,
    ``pids``, ``cpu`` ... lines), else the first line that names a pod, else the v2 line (or
    the first v1 line) as a plain path.
    """
    lines = cgroup_lines(text)
    if not lines:
        return None
    order = ["", *_V1_PREFERENCE, *sorted(k for k in lines if k and k not in _V1_PREFERENCE)]
    first: CgroupIdentity | None = None
    pod: CgroupIdentity | None = None
    for key in order:  # interpreted one at a time: a container's first preferred line names it
        if key not in lines:
            continue
        identity = identity_of_path(lines[key])
        if identity.container_id is not None:
            return identity
        first = first or identity
        if pod is None and identity.pod_uid is not None:
            pod = identity
    return pod or first


def read_cgroup(pid: int, proc_root: Path = Path("/proc")) -> CgroupIdentity | None:
    """Read and parse ``<proc_root>/<pid>/cgroup``; ``None`` when the process is gone."""
    try:
        with open(f"{proc_root}/{pid}/cgroup") as file:  # (no pathlib: once per GPU process per cycle)
            text = file.read()
    except OSError:
        return None
    return parse_cgroup(text)


def pid_namespace(pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """The inode of the PID namespace of ``pid`` (``pid:[<inode>]``); ``None`` when gone."""
    try:
        link = os.readlink(proc_root / str(pid) / "ns" / "pid")
    except OSError:
        return None
    if not link.startswith("pid:[") or not link.endswith("]"):
        return None
    try:
        return int(link[5:-1])
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class ContainerRefPoint:
    """What is known about one container to match processes against."""

    container_id: str
    cgroup_path: str | None = None
    """The cgroup path of the container's init process (exact-path match)."""
    pid_ns: int | None = None
    """The PID-namespace inode of the container's init process."""


class ProcessAttributor:
    """Matches host PIDs to containers by cgroup container ID, cgroup path or PID namespace.

    ``host_pid_ns`` is the agent's own PID namespace (with ``hostPID`` the host's); a
    container sharing it (a ``hostPID`` pod) cannot be told apart by namespace, so such
    namespace matches are ignored.
    """

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root
        self.host_pid_ns = pid_namespace(os.getpid(), proc_root) if proc_root == Path("/proc") else None

    def reference(self, container_id: str, init_pid: int | None) -> ContainerRefPoint:
        """Build the reference point of a container from its init PID (if known and alive)."""
        if init_pid is None or init_pid <= 0:
            return ContainerRefPoint(container_id)
        identity = read_cgroup(init_pid, self.proc_root)
        ns = pid_namespace(init_pid, self.proc_root)
        if ns is not None and ns == self.host_pid_ns:
            ns = None
        return ContainerRefPoint(container_id, identity.path if identity else None, ns)

    def owner_of(self, pid: int, containers: Iterable[ContainerRefPoint]) -> str | None:
        """The ID of the container among ``containers`` that ``pid`` belongs to, if any."""
        identity = read_cgroup(pid, self.proc_root)
        ns: int | None = None
        ns_read = False
        for ref in containers:
            if identity is not None:
                if identity.container_id is not None and identity.container_id == ref.container_id:
                    return ref.container_id
                if ref.cgroup_path is not None and identity.path == ref.cgroup_path and identity.path != "/":
                    return ref.container_id
            if ref.pid_ns is not None:
                if not ns_read:
                    ns, ns_read = pid_namespace(pid, self.proc_root), True
                if ns is not None and ns == ref.pid_ns and ns != self.host_pid_ns:
                    return ref.container_id
        return None

    def attribute(self, pids: Iterable[int], containers: Mapping[str, ContainerRefPoint]) -> dict[int, str]:
        """``{pid: container_id}`` for every PID that belongs to one of ``containers``."""
        refs = list(containers.values())
        result: dict[int, str] = {}
        for pid in pids:
            owner = self.owner_of(pid, refs)
            if owner is not None:
                result[pid] = owner
        return result


def container_processes(container_ids: Iterable[str], proc_root: Path = Path("/proc")) -> dict[str, list[int]]:
    """Host PIDs of every process whose cgroup names one of ``container_ids`` (CRI 64-hex IDs,
    any driver), by container ID; one pass over ``/proc``. Containers without processes are
    absent. A snapshot: PIDs may exit (or be reused) right after it is taken."""
    wanted = set(container_ids)
    found: dict[str, list[int]] = {}
    if not wanted:
        return found
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        identity = read_cgroup(int(entry), proc_root)
        if identity is not None and identity.container_id in wanted:
            found.setdefault(identity.container_id, []).append(int(entry))
    for pids in found.values():
        pids.sort()
    return found


__all__ = [
    "CgroupIdentity",
    "ContainerRefPoint",
    "ProcessAttributor",
    "container_processes",
    "identity_of_path",
    "parse_cgroup",
    "pid_namespace",
    "read_cgroup",
]
