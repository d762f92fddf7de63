"""A GPU backend for GPUs that are device nodes: processes found through ``/proc/*/fd``.

Decides nothing. Side effects: reads under ``/proc`` (or the ``proc_root`` given) and
``stat`` of the configured device nodes; no writes.

Used (1) for vendors without an NVML-like library: a process is "on" a GPU when it holds the
GPU's device node open (CUDA, ROCm, CANN and the others keep their device files open while a
context lives); (2) for the stand-in GPUs of tests and the node end-to-end harness: harmless
character devices (e.g. ``/dev/null``'s numbers) at a path the containers see.

A file descriptor counts for a device when its link text is one of the device's paths (the
host path, or the paths containers see it under) *and* the open file is a character device
with the same device number: paths alone could name another file, numbers alone are shared by
stand-ins with ``/dev/null``.

Utilization: a device node has none. Each device reads ``<utilization_dir>/<device id>`` (a
percentage written by whoever knows, e.g. the test harness) when that file exists; otherwise
100 when any process holds the device open, else 0. Use a vendor exporter for real numbers.

Which processes are looked at: with ``pids`` (:class:`CgroupPids`, what the agent builds from
``agent.eviction.releaseCheck.cgroupRoots``) only the processes of the kubelet's pod cgroups,
found by the release check's walk (:func:`spotgpu.adapters.holderscan.cgroup_pids`): GPU use is
attributed to containers anyway, and the cost does not grow with the host's other processes.
Without it (or when no root exists on this machine: no kubelet here) every process in ``/proc``.

Cost: one ``listdir`` per process looked at and one ``readlink`` per open file descriptor of
those processes (plus, with ``pids``, one read of ``cgroup.procs`` per cgroup below the roots).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from spotgpu.adapters.holderscan import cgroup_pids, hierarchy
from spotgpu.core.ids import DeviceID, validate_device_id
from spotgpu.ports.node import GpuDevice, GpuProcess


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """One GPU: its ID (as the vendor's device plugin names it) and its device node."""

    id: DeviceID
    path: str
    index: int
    numa_node: int | None = None
    container_paths: tuple[str, ...] = ()
    """Further paths the node has inside containers (NVIDIA keeps the host path)."""

    def __post_init__(self) -> None:
        validate_device_id(self.id)
        if not os.path.isabs(self.path):
            raise ValueError(f"device {self.id}: path {self.path!r} must be absolute")


log = logging.getLogger(__name__)


class CgroupPids:
    """The PIDs of every process below the pod cgroup roots (``roots`` relative to the cgroup
    hierarchy walked, as the release check's). :meth:`pids` answers None when none of the roots
    exists (a machine without a kubelet): the backend then looks at every process."""

    def __init__(self, roots: Sequence[str], *, mount: Path | None = None) -> None:
        self.mount = mount if mount is not None else hierarchy()
        self.roots = tuple(roots)
        self._warned = False

    def pids(self) -> list[int] | None:
        present = [self.mount / r for r in self.roots if (self.mount / r).is_dir()]
        if not present:
            if not self._warned:
                self._warned = True
                log.warning("devnode: no pod cgroup root %s under %s; scanning every process", self.roots, self.mount)
            return None
        return [pid for root in present for _, pids in cgroup_pids(root) for pid in pids]


class DeviceNodeBackend:
    """A :class:`~spotgpu.ports.node.GpuBackend` over device nodes (see module docstring)."""

    name = "devnode"

    def __init__(
        self,
        nodes: Sequence[DeviceNode],
        *,
        proc_root: Path = Path("/proc"),
        utilization_dir: Path | None = None,
        pids: CgroupPids | None = None,
    ) -> None:
        ids = [n.id for n in nodes]
        if len(set(ids)) != len(ids):
            raise ValueError(f"device IDs must be unique, got {ids}")
        self.nodes = tuple(sorted(nodes, key=lambda n: n.index))
        self.proc_root = proc_root
        self.utilization_dir = utilization_dir
        self.pids = pids
        """Where the processes to look at come from (None: all of ``proc_root``)."""
        self._last_pids: dict[DeviceID, tuple[GpuProcess, ...]] = {}

    def _rdev(self, node: DeviceNode) -> int | None:
        try:
            st = os.stat(node.path)
        except OSError:
            return None
        return st.st_rdev if stat.S_ISCHR(st.st_mode) else None

    def devices(self) -> tuple[GpuDevice, ...]:
        result = []
        for node in self.nodes:
            rdev = self._rdev(node)
            minor = os.minor(rdev) if rdev is not None else None
            result.append(GpuDevice(node.id, node.index, None, minor, node.numa_node, healthy=rdev is not None))
        return tuple(result)

    def processes(self) -> dict[DeviceID, tuple[GpuProcess, ...]]:
        by_path: dict[str, list[tuple[DeviceNode, int]]] = {}
        for node in self.nodes:
            rdev = self._rdev(node)
            if rdev is None:
                continue
            for path in (node.path, *node.container_paths):
                by_path.setdefault(path, []).append((node, rdev))
        found: dict[DeviceID, set[int]] = {n.id: set() for n in self.nodes}
        root = str(self.proc_root)
        for entry in self._candidates():
            fd_dir = f"{root}/{entry}/fd"
            try:
                fds = os.listdir(fd_dir)
            except OSError:
                continue
            for fd in fds:
                try:
                    link = os.readlink(f"{fd_dir}/{fd}")
                except OSError:
                    continue
                candidates = by_path.get(link)
                if not candidates:
                    continue
                try:
                    st = os.stat(f"{fd_dir}/{fd}")
                except OSError:
                    continue
                if not stat.S_ISCHR(st.st_mode):
                    continue
                for node, rdev in candidates:
                    if st.st_rdev == rdev:
                        found[node.id].add(int(entry))
        result = {d: tuple(GpuProcess(pid, d) for pid in sorted(pids)) for d, pids in found.items()}
        self._last_pids = result
        return result

    def _candidates(self) -> Iterable[str]:
        """The PIDs to look at (as ``/proc`` entry names)."""
        listed = self.pids.pids() if self.pids is not None else None
        if listed is not None:
            return [str(p) for p in sorted(set(listed))]
        try:
            return [e for e in os.listdir(self.proc_root) if e.isdigit()]
        except OSError:
            return []

    def utilization(self) -> dict[DeviceID, float | None]:
        result: dict[DeviceID, float | None] = {}
        held = self._last_pids or self.processes()
        for node in self.nodes:
            value: float | None = None
            if self.utilization_dir is not None:
                try:
                    value = float((self.utilization_dir / node.id).read_text().strip())
                except FileNotFoundError:
                    value = None
                except (OSError, ValueError):
                    result[node.id] = None
                    continue
            result[node.id] = value if value is not None else (100.0 if held.get(node.id) else 0.0)
        return result

    def close(self) -> None:
        return None


__all__ = ["CgroupPids", "DeviceNode", "DeviceNodeBackend"]
