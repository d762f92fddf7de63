"""spotgpu.util.priority on real threads: SCHED_RR for the calling thread only (threads it
starts inherit it), the nice -10 fallback when the kernel refuses, a warning once per thread
name, and never an exception."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import pytest

from spotgpu.util import priority
from spotgpu.util.priority import raise_thread, thread_policy


def _on_thread(fn: Callable[[], object]) -> object:
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join(10)
    return out[0]


@pytest.mark.root
def test_the_calling_thread_alone_is_raised_and_its_children_inherit() -> None:
    def raised_then_child() -> tuple[priority.Priority, str, str]:
        got = raise_thread()
        child = _on_thread(lambda: thread_policy(threading.get_native_id()))
        return got, thread_policy(threading.get_native_id()), str(child)

    got, mine, child = _on_thread(raised_then_child)  # type: ignore[misc]
    assert got.policy == mine == child == "SCHED_RR 10" and got.raised and got.refused == ()
    assert thread_policy(threading.get_native_id()) == "normal"


def test_a_refused_sched_rr_falls_back_to_nice_and_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*_args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(os, "setpriority", lambda which, who, value: calls.append((which, who, value)))
    caplog.set_level(logging.DEBUG, logger="spotgpu.util.priority")
    first = _on_thread(lambda: raise_thread(name="refused-thread"))
    second = _on_thread(lambda: raise_thread(name="refused-thread"))
    assert isinstance(first, priority.Priority) and isinstance(second, priority.Priority)
    assert first.policy == "nice -10" and "SCHED_RR 10" in first.refused[0]
    assert [c[2] for c in calls] == [-10, -10] and calls[0][1] == first.tid
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "refused-thread" in r.getMessage()]
    assert len(warnings) == 1 and "CAP_SYS_NICE" in warnings[0].getMessage()


def test_both_refused_leaves_the_thread_normal(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    monkeypatch.setattr(os, "setpriority", refuse)
    got = _on_thread(lambda: raise_thread(name="both-refused"))
    assert isinstance(got, priority.Priority) and got.policy == "normal" and not got.raised and len(got.refused) == 2
