"""A small progress display on stderr for ``spotgpu simulate``.

Side effects: writes to the stream it is given (stderr) and reads the wall clock to rate-limit
redraws and show the elapsed time. On a terminal it redraws one line in place; otherwise (a log
file, CI) it prints a plain line at every further 10% so that logs stay short.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TextIO


class Progress:
    """Tracks each policy's simulated fraction; call it as ``progress(policy, fraction)``."""

    def __init__(
        self,
        policies: Sequence[str],
        stream: TextIO,
        *,
        width: int = 30,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.done = dict.fromkeys(policies, 0.0)
        self.stream = stream
        self.width = width
        self.clock = clock
        self.start = clock()
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._last_draw = -1.0
        self._last_decile = -1

    @property
    def overall(self) -> float:
        return sum(self.done.values()) / len(self.done) if self.done else 1.0

    def __call__(self, policy: str, fraction: float) -> None:
        self.done[policy] = max(self.done.get(policy, 0.0), min(1.0, fraction))
        now = self.clock()
        if self.tty:
            if now - self._last_draw >= 0.1 or self.overall >= 1.0:
                self._last_draw = now
                self.stream.write("\r" + self.line(now))
                self.stream.flush()
        else:
            decile = int(self.overall * 10)
            if decile > self._last_decile:
                self._last_decile = decile
                self.stream.write(self.line(now).rstrip() + "\n")
                self.stream.flush()

    def line(self, now: float) -> str:
        frac = self.overall
        filled = round(frac * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        running = [name for name, f in self.done.items() if 0.0 < f < 1.0]
        finished = sum(1 for f in self.done.values() if f >= 1.0)
        what = f"{finished}/{len(self.done)} policies done"
        if running:
            what += "; " + ", ".join(f"{n} {self.done[n]:.0%}" for n in running[:3])
        return f"simulate [{bar}] {frac:4.0%} {now - self.start:5.1f}s {what}"[:160].ljust(100)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()


__all__ = ["Progress"]
