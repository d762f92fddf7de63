"""spotgpu.adapters.pidpins on real processes (children of the test, so not namespace inits)
with a scripted lookup in place of containerd: a pin names exactly the process the lookup
named twice, stale pins are dropped and pinned again, pins of containers no longer named are
closed, copies are independent of the table, and a process whose pidfd cannot prove a whole
container gone is never reported verified."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence

import pytest

from spotgpu.adapters import pidpins
from spotgpu.adapters.pidpins import PinTable


class Lookup:
    """Container ID -> PID answers, one list per container consumed call by call (the last
    answer repeats)."""

    def __init__(self, answers: Mapping[str, list[int | None]]) -> None:
        self.answers = {k: list(v) for k, v in answers.items()}
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, container_ids: Sequence[str]) -> dict[str, int | None]:
        self.calls.append(tuple(container_ids))
        result: dict[str, int | None] = {}
        for cid in container_ids:
            queue = self.answers.get(cid, [None])
            result[cid] = queue.pop(0) if len(queue) > 1 else queue[0]
        return result


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen(["sleep", "1000"]) for _ in range(3)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_a_pin_names_the_process_the_lookup_named_twice(sleepers: list[subprocess.Popen[bytes]]) -> None:
    a, b, c = sleepers
    lookup = Lookup({"a": [a.pid], "b": [b.pid, c.pid], "gone": [None]})
    table = PinTable(lookup, retry_interval=0.0)
    try:
        table.refresh(["a", "b", "gone"])
        assert table.pinned() == {"a": a.pid}  # b changed between the two looks: not trusted
        assert lookup.calls == [("a", "b", "gone"), ("a", "b")]
        table.refresh(["a", "b"])  # b is tried again (it now answers c both times)
        assert table.pinned() == {"a": a.pid, "b": c.pid}
    finally:
        table.close()


def test_stale_pins_are_dropped_and_pinned_again_and_unnamed_ones_closed(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    a, b, c = sleepers
    lookup = Lookup({"a": [a.pid, a.pid, b.pid], "c": [c.pid]})
    table = PinTable(lookup, retry_interval=0.0, keep=0.0)
    try:
        table.refresh(["a", "c"])
        assert table.pinned() == {"a": a.pid, "c": c.pid}
        a.kill()
        a.wait()  # "a" restarted: its init is gone (and reaped), a new one runs
        assert set(table.take(["a", "c"])) == {"c"}  # never a stale pin
        table.refresh(["a"])  # "c" is no longer named
        assert table.pinned() == {"a": b.pid}
    finally:
        table.close()
    assert table.pinned() == {}


def test_a_container_named_once_stays_pinned_for_keep_seconds(sleepers: list[subprocess.Popen[bytes]]) -> None:
    """The pod watch names a spot container the moment it started; the next detection cycle's
    refresh (whose view may not list it yet) does not drop it."""
    a, b, _ = sleepers
    table = PinTable(Lookup({"a": [a.pid], "b": [b.pid]}), keep=30.0)
    try:
        table.refresh(["a"])
        table.refresh(["b"])
        assert table.pinned() == {"a": a.pid, "b": b.pid}
        table.keep = 0.0
        table.refresh(["b"])
        assert table.pinned() == {"b": b.pid}
    finally:
        table.close()


def test_taken_copies_outlive_the_tables_fds(sleepers: list[subprocess.Popen[bytes]]) -> None:
    a = sleepers[0]
    table = PinTable(Lookup({"a": [a.pid]}))
    table.refresh(["a"])
    [copy] = table.take(["a"]).values()
    table.close()  # the copy's fds are its own
    try:
        pidpins.signal_pinned([copy])
        assert a.wait(10) == -9
        assert pidpins.exited_fds([copy.fd]) == {copy.fd}
    finally:
        copy.close()


def test_a_process_that_is_not_its_namespaces_init_is_never_verified_by_its_pidfd(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    """The test's children share the test's PID namespace and cgroup: no pidfd can prove such a
    "container" gone (its cgroup is ours: never read for members), so the caller's containerd
    fallback has to verify it."""
    a = sleepers[0]
    table = PinTable(Lookup({"a": [a.pid]}))
    try:
        table.refresh(["a"])
        [pin] = table.take(["a"]).values()
        assert not pin.namespace_init and pin.procs is None and not pin.verifiable
        pidpins.signal_pinned([pin])
        assert pidpins.wait_pinned([pin], time.monotonic() + 5) == set()
        pin.close()
    finally:
        table.close()
    assert a.wait(10) == -9


def test_the_agents_own_cgroup_is_never_a_containers(sleepers: list[subprocess.Popen[bytes]]) -> None:
    assert pidpins.procs_file(sleepers[0].pid) is None
    assert pidpins.procs_file(os.getpid()) is None
