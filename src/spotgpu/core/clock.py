"""Time as an input: the :class:`Clock` protocol and its two implementations.

The decision core never reads the wall clock; it receives a :class:`Clock` (or a timestamp)
from its caller. :class:`SystemClock` is the only place that reads real time (a side effect);
:class:`ManualClock` is moved by tests and by the simulator.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a monotonic scale (for intervals and deadlines)."""
        ...

    def time(self) -> float:
        """Seconds since the Unix epoch (for timestamps shown to people and written to the API)."""
        ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


@runtime_checkable
class Timer(Protocol):
    """Real elapsed time and waiting, for retry budgets against other processes (the API
    server): unlike a :class:`Clock` it is never simulated, since what it bounds is not."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemTimer:
    """The real :class:`Timer`."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class ManualClock:
    """A clock that only moves when told to; thread-safe. ``time()`` = ``epoch + monotonic()``."""

    def __init__(self, start: float = 0.0, epoch: float = 1_700_000_000.0) -> None:
        self._now = start
        self._epoch = epoch
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def time(self) -> float:
        with self._lock:
            return self._epoch + self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, now: float) -> None:
        with self._lock:
            if now < self._now:
                raise ValueError(f"a clock cannot go back (from {self._now} to {now})")
            self._now = now


__all__ = ["Clock", "ManualClock", "SystemClock", "SystemTimer", "Timer"]
