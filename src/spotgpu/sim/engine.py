"""The discrete-event engine: a heap of ``(time, priority, sequence, event)``.

Pure and deterministic; no I/O, no wall clock, no global randomness. Events are plain data;
the engine only orders them and hands each one, in order, to the handler the caller gives
:meth:`Engine.run`. Ordering rules:

* earlier ``time`` first;
* at equal time, lower ``priority`` first (see :class:`Priority`: state changes caused by the
  world happen before the agent reacts, the agent before the scheduler, checks last);
* at equal time and priority, the order of scheduling (a sequence number), so a run is fully
  determined by its inputs.

An event can be cancelled by handle; cancelled entries stay in the heap and are skipped when
popped (cheaper than removing them). An exception raised by the handler stops the run and
propagates unchanged: nothing is swallowed.

:class:`SimClock` exposes the engine's time through the :class:`~spotgpu.core.clock.Clock`
protocol so that decision code that takes a clock runs unchanged in the simulator.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from enum import IntEnum
from typing import Generic, Protocol, TypeVar

from spotgpu.core.errors import ValidationError

E = TypeVar("E")


class Priority(IntEnum):
    """Tie-break between events at the same instant (lower runs first)."""

    WORLD = 0
    """Trace-driven changes: owners start or stop working, jobs arrive, work completes."""
    AGENT = 10
    """Node agent reactions: detection polls, evictions finishing, guard releases."""
    CONTROLLER = 20
    """Control-plane reactions: gang teardown, requeue."""
    SCHEDULER = 30
    """A scheduling cycle (sees everything that happened at this instant)."""
    CHECK = 40
    """Invariant checks and metric samples (see the state after everything else)."""


class EngineError(ValidationError):
    """An event was scheduled in the past, at a non-finite time, or the engine was misused."""


class Engine(Generic[E]):
    """Event queue and simulated time. ``now`` only moves forward."""

    __slots__ = ("_cancelled", "_heap", "_now", "_seq", "processed")

    def __init__(self, start: float = 0.0) -> None:
        if not math.isfinite(start):
            raise EngineError(f"start time must be finite, got {start!r}")
        self._now = start
        self._heap: list[tuple[float, int, int, E]] = []
        self._seq = 0
        self._cancelled: set[int] = set()
        self.processed = 0
        """Events handed to the handler so far (cancelled ones not counted)."""

    @property
    def now(self) -> float:
        return self._now

    def __len__(self) -> int:
        """Scheduled events not yet processed (cancelled ones excluded)."""
        return len(self._heap) - len(self._cancelled)

    def at(self, time: float, event: E, priority: int = Priority.WORLD) -> int:
        """Schedule ``event`` at absolute ``time``; return a handle for :meth:`cancel`."""
        if not math.isfinite(time):
            raise EngineError(f"cannot schedule {event!r} at non-finite time {time!r}")
        if time < self._now:
            raise EngineError(f"cannot schedule {event!r} at {time:.6f}, before now ({self._now:.6f})")
        seq = self._seq
        self._seq += 1
        heapq.heappush(self._heap, (time, int(priority), seq, event))
        return seq

    def after(self, delay: float, event: E, priority: int = Priority.WORLD) -> int:
        """Schedule ``event`` ``delay`` seconds from now."""
        if delay < 0:
            raise EngineError(f"cannot schedule {event!r} with negative delay {delay!r}")
        return self.at(self._now + delay, event, priority)

    def cancel(self, handle: int) -> None:
        """Cancel a scheduled event (idempotent; unknown or already processed handles are ignored)."""
        if 0 <= handle < self._seq:
            self._cancelled.add(handle)

    def peek_time(self) -> float | None:
        """Time of the next live event, or None when none is left."""
        self._drop_cancelled_head()
        return self._heap[0][0] if self._heap else None

    def run(self, handler: Callable[[E], None], until: float) -> None:
        """Process events in order while their time is <= ``until``; then set ``now = until``.

        Events scheduled by the handler are processed in the same run when due. Events after
        ``until`` stay queued, so ``run`` can be called again with a later bound.
        """
        if until < self._now:
            raise EngineError(f"cannot run until {until}, before now ({self._now})")
        heap = self._heap
        cancelled = self._cancelled
        while heap and heap[0][0] <= until:
            time, _, seq, event = heapq.heappop(heap)
            if seq in cancelled:
                cancelled.discard(seq)
                continue
            self._now = time
            self.processed += 1
            handler(event)
        self._now = until

    def _drop_cancelled_head(self) -> None:
        heap = self._heap
        while heap and heap[0][2] in self._cancelled:
            self._cancelled.discard(heapq.heappop(heap)[2])


class _HasNow(Protocol):
    @property
    def now(self) -> float: ...


class SimClock:
    """The engine's time as a :class:`~spotgpu.core.clock.Clock` (``time() = epoch + now``)."""

    __slots__ = ("_engine", "epoch")

    def __init__(self, engine: _HasNow, epoch: float) -> None:
        self._engine = engine
        self.epoch = epoch

    def monotonic(self) -> float:
        return self._engine.now

    def time(self) -> float:
        return self.epoch + self._engine.now


__all__ = ["Engine", "EngineError", "Priority", "SimClock"]
