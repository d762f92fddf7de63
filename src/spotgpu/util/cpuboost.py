"""The CPU weight of dying spot containers' cgroups, raised for the moment of an owner's return.

Decides nothing: the caller names the processes it has just SIGKILLed (a returning owner waits
for their exit). Side effects: reads of ``/proc/<pid>/cgroup`` (at pin time, or at the kill for
a process not pinned before), reads and writes of ``cpu.shares`` (cgroup v1), ``cpu.weight``
and ``cpu.idle`` (cgroup v2; ``cpu.idle`` also v1) in those processes' cgroups and every
ancestor below the root, and the writes back.

Why (docs/agent.md, "The return path on a busy node"): a SIGKILLed process still has to run
to exit: close its files (the GPU's among them), tear down its mount and PID namespaces,
notify its parent. CPU time between cgroups goes by weight at every level of the hierarchy,
not by a process's nice value or scheduling class (a real-time class is refused inside a
cpu cgroup unless it has a real-time budget). A spot pod is typically BestEffort or low
Burstable: the kubelet gives its pod and QoS cgroups a weight of 2 shares (v1; 1 in v2)
against the owner's pods, the system slice (containerd, the shims) and the data loaders of
everything else. On a saturated node the dying container therefore waits its turn behind
all of them, and the owner's held call waits with it. Measured on a 2-core machine with two
CPU-bound processes (docs/results, node-e2e under ``--background-load 2``): the last spot
exit after the kills fell from p50 44 ms to 20 ms with the weights raised.

What is raised, per victim process: its cgroup's ``cpu.shares`` to 262144 (v1, the kernel's
maximum) or ``cpu.weight`` to 10000 (v2, the maximum), ``cpu.idle`` to 0 where it is 1, and
the same in every ancestor below the root (the QoS and pod cgroups are where the starvation
is). The raise is counted per file, so overlapping returns (two owners' victims in one QoS
cgroup) share it: the first raise saves the value found, the last :meth:`Raised.restore`
writes it back, and only if the file still holds the raised value (the kubelet or systemd may
have written its own meanwhile; theirs is kept). Raises take effect at once for runnable
tasks. A file that cannot be read or written (no cpu controller in that cgroup, a read-only
mount, a cgroup removed meanwhile) is skipped: the raise is an optimisation of the return's
latency, never a condition of it; failures are logged once per kind.

Paths: the cgroup path comes from the kernel (``/proc/<pid>/cgroup``), never from a tenant;
still, a path with ``..`` components (seen from inside a cgroup namespace: not this node's
mount) is not used, and every directory must resolve to itself under the mount.

If the agent dies between a raise and its restore, the raised values stay until the kubelet
writes its own (the QoS cgroups on its periodic update; a victim's pod cgroup goes away with
the pod).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from spotgpu.util.cgroupfile import cgroup_lines

log = logging.getLogger(__name__)

V1_MAX_SHARES: Final = 262144
V2_MAX_WEIGHT: Final = 10000


@dataclass(frozen=True, slots=True)
class Knob:
    """One CPU-weight file and the value a raise writes into it."""

    file: Path
    value: str


def _inside(directory: Path, mount: Path) -> bool:
    try:
        real = Path(os.path.realpath(directory))
    except OSError:
        return False
    return real == directory and real != mount and mount in real.parents


def _chain(mount: Path, path: str, files: Sequence[tuple[str, str]]) -> tuple[Knob, ...]:
    """The knobs of the cgroup ``path`` under ``mount`` and of its ancestors below the mount,
    leaf first (see the module docstring)."""
    parts = [p for p in path.split("/") if p]
    if not parts or ".." in parts or "." in parts:
        return ()
    mount = Path(os.path.realpath(mount))
    knobs: list[Knob] = []
    while parts:
        directory = mount.joinpath(*parts)
        if _inside(directory, mount):
            knobs += [Knob(directory / name, value) for name, value in files if (directory / name).is_file()]
        parts.pop()
    return tuple(knobs)


def cpu_knobs(
    pid: int, *, proc_root: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")
) -> tuple[Knob, ...]:
    """The CPU-weight knobs of ``pid``'s cgroup and its ancestors below the root: cgroup v2
    (``cpu.weight``, ``cpu.idle``) when the unified hierarchy has the cpu controller, else the
    v1 ``cpu`` hierarchy (``cpu.shares``, ``cpu.idle``). Empty when the process is gone, sits in
    the root cgroup, or no such file is found."""
    try:
        lines = cgroup_lines((proc_root / str(pid) / "cgroup").read_text())
    except OSError:
        return ()
    if "" in lines and (cgroup_root / "cgroup.controllers").is_file():
        return _chain(cgroup_root, lines[""], (("cpu.weight", str(V2_MAX_WEIGHT)), ("cpu.idle", "0")))
    if "cpu" in lines:
        return _chain(cgroup_root / "cpu", lines["cpu"], (("cpu.shares", str(V1_MAX_SHARES)), ("cpu.idle", "0")))
    return ()


class CpuBoost:
    """Counted raises of CPU-weight knobs (see the module docstring); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._saved: dict[Path, tuple[str, int]] = {}
        """File -> (the value found before the first raise, how many raises hold it)."""
        self._warned: set[str] = set()

    def _warn(self, kind: str, message: str, *args: object) -> None:
        if kind in self._warned:
            log.debug(message, *args)
        else:
            self._warned.add(kind)
            log.warning(message + " (logged once)", *args)

    def raise_(self, knobs: Iterable[Knob]) -> Raised:
        """Raise every knob (each file once); returns what to restore."""
        held: list[Knob] = []
        with self._lock:
            for knob in dict.fromkeys(knobs):
                saved = self._saved.get(knob.file)
                if saved is not None:
                    self._saved[knob.file] = (saved[0], saved[1] + 1)
                    held.append(knob)
                    continue
                try:
                    before = knob.file.read_text().strip()
                    if before != knob.value:
                        knob.file.write_text(knob.value)
                except OSError as exc:
                    self._warn("raise", "cannot raise %s: %s", knob.file, exc)
                    continue
                self._saved[knob.file] = (before, 1)
                held.append(knob)
        return Raised(self, tuple(held))

    def _release(self, knobs: Sequence[Knob]) -> None:
        with self._lock:
            for knob in knobs:
                before, count = self._saved[knob.file]
                if count > 1:
                    self._saved[knob.file] = (before, count - 1)
                    continue
                del self._saved[knob.file]
                if before == knob.value:
                    continue
                try:
                    if knob.file.read_text().strip() == knob.value:  # not rewritten by its owner meanwhile
                        knob.file.write_text(before)
                except FileNotFoundError:
                    continue  # the cgroup is gone (the container's own, removed after its exit)
                except OSError as exc:
                    self._warn("restore", "cannot restore %s to %s: %s", knob.file, before, exc)

    def raised(self) -> dict[Path, str]:
        """File -> the value it will be restored to, for the knobs raised now (diagnostics, tests)."""
        with self._lock:
            return {f: v for f, (v, _) in self._saved.items()}


class Raised:
    """The knobs one raise holds; :meth:`restore` once (later calls do nothing)."""

    __slots__ = ("_boost", "_knobs")

    def __init__(self, boost: CpuBoost, knobs: tuple[Knob, ...]) -> None:
        self._boost = boost
        self._knobs = knobs

    @property
    def knobs(self) -> tuple[Knob, ...]:
        return self._knobs

    def restore(self) -> None:
        knobs, self._knobs = self._knobs, ()
        if knobs:
            self._boost._release(knobs)


__all__ = ["V1_MAX_SHARES", "V2_MAX_WEIGHT", "CpuBoost", "Knob", "Raised", "cpu_knobs"]
