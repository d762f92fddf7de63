"""Raise the calling thread's CPU scheduling priority (for threads an owner waits on).

Side effects: ``sched_setscheduler`` or ``setpriority`` on the calling thread's TID (Linux
schedules threads, not processes: other threads of the process keep their priority; threads
the raised one starts inherit it). Nothing else.

Why: on a node whose CPUs are saturated (data loaders, other tenants), a thread woken to do
a few milliseconds of work waits in the run queue behind every runnable normal-priority
thread. The owner's held first GPU call waits on exactly such threads (the guard's, the
eviction's). ``SCHED_RR`` (a real-time class) runs them ahead of every ``SCHED_OTHER`` thread;
they block almost all of the time, so they take CPU only for the work they do (the kernel's
real-time throttling, 95 % of each second by default, bounds a runaway). Without the
privilege (``CAP_SYS_NICE``) the kernel refuses; the fallback is nice -10 (a larger CFS share,
same privilege for lowering the value), and without that the thread runs at normal priority.
Every refusal is logged once per thread name. :func:`normal_priority` lowers a raised thread
for a block (the work after an owner's release).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

log = logging.getLogger(__name__)

RR_PRIORITY: Final = 10
"""The ``SCHED_RR`` priority (1-99): above every normal thread, below the kernel's own
real-time threads (50 and up) and well below watchdogs (99)."""
NICE: Final = -10
"""The fallback's nice value."""

_warned: set[str] = set()
_warned_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Priority:
    """What :func:`raise_thread` achieved for one thread."""

    tid: int
    policy: str
    """``"SCHED_RR 10"``, ``"nice -10"`` or ``"normal"``."""
    refused: tuple[str, ...] = ()
    """What the kernel refused on the way (empty when the first choice worked)."""

    @property
    def raised(self) -> bool:
        return self.policy != "normal"


def _warn_once(name: str, message: str, *args: object) -> None:
    with _warned_lock:
        if name in _warned:
            log.debug(message, *args)
            return
        _warned.add(name)
    log.warning(message, *args)


def raise_thread(*, name: str | None = None) -> Priority:
    """Raise the calling thread to ``SCHED_RR`` :data:`RR_PRIORITY`, or when the kernel refuses
    to nice :data:`NICE`; never raises (a refusal is logged, once per thread name)."""
    tid = threading.get_native_id()
    label = name or threading.current_thread().name
    refused: list[str] = []
    try:
        os.sched_setscheduler(tid, os.SCHED_RR, os.sched_param(RR_PRIORITY))
        return Priority(tid, f"SCHED_RR {RR_PRIORITY}")
    except (OSError, AttributeError) as exc:
        refused.append(f"SCHED_RR {RR_PRIORITY}: {exc}")
    try:
        os.setpriority(os.PRIO_PROCESS, tid, NICE)
        result = Priority(tid, f"nice {NICE}", tuple(refused))
    except OSError as exc:
        refused.append(f"nice {NICE}: {exc}")
        result = Priority(tid, "normal", tuple(refused))
    if refused:
        _warn_once(
            label,
            "thread %s (tid %d): the kernel refused %s; running at %s (needs CAP_SYS_NICE)",
            label,
            tid,
            "; ".join(refused),
            result.policy,
        )
    return result


@contextlib.contextmanager
def normal_priority() -> Iterator[None]:
    """Run the block at normal priority (``SCHED_OTHER``, nice 0) when the calling thread is
    raised, and raise it back afterwards: work that no longer holds anyone up (after an owner's
    release) must not compete with the threads it woke. Never raises."""
    tid = threading.get_native_id()
    try:
        policy, param = os.sched_getscheduler(tid), os.sched_getparam(tid)
        nice = os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:
        yield
        return
    raised = policy in (os.SCHED_RR, os.SCHED_FIFO) or nice < 0
    if raised:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, 0)
    try:
        yield
    finally:
        if raised:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                os.sched_setscheduler(tid, policy, param)


def thread_policy(tid: int) -> str:
    """The scheduling policy of thread ``tid`` in :attr:`Priority.policy`'s words (for tests
    and diagnostics)."""
    policy = os.sched_getscheduler(tid)
    if policy in (os.SCHED_RR, os.SCHED_FIFO):
        name = "SCHED_RR" if policy == os.SCHED_RR else "SCHED_FIFO"
        return f"{name} {os.sched_getparam(tid).sched_priority}"
    nice = os.getpriority(os.PRIO_PROCESS, tid)
    return f"nice {nice}" if nice else "normal"


__all__ = ["NICE", "RR_PRIORITY", "Priority", "normal_priority", "raise_thread", "thread_policy"]
