"""The discrete-event engine: ordering, cancellation, bounds, errors propagate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core.clock import Clock
from spotgpu.sim.engine import Engine, EngineError, Priority, SimClock


def test_orders_by_time_then_priority_then_scheduling_order() -> None:
    engine: Engine[str] = Engine()
    engine.at(5.0, "late")
    engine.at(1.0, "check", Priority.CHECK)
    engine.at(1.0, "world-1", Priority.WORLD)
    engine.at(1.0, "scheduler", Priority.SCHEDULER)
    engine.at(1.0, "world-2", Priority.WORLD)
    engine.at(1.0, "agent", Priority.AGENT)
    seen: list[tuple[float, str]] = []
    engine.run(lambda e: seen.append((engine.now, e)), until=10.0)
    assert [e for _, e in seen] == ["world-1", "world-2", "agent", "scheduler", "check", "late"]
    assert [t for t, _ in seen] == [1.0, 1.0, 1.0, 1.0, 1.0, 5.0]
    assert engine.now == 10.0
    assert engine.processed == 6


def test_events_scheduled_by_the_handler_run_when_due_and_later_ones_wait() -> None:
    engine: Engine[int] = Engine()
    seen: list[int] = []

    def handle(n: int) -> None:
        seen.append(n)
        if n < 5:
            engine.after(1.0, n + 1)

    engine.at(0.0, 0)
    engine.run(handle, until=3.0)
    assert seen == [0, 1, 2, 3]
    assert len(engine) == 1 and engine.peek_time() == 4.0
    engine.run(handle, until=100.0)
    assert seen == [0, 1, 2, 3, 4, 5]


def test_cancel_skips_an_event_and_is_idempotent() -> None:
    engine: Engine[str] = Engine()
    keep = engine.at(1.0, "keep")
    drop = engine.at(1.0, "drop")
    engine.cancel(drop)
    engine.cancel(drop)
    engine.cancel(12345)  # unknown handle: ignored
    assert len(engine) == 1
    seen: list[str] = []
    engine.run(seen.append, until=2.0)
    assert seen == ["keep"]
    engine.cancel(keep)  # already processed: ignored
    assert engine.peek_time() is None


@pytest.mark.parametrize(
    ("time", "message"),
    [(-1.0, "before now"), (float("nan"), "non-finite"), (float("inf"), "non-finite")],
    ids=["past", "nan", "inf"],
)
def test_refuses_bad_times(time: float, message: str) -> None:
    engine: Engine[str] = Engine()
    with pytest.raises(EngineError, match=message):
        engine.at(time, "x")
    assert len(engine) == 0


def test_refuses_negative_delay_and_running_backwards() -> None:
    engine: Engine[str] = Engine(start=10.0)
    with pytest.raises(EngineError, match="negative delay"):
        engine.after(-0.5, "x")
    with pytest.raises(EngineError, match="before now"):
        engine.run(lambda e: None, until=5.0)


def test_an_exception_in_a_handler_stops_the_run_and_propagates() -> None:
    engine: Engine[str] = Engine()
    engine.at(1.0, "boom")
    engine.at(2.0, "after")
    seen: list[str] = []

    def handle(event: str) -> None:
        seen.append(event)
        if event == "boom":
            raise RuntimeError("handler failed")

    with pytest.raises(RuntimeError, match="handler failed"):
        engine.run(handle, until=10.0)
    assert seen == ["boom"]
    assert engine.now == 1.0


def test_sim_clock_follows_the_engine() -> None:
    engine: Engine[str] = Engine()
    clock = SimClock(engine, epoch=1000.0)
    assert isinstance(clock, Clock)
    engine.at(7.5, "x")
    engine.run(lambda e: None, until=7.5)
    assert clock.monotonic() == 7.5
    assert clock.time() == 1007.5


@given(st.lists(st.tuples(st.floats(0, 1000, allow_nan=False), st.integers(0, 40)), max_size=60))
def test_processing_order_is_the_sorted_order_of_time_priority_and_sequence(
    items: list[tuple[float, int]],
) -> None:
    engine: Engine[int] = Engine()
    for seq, (time, prio) in enumerate(items):
        engine.at(time, seq, prio)
    seen: list[int] = []
    engine.run(seen.append, until=1000.0)
    expected = [seq for seq, _ in sorted(enumerate(items), key=lambda x: (x[1][0], x[1][1], x[0]))]
    assert seen == expected
