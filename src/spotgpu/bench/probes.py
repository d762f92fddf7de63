"""The probes behind ``spotgpu bench returnpath`` (:mod:`spotgpu.bench.returnpath`).

Holds the source of a static C kill-and-wait helper for the ``helper-pinned`` variant (built by
the benchmark with :mod:`spotgpu.testing.cbuild`); the victims' exits are timestamped by
:class:`spotgpu.testing.exitwatch.ExitWatcher`. Side effects:
starts them, signals the victims (the direct strategies), reads ``/proc/*/cmdline`` and
``/proc/<pid>/task/*/schedstat``.

* :class:`ProbedTasks`: the agent's containerd task port (:class:`ContainerdTasks`) with the
  stop strategy of one variant, timestamping the path on the guard's thread only;
* :class:`TimedGuard`: the guard fake, timestamping the owner's release;
* :class:`Probe` / :class:`Marks`: one return's timestamps, and time in Python's collector;
* :func:`rq_wait`: run-queue wait of every thread of some processes (runnable, not running).
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotgpu.adapters import pidkill
from spotgpu.adapters.containerd import ContainerdTasks
from spotgpu.adapters.pidpins import Pinned, PinTable
from spotgpu.agent.evictor import EvictionExecutor
from spotgpu.ports.node import TaskState, TaskStopResult
from spotgpu.testing.containerd import Containerd
from spotgpu.testing.fakes import FakeGuard
from spotgpu.util.cpuboost import Raised

SHIPPED = ("containerd-pinned", "containerd", "containerd-wait", "kill-rpc")
"""Strategies that run :meth:`ContainerdTasks.stop_tasks` itself."""
PIDFD_VERIFIED = ("containerd-pinned", "containerd")

_C_COMMON = r"""
#define _GNU_SOURCE
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
"""

KILLER_C = (
    _C_COMMON
    + r"""
/* killer: reads lines "PID PID ...", pins, SIGKILLs all, waits (<= 10 s); answers "<ns_killed> <exited>". */
int main(void) {
    char line[65536];
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        int fds[4096], n = 0, left = 0;
        struct pollfd p[4096];
        char *s = line, *end;
        for (long pid = strtol(s, &end, 10); end != s && n < 4096; s = end, pid = strtol(s, &end, 10)) {
            fds[n] = (int)syscall(SYS_pidfd_open, (int)pid, 0);
            p[n].fd = fds[n]; p[n].events = POLLIN; n++;
        }
        for (int i = 0; i < n; i++)
            if (fds[i] >= 0) { syscall(SYS_pidfd_send_signal, fds[i], SIGKILL, NULL, 0); left++; }
        long long killed = now_ns();
        int exited = 0;
        while (left > 0 && poll(p, n, 10000) > 0)
            for (int i = 0; i < n; i++)
                if (p[i].fd >= 0 && p[i].revents) { p[i].fd = -1; left--; exited++; }
        for (int i = 0; i < n; i++) if (fds[i] >= 0) close(fds[i]);
        printf("%lld %d\n", killed, exited);
    }
    return 0;
}
"""
)


@dataclass
class Marks:
    """One return's timestamps (monotonic ns) and counters."""

    signal: int = 0
    handler: int = 0
    stop_enter: int = 0
    killed: int = 0
    reported: int = 0
    stop_return: int = 0
    released: int = 0
    deaths: list[int] = field(default_factory=list)
    wait_done: list[int] = field(default_factory=list)
    handler_cpu_ns: int = 0
    gc_ns: int = 0


class Probe:
    """The marks of the return under way; hooks on several threads write into it."""

    def __init__(self) -> None:
        self.marks = Marks()
        self.guard_thread = 0
        """``threading.get_ident()`` of the guard's thread: only its calls are measured."""
        self.released = threading.Event()
        """Set at the owner's release: work deferred past it (telling containerd) waits for it."""
        self._gc_start = 0
        gc.callbacks.append(self._on_gc)

    def on_guard_thread(self) -> bool:
        """On the return's path: the guard's thread, or the agent's eviction executor it hands
        the eviction to (detection cycles run on neither)."""
        return threading.get_ident() == self.guard_thread or threading.current_thread().name.startswith(
            EvictionExecutor.PREFIX
        )

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.monotonic_ns()
        elif self._gc_start and self.marks.signal and not self.marks.released:
            self.marks.gc_ns += time.monotonic_ns() - self._gc_start


class Helper:
    """The compiled killer as a long-lived process (see ``helper-pinned``)."""

    def __init__(self, binary: Path) -> None:
        self._proc = subprocess.Popen([str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def kill_and_wait(self, pids: Sequence[int]) -> tuple[int, int]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(" ".join(map(str, pids)) + "\n")
        self._proc.stdin.flush()
        killed, exited = self._proc.stdout.readline().split()
        return int(killed), int(exited)

    def close(self) -> None:
        self._proc.kill()
        self._proc.wait(10)


class ProbedTasks(ContainerdTasks):
    """The agent's containerd task port with the stop strategy of one variant and probes."""

    def __init__(self, address: str, namespace: str, probe: Probe, helper: Helper | None) -> None:
        super().__init__(address, namespace, pin_pidfds=False)
        self.probe = probe
        self.helper = helper
        self._strategy = "containerd"
        self.nice_boost = False
        self._notify = ThreadPoolExecutor(1, thread_name_prefix="bench-notify")
        self.pinned: dict[str, tuple[int, int]] = {}
        """Container ID -> (init PID, pidfd), opened before the signal (``*-pinned``)."""

    @property
    def strategy(self) -> str:
        return self._strategy

    @strategy.setter
    def strategy(self, name: str) -> None:
        """Set before the agent starts: ``containerd-pinned`` pins what the agent's refreshes name."""
        self._strategy = name
        if self.pins is not None:
            self.pins.close()
        self.pins = PinTable(self._init_pids) if name == "containerd-pinned" else None

    def close(self) -> None:
        self._notify.shutdown(wait=True)
        super().close()

    def _wait(self, container_id: str, timeout: float) -> Any:
        future = super()._wait(container_id, timeout)
        marks = self.probe.marks
        if self.probe.on_guard_thread():
            future.add_done_callback(lambda _f: marks.wait_done.append(time.monotonic_ns()))
        return future

    def _kill_now(self, container_ids: list[str], pinned: dict[str, str], raised: list[Raised]) -> dict[str, Pinned]:
        signalled = {} if self.strategy == "kill-rpc" else super()._kill_now(container_ids, pinned, raised)
        if self.probe.on_guard_thread():
            self.probe.marks.killed = time.monotonic_ns()
        return signalled

    def stop_tasks(self, container_ids: Sequence[str], *, grace: float, timeout: float) -> list[TaskStopResult]:
        if not self.probe.on_guard_thread():  # a detection cycle's own stop (``+detect``): not measured
            return super().stop_tasks(container_ids, grace=grace, timeout=timeout)
        marks = self.probe.marks
        marks.stop_enter = time.monotonic_ns()
        if self.strategy in SHIPPED:
            self.verify_by_pidfd = self.strategy in PIDFD_VERIFIED
            results = super().stop_tasks(container_ids, grace=grace, timeout=timeout)
            marks.reported = max(marks.wait_done, default=time.monotonic_ns())
        else:
            results = self._stop_direct(list(container_ids), timeout)
        marks.stop_return = time.monotonic_ns()
        return results

    def _stop_direct(self, cids: list[str], timeout: float) -> list[TaskStopResult]:
        marks = self.probe.marks
        opened: dict[int, int] = {}
        if self.strategy == "pidfd-get":
            futures = {c: self._tasks.Get.future(_get(c), metadata=self._md, timeout=2) for c in cids}
            pids = {c: int(f.result().process.pid) for c, f in futures.items()}
            opened, _ = pidkill.pin(pids.values())
            fds = {c: opened[p] for c, p in pids.items() if p in opened}
        else:
            fds = {c: self.pinned[c][1] for c in cids if c in self.pinned}
        if self.strategy == "helper-pinned":
            assert self.helper is not None
            marks.killed, exited = self.helper.kill_and_wait([self.pinned[c][0] for c in fds])
            seen = set(fds.values()) if exited == len(fds) else set()
        else:
            pidkill.signal_all(fds.values())
            marks.killed = time.monotonic_ns()
            if self.nice_boost:
                for pid in {self.pinned[c][0] for c in fds if c in self.pinned} | set(opened):
                    with contextlib.suppress(OSError):
                        os.setpriority(os.PRIO_PROCESS, pid, -20)
            seen = pidkill.wait_exited(fds.values(), time.monotonic() + timeout)
        marks.reported = time.monotonic_ns()
        pidkill.close_all(opened)
        self._notify.submit(self._tell_containerd, cids, timeout)  # off the owner's path
        return [
            TaskStopResult(c, TaskState.STOPPED, 137, "pidfd readable", 9)
            if fds.get(c) in seen
            else TaskStopResult(c, TaskState.FAILED, None, "not seen exiting", 9)
            for c in cids
        ]

    def _tell_containerd(self, cids: Sequence[str], timeout: float) -> None:
        """containerd's Kill(all) after the owner's release: it learns of the exits and kills any
        process outside the container's PID namespace."""
        self.probe.released.wait(timeout)
        for future in [self._kill(c, signal.SIGKILL, all_processes=True, timeout=timeout) for c in cids]:
            with contextlib.suppress(Exception):
                future.result()


def _get(cid: str) -> Any:
    from spotgpu.adapters.proto import containerd_tasks_pb2 as tpb

    return tpb.GetRequest(container_id=cid)


class TimedGuard(FakeGuard):
    """Records when the agent disarms (the owner's release)."""

    def __init__(self, probe: Probe) -> None:
        super().__init__()
        self.probe = probe

    def disarm(self, owner: Any) -> None:
        super().disarm(owner)
        if self.probe.on_guard_thread() and not self.probe.marks.released:
            self.probe.marks.released = time.monotonic_ns()
            self.probe.released.set()


# -- scheduler statistics --------------------------------------------------------------------


def _schedstat(task_dir: Path) -> tuple[int, int]:
    try:
        run_ns, wait_ns, _ = (task_dir / "schedstat").read_text().split()
    except (OSError, ValueError):
        return 0, 0
    return int(run_ns), int(wait_ns)


def rq_wait(pids: Sequence[int]) -> dict[int, int]:
    """Run-queue wait (ns) of every thread of ``pids``, by thread ID."""
    waits: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                waits[int(task.name)] = _schedstat(task)[1]
    return waits


def runtime_pids(containerd: Containerd) -> list[int]:
    """containerd and the shims started for it."""
    marker = containerd.address.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                if marker in cmdline or str(containerd.base).encode() in cmdline:
                    found.append(int(entry.name))
    return found


def rq_wait_delta(before: dict[int, int], after: dict[int, int]) -> int:
    return sum(v - before.get(t, 0) for t, v in after.items())


__all__ = [
    "KILLER_C",
    "SHIPPED",
    "Helper",
    "Marks",
    "Probe",
    "ProbedTasks",
    "TimedGuard",
    "rq_wait",
    "rq_wait_delta",
    "runtime_pids",
]
