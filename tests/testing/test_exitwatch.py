"""spotgpu.testing.exitwatch on real processes: an exit is timestamped by the kernel's clock
after the kill and before the waiter saw it, a PID that is not running is answered "gone", and
the watcher runs at SCHED_FIFO (root)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotgpu.testing.exitwatch import ExitWatcher

pytestmark = pytest.mark.root


@pytest.fixture
def watcher(tmp_path: Path) -> Iterator[ExitWatcher]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc (with a static libc) is needed to build the exit watcher")
    watcher = ExitWatcher(tmp_path)
    yield watcher
    watcher.close()


def test_an_exit_is_timestamped_between_the_kill_and_the_reap(watcher: ExitWatcher) -> None:
    assert watcher.realtime is True
    victim, other = subprocess.Popen(["sleep", "1000"]), subprocess.Popen(["sleep", "1000"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        assert watcher.watch([victim.pid, other.pid, gone.pid]) == {victim.pid, other.pid}
        assert watcher.exit_ns(victim.pid) is None
        killed = time.monotonic_ns()
        victim.kill()
        victim.wait()
        reaped = time.monotonic_ns()
        at = watcher.exit_ns(victim.pid, timeout=5)
        assert at is not None and killed <= at <= reaped + 5_000_000
        assert watcher.exits([victim.pid, other.pid], 0.05) == {victim.pid: at, other.pid: None}
    finally:
        for proc in (victim, other):
            proc.kill()
            proc.wait()
