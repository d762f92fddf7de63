"""spotgpu.adapters.pidkill on real processes: every pinned process is SIGKILLed and seen
exiting; a PID that is gone is reported, never guessed; a pinned process that exited and was
reaped stays that process (no other process is signalled through its old PID)."""

from __future__ import annotations

import subprocess
import time

from spotgpu.adapters import pidkill


def _sleepers(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(["sleep", "1000"]) for _ in range(n)]


def test_kill_all_and_wait_kills_every_process_and_sees_each_exit() -> None:
    procs = _sleepers(3)
    try:
        result = pidkill.kill_all_and_wait([p.pid for p in procs], timeout=10)
    finally:
        for p in procs:
            p.kill()
    assert sorted(result.exited) == sorted(p.pid for p in procs)
    assert result.alive == () and result.missing == () and result.all_exited
    assert [p.wait(5) for p in procs] == [-9, -9, -9]


def test_a_pid_that_is_gone_is_missing_not_killed() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    live = _sleepers(1)[0]
    try:
        result = pidkill.kill_all_and_wait([gone.pid, 0, live.pid], timeout=10)
    finally:
        live.kill()
    assert result.missing == (gone.pid, 0)
    assert result.exited == (live.pid,)


def test_wait_exited_returns_at_the_deadline_with_live_processes_left() -> None:
    live = _sleepers(1)[0]
    pinned, _ = pidkill.pin([live.pid])
    try:
        assert pidkill.wait_exited(pinned.values(), time.monotonic() + 0.05) == set()
        assert live.poll() is None
    finally:
        pidkill.close_all(pinned)
        live.kill()
        live.wait()


def test_a_pinned_process_reaped_meanwhile_counts_as_exited_and_nothing_else_is_signalled() -> None:
    victim = _sleepers(1)[0]
    pinned, _ = pidkill.pin([victim.pid])
    try:
        victim.kill()
        victim.wait()  # reaped: its PID may now name another process; the pidfd does not
        result = pidkill.kill_pinned_and_wait(pinned, timeout=10)
    finally:
        pidkill.close_all(pinned)
    assert result.exited == (victim.pid,) and result.alive == ()
