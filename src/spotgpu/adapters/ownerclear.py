"""The fd holder's release check: before the holder itself lets an owner's call go on (no
agent to evict: :mod:`spotgpu.guard.gate`), every process of another pod holding the owner's
GPUs dies.

Decides nothing itself (the judgement is :func:`spotgpu.core.holders.judge`, the walk and the
kills :class:`spotgpu.adapters.holderscan.ReleaseChecker`); builds the scope it can know without
the agent, from the held call's process:

* **the owner**: the pod UID and container ID of that process's cgroup (``/proc/<pid>/cgroup``);
  every process of that pod is exempt (never killed). A process whose cgroup names neither is
  no known owner: nothing is killed (fail closed toward the owner: killing the owner is worse
  than a shared GPU), and the line says so;
* **the owner's GPUs**: the GPU device nodes the owner container has
  (``/proc/<pid>/root/dev/nvidia<N>``: the ones its runtime gave it, as its mount namespace
  shows them), matched by device number, and for a stand-in sharing a number with ``/dev/null``
  also by the path it has in containers.

Everything else is the release check's: only processes below the pod cgroup roots are walked
(their cost does not grow with host processes), a process is SIGKILLed only through a pidfd
whose cgroup, read after the pin, is still the condemned one, and the check gives up at its
deadline (the call is released then: a call held for ever is worse). Side effects: the reads and
kills named.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from spotgpu.adapters.holderscan import DeviceFile, HolderScanner, ReleaseChecker, device_file
from spotgpu.adapters.procattr import read_cgroup
from spotgpu.core.holders import ReleaseScope
from spotgpu.core.ids import DeviceID

log = logging.getLogger(__name__)

GPU_NODE: Final = re.compile(r"nvidia[0-9]+")
"""A GPU's device node in ``/dev`` (``nvidiactl``, ``nvidia-uvm`` are control nodes: not matched)."""
DEFAULT_DEADLINE_S: Final = 2.0
_OWNER_GPUS: Final = DeviceID("owner-gpus")


def owner_gpu_files(pid: int, proc_root: Path = Path("/proc")) -> list[DeviceFile]:
    """The GPU device nodes in the ``/dev`` of ``pid``'s mount namespace."""
    dev = proc_root / str(pid) / "root" / "dev"
    try:
        names = sorted(n for n in os.listdir(dev) if GPU_NODE.fullmatch(n))
    except OSError:
        return []
    files = []
    for name in names:
        found = device_file(str(dev / name), [f"/dev/{name}"])
        if found is not None:
            files.append(found)
    return files


class OwnerClearer:
    """The :class:`~spotgpu.guard.gate.ReleaseGate` of a real node (see module docstring)."""

    def __init__(
        self, scanner: HolderScanner, *, deadline_s: float = DEFAULT_DEADLINE_S, proc_root: Path = Path("/proc")
    ) -> None:
        self.scanner = scanner
        self.deadline_s = deadline_s
        self.proc_root = proc_root

    def clear(self, pid: int) -> str:
        try:
            return self._clear(pid)
        except Exception as exc:  # the gate must not raise: the held call is released anyway
            log.exception("guard holder: release check for pid %d failed", pid)
            return f"release check FAILED ({type(exc).__name__}: {exc})"

    def _clear(self, pid: int) -> str:
        identity = read_cgroup(pid, self.proc_root)
        uid = identity.pod_uid if identity is not None else None
        cid = identity.container_id if identity is not None else None
        scope = ReleaseScope(
            owner_pods=frozenset([uid] if uid else []), owner_containers=frozenset([cid] if cid else [])
        )
        if not scope.owner_known:
            return f"release check skipped: pid {pid} is in no pod cgroup (owner unknown: nothing killed)"
        files: Sequence[DeviceFile] = owner_gpu_files(pid, self.proc_root)
        if not files:
            return f"release check: pod {uid or cid} has no GPU node in its /dev"
        checker = ReleaseChecker(self.scanner, lambda _d: files, lambda: (), proc_root=self.proc_root)
        report = checker.clear([_OWNER_GPUS], scope, time.monotonic() + self.deadline_s)
        killed = sum(report.killed.values())
        text = f"release check of pod {uid or cid}'s {len(files)} GPU(s): killed {killed} holder(s)"
        if report.remaining:
            return text + f", {len(report.remaining)} still alive at the deadline: {[h.pid for h in report.remaining]}"
        return text + f" in {report.seconds * 1e3:.1f} ms"


__all__ = ["DEFAULT_DEADLINE_S", "GPU_NODE", "OwnerClearer", "owner_gpu_files"]
