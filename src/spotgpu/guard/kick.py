"""Rescue GPU calls stranded in a notification whose receiver died: restart them.

Side effects: reads ``/proc/<pid>/task/<tid>/{wchan,syscall}`` of every thread on the host, and
briefly ptrace-stops the threads it finds (``PTRACE_SEIZE`` + ``PTRACE_INTERRUPT`` +
``PTRACE_DETACH``). Decides only which threads qualify.

Why: the kernel forgets a notification only when the last copy of its notify fd is closed; the
holder keeps a copy, so a guard that dies after receiving a notification and before answering
it would leave that caller blocked forever, and nobody else can answer it without its cookie.
A ptrace interrupt makes the blocked ``ioctl`` return ``-ERESTARTSYS`` and, since no signal
handler runs, the kernel restarts it: the filter runs again and a *new* notification reaches
whoever receives now. The ioctl never ran, so restarting it is exactly transparent (measured:
the old cookie turns invalid, the new one arrives, CONTINUE completes the call).

Which threads: those whose ``wchan`` is seccomp's notification wait (or, where the kernel hides
wait channels, that sleep) and whose current syscall is ``ioctl`` with a request the guard's
rule matches (so only calls our filters stopped).
Residual risk, stated in docs/guard.md: a thread that leaves that wait between the check and
the interrupt is interrupted in whatever it does next; an interruptible syscall there may see
EINTR. The window is microseconds and exists only during a takeover after a crash.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from spotgpu.guard.rule import GUARD_MATCH, IoctlMatch
from spotgpu.guard.seccomp import native_arch

log = logging.getLogger(__name__)

PTRACE_DETACH: Final = 17
PTRACE_SEIZE: Final = 0x4206
PTRACE_INTERRUPT: Final = 0x4207
WALL: Final = 0x4000_0000  # __WALL: wait for threads that are not thread-group leaders too
SECCOMP_WAIT: Final = "seccomp_do_user_notification"

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True, slots=True)
class BlockedCall:
    pid: int
    tid: int
    request: int


@dataclass(slots=True)
class KickReport:
    found: list[BlockedCall] = field(default_factory=list)
    restarted: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)


def parse_syscall_line(text: str) -> tuple[int, tuple[int, ...]] | None:
    """``/proc/<tid>/syscall``: (number, args) for a thread blocked in a syscall, else None."""
    parts = text.split()
    if len(parts) < 7 or parts[0] in ("running", "-1"):
        return None
    try:
        return int(parts[0]), tuple(int(p, 16) for p in parts[1:7])
    except ValueError:
        return None


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _threads(proc: Path, pid_namespaces: set[str] | None) -> Iterator[tuple[int, int]]:
    try:
        pids = [int(e.name) for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return
    for pid in pids:
        if pid_namespaces is not None:
            try:
                if os.readlink(proc / str(pid) / "ns" / "pid") not in pid_namespaces:
                    continue
            except OSError:
                continue
        try:
            tids = [int(e.name) for e in os.scandir(proc / str(pid) / "task") if e.name.isdigit()]
        except OSError:
            continue
        for tid in tids:
            yield pid, tid


def blocked_in_notification(
    pid: int, tid: int, match: IoctlMatch = GUARD_MATCH, proc: Path = Path("/proc"), nr_ioctl: int | None = None
) -> BlockedCall | None:
    """The matched ``ioctl`` thread ``tid`` of ``pid`` waits in, if it waits in a notification."""
    tid_dir = f"{proc}/{pid}/task/{tid}"
    wchan = _read(f"{tid_dir}/wchan").strip()
    if wchan in ("", "0"):
        # The kernel hides wait channels: a thread *sleeping* in the matched ioctl can only be in
        # the notification wait, because the driver answers the version check without sleeping.
        stat = _read(f"{tid_dir}/stat")
        if stat.rpartition(")")[2].split()[:1] != ["S"]:
            return None
    elif SECCOMP_WAIT not in wchan:
        return None
    parsed = parse_syscall_line(_read(f"{tid_dir}/syscall"))
    if parsed is None:
        return None
    nr, args = parsed
    if nr != (native_arch().nr_ioctl if nr_ioctl is None else nr_ioctl) or not match.matches(args[1]):
        return None
    return BlockedCall(pid=pid, tid=tid, request=args[1] & 0xFFFF_FFFF)


def find_blocked(
    match: IoctlMatch = GUARD_MATCH, proc: Path = Path("/proc"), pid_namespaces: set[str] | None = None
) -> list[BlockedCall]:
    """Threads stopped in a notification for a call ``match`` selects: on the whole host, or
    only in processes whose ``ns/pid`` link is in ``pid_namespaces`` (``pid:[<inode>]``)."""
    if pid_namespaces is not None and not pid_namespaces:
        return []
    nr_ioctl = native_arch().nr_ioctl
    found = []
    for pid, tid in _threads(proc, pid_namespaces):
        call = blocked_in_notification(pid, tid, match, proc, nr_ioctl)
        if call is not None:
            found.append(call)
    return found


def _ptrace(request: int, tid: int, data: int = 0) -> None:
    if _libc.syscall(native_arch().nr_ptrace, request, tid, 0, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"ptrace({request:#x}, {tid}): {os.strerror(err)}")


def restart_call(tid: int, timeout: float = 1.0) -> None:
    """Make thread ``tid`` leave a seccomp notification wait so that its syscall restarts."""
    _ptrace(PTRACE_SEIZE, tid)
    _ptrace(PTRACE_INTERRUPT, tid)  # if this fails the thread is exiting; the kernel detaches us
    deadline = time.monotonic() + timeout
    while True:
        try:
            got, status = os.waitpid(tid, os.WNOHANG | WALL)
        except ChildProcessError:
            return  # it exited meanwhile
        if got == tid:
            if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                return
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"thread {tid} did not stop within {timeout}s after PTRACE_INTERRUPT")
        time.sleep(0.0005)
    # A signal-delivery stop carries a real signal that must not be lost; an interrupt stop
    # (PTRACE_EVENT_STOP) carries none.
    sig = os.WSTOPSIG(status)
    event = status >> 16
    deliver = sig if event == 0 and sig != signal.SIGTRAP else 0
    _ptrace(PTRACE_DETACH, tid, deliver)


def kick_blocked(
    match: IoctlMatch = GUARD_MATCH, proc: Path = Path("/proc"), pid_namespaces: set[str] | None = None
) -> KickReport:
    """Restart every call found by :func:`find_blocked`; never raises."""
    report = KickReport()
    try:
        report.found = find_blocked(match, proc, pid_namespaces)
    except OSError as exc:
        log.error("guard takeover: cannot scan %s for stranded calls: %s", proc, exc)
        return report
    for call in report.found:
        # Re-check right before interrupting, to keep the race window as small as possible.
        if blocked_in_notification(call.pid, call.tid, match, proc) is None:
            continue
        try:
            restart_call(call.tid)
        except (OSError, TimeoutError) as exc:
            if getattr(exc, "errno", None) == errno.ESRCH:
                continue  # gone
            report.failed[call.tid] = str(exc)
        else:
            report.restarted.append(call.tid)
    return report


__all__ = [
    "BlockedCall",
    "KickReport",
    "blocked_in_notification",
    "find_blocked",
    "kick_blocked",
    "parse_syscall_line",
    "restart_call",
]
