"""The kernel's exit times of processes, taken by a watcher at real-time priority.

Side effects: builds a static C program (:mod:`spotgpu.testing.cbuild`) and runs it as a
child process that pins each process it is told about with a pidfd and reports its exit; a
reader thread in this process.

Why: the return path's checks (``spotgpu node-e2e``) and its analysis (``spotgpu bench
returnpath``) need to know *when* a spot process really exited (closed its files, the GPU's
among them), as the kernel saw it, independent of the code under test and of containerd's
bookkeeping (its shim records an exit when it has reaped the process and containerd has
heard of it, which may be after the owner was released although the process was long gone).
A pidfd turns readable when its process has exited; the watcher runs at ``SCHED_FIFO`` 50,
above every thread of the agent (its real-time threads run at 10) and everything at normal
priority, so it takes the timestamp (``CLOCK_MONOTONIC``, the same clock as
``time.monotonic_ns()`` and as a container's own, runc creating no time namespace) within
microseconds of the exit. A timestamp can therefore come after the true exit, never before it.

Protocol of the program (line by line): it prints ``ready fifo`` (or ``ready nofifo`` when the
kernel refused ``SCHED_FIFO``), then for each PID read on stdin ``pinned <pid>`` or ``gone
<pid>`` (not running, or not visible), and ``exit <pid> <ns>`` as soon as a pinned process has
exited. EOF on stdin ends it.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from spotgpu.testing.cbuild import compile_static

WATCHER_SOURCE: Final = r"""
/* exitwatch: see spotgpu/testing/exitwatch.py */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_WATCHED 4096

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(void) {
    static struct pollfd p[MAX_WATCHED + 1];
    static int pids[MAX_WATCHED + 1];
    struct sched_param sp = {.sched_priority = 50};
    char buf[65536];
    size_t len = 0;
    int n = 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready %s\n", sched_setscheduler(0, SCHED_FIFO, &sp) == 0 ? "fifo" : "nofifo");
    p[0].fd = 0;
    p[0].events = POLLIN;
    for (;;) {
        if (poll(p, n, -1) < 0) {
            if (errno == EINTR) continue;
            return 1;
        }
        long long t = now_ns();
        int kept = 1;
        for (int i = 1; i < n; i++) {
            if (p[i].revents) {
                printf("exit %d %lld\n", pids[i], t);
                close(p[i].fd);
            } else {
                p[kept] = p[i];
                pids[kept++] = pids[i];
            }
        }
        n = kept;
        if (!p[0].revents) continue;
        ssize_t got = read(0, buf + len, sizeof buf - 1 - len);
        if (got <= 0) return 0;
        len += (size_t)got;
        char *line = buf, *end;
        while ((end = memchr(line, '\n', len - (size_t)(line - buf))) != NULL) {
            *end = 0;
            int pid = atoi(line);
            int fd = n <= MAX_WATCHED && pid > 0 ? (int)syscall(SYS_pidfd_open, pid, 0) : -1;
            if (fd < 0) {
                printf("gone %d\n", pid);
            } else {
                p[n].fd = fd;
                p[n].events = POLLIN;
                p[n].revents = 0;
                pids[n++] = pid;
                printf("pinned %d\n", pid);
            }
            line = end + 1;
        }
        len -= (size_t)(line - buf);
        memmove(buf, line, len);
    }
}
"""


class ExitWatcher:
    """The watcher process (see module docstring): :meth:`watch` PIDs, then read their
    :meth:`exit_ns`. Build it once per run; :meth:`close` it."""

    ANSWER_TIMEOUT: Final = 5.0

    def __init__(self, directory: Path) -> None:
        binary = compile_static(WATCHER_SOURCE, directory, "exitwatch")
        self._proc = subprocess.Popen(
            [str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self._cond = threading.Condition()
        self._answers: dict[int, bool] = {}
        self._exits: dict[int, int] = {}
        self.realtime: bool | None = None
        """Whether the kernel granted ``SCHED_FIFO`` (None until the program started)."""
        self._reader = threading.Thread(target=self._read, name="exitwatch", daemon=True)
        self._reader.start()
        with self._cond:
            if not self._cond.wait_for(lambda: self.realtime is not None, self.ANSWER_TIMEOUT):
                self.close()
                raise RuntimeError("the exit watcher did not start")

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            words = line.split()
            with self._cond:
                if words[:1] == ["ready"]:
                    self.realtime = words[1:] == ["fifo"]
                elif len(words) == 2 and words[0] in ("pinned", "gone"):
                    self._answers[int(words[1])] = words[0] == "pinned"
                elif len(words) == 3 and words[0] == "exit":
                    self._exits[int(words[1])] = int(words[2])
                self._cond.notify_all()

    def watch(self, pids: Iterable[int]) -> set[int]:
        """Pin ``pids``; returns the ones pinned (the others were not running, or not visible)."""
        wanted = list(dict.fromkeys(pids))
        assert self._proc.stdin is not None
        with self._cond:
            for pid in wanted:
                self._answers.pop(pid, None)
                self._exits.pop(pid, None)
        self._proc.stdin.write("".join(f"{pid}\n" for pid in wanted))
        self._proc.stdin.flush()
        with self._cond:
            if not self._cond.wait_for(lambda: all(p in self._answers for p in wanted), self.ANSWER_TIMEOUT):
                raise RuntimeError(f"the exit watcher did not answer for {wanted}")
            return {p for p in wanted if self._answers[p]}

    def exit_ns(self, pid: int, timeout: float = 0.0) -> int | None:
        """When the watched process ``pid`` exited (CLOCK_MONOTONIC ns), waiting up to
        ``timeout`` seconds; None while it runs."""
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits, timeout)
            return self._exits.get(pid)

    def exits(self, pids: Iterable[int], timeout: float) -> dict[int, int | None]:
        """:meth:`exit_ns` of several PIDs, all within one ``timeout``."""
        deadline = time.monotonic() + timeout
        return {pid: self.exit_ns(pid, max(0.0, deadline - time.monotonic())) for pid in pids}

    def close(self) -> None:
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(5)
        self._reader.join(5)


__all__ = ["WATCHER_SOURCE", "ExitWatcher"]
