"""Test harness for the return guard: the guard as a separate process (so tests can SIGKILL
it), on top of :mod:`spotgpu.testing.guard_testbed` (runc owner containers, the fd holder process).

Everything lives under one short private directory per test (unix socket paths are limited
to 108 bytes, pytest's tmp_path can be longer); every process started here is killed and every
container deleted in fixture teardown, also when the test fails.
"""

from __future__ import annotations

import errno
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from spotgpu.testing.guard_testbed import HolderProcess, Lines, OwnerContainer

HERE = Path(__file__).parent
GUARD_PROC = HERE / "guard_proc.py"

__all__ = ["GuardProcess", "HolderProcess", "OwnerContainer", "assert_quick", "wait_log"]

QUICK_S = 1.0
"""Bound on one unheld session call, and on how soon a released or resumed call completes."""


def assert_quick(result: dict[str, int], bound_s: float = QUICK_S) -> float:
    """The call reached the stand-in driver (ENOTTY; ENOSYS would mean a lost notify fd) within
    ``bound_s``; returns how long it took."""
    assert result["errno"] == errno.ENOTTY, result
    took = (result["end_ns"] - result["start_ns"]) / 1e9
    assert took < bound_s, took
    return took


class GuardProcess:
    """tests/guard/guard_proc.py: a GuardService in its own process, driven over stdin."""

    def __init__(
        self, listener: Path, control: Path, *, fail_open: float = 5.0, holder_timeout: float = 1.0, log: Path
    ) -> None:
        self.args = [
            sys.executable,
            str(GUARD_PROC),
            "--listener",
            str(listener),
            "--control",
            str(control),
            "--fail-open",
            str(fail_open),
            "--holder-timeout",
            str(holder_timeout),
        ]
        self.log_path = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.out: Lines | None = None

    def start(self, timeout: float = 15.0) -> GuardProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        assert self.proc.stdout is not None
        self.out = Lines(self.proc.stdout, "guard")
        self.out.wait_for("ready", timeout)
        return self

    def command(self, text: str, timeout: float = 10.0) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None and self.out is not None
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()
        return self.out.wait_for("done", timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""


def wait_log(holder: HolderProcess, text: str, timeout: float = 10.0, count: int = 1) -> None:
    """Wait until ``text`` appears ``count`` times in the holder's log (another process: its
    log is the only ordering evidence a test has)."""
    deadline = time.monotonic() + timeout
    while holder.log().count(text) < count:
        assert time.monotonic() < deadline, f"{text!r} not in the holder's log:\n{holder.log()}"
        time.sleep(0.02)
