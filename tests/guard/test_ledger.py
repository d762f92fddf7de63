"""The fd holder's ledger: encoding (property-tested), robust reading of damaged files, atomic
writes, and telling a running process from a gone one or a reused PID (real /proc)."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core.refs import ContainerRef
from spotgpu.guard import ledger
from spotgpu.guard.ledger import Ledger, LedgerEntry, LedgerError
from spotgpu.guard.listener import NotifyFdInfo

names = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12).filter(
    lambda s: s[0].isalnum() and s[-1].isalnum()
)
infos = st.builds(
    NotifyFdInfo,
    key=st.text("0123456789abcdef", min_size=1, max_size=32),
    container_id=st.text(min_size=1, max_size=64),
    pid=st.integers(1, 2**22),
    init_pid=st.integers(1, 2**22),
    exec=st.booleans(),
    owner=st.none() | st.builds(ContainerRef, names, names, names),
)
entries = st.builds(LedgerEntry, infos, st.integers(0, 2**40))
ledgers = st.builds(Ledger, st.integers(0, 2**22), st.tuples(*[entries] * 2), st.lists(entries, max_size=3).map(tuple))


@given(ledgers)
def test_round_trip(book: Ledger) -> None:
    assert ledger.decode(ledger.encode(book)) == book


@given(st.binary(max_size=400))
def test_garbage_is_a_ledger_error(data: bytes) -> None:
    with contextlib.suppress(LedgerError):
        ledger.decode(data)


def test_bad_entries_are_refused() -> None:
    good = LedgerEntry(NotifyFdInfo("k", "c", 1, 1, False, None), 5).to_wire()
    for field, value in (("start_time", -1), ("start_time", True), ("pid", 0), ("owner", "not a ref")):
        with contextlib.suppress(LedgerError):
            LedgerEntry.from_wire({**good, field: value})
            raise AssertionError(f"{field}={value!r} was accepted")
    assert ledger.decode(b'{"version":1,"holder_pid":3}') == Ledger(3)


def test_read_write(tmp_path: Path) -> None:
    path = ledger.path_for(tmp_path / "fd-holder.sock")
    assert path == tmp_path / "fd-holder.ledger"
    assert ledger.read(path) is None
    book = Ledger(7, (LedgerEntry(NotifyFdInfo("k", "c", 1, 1, False, ContainerRef("a", "b", "c")), 9),))
    ledger.write(path, book)
    assert ledger.read(path) == book
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    path.write_bytes(b"{not json")
    assert ledger.read(path) is None  # damaged: ignored, never fatal


def test_running_processes_and_reused_pids() -> None:
    me = ledger.process_start_time(os.getpid())
    assert me is not None and me > 0
    info = NotifyFdInfo("k", "c", os.getpid(), os.getpid(), False, None)
    assert ledger.is_running(LedgerEntry(info, me))
    assert ledger.is_running(LedgerEntry(info, 0))  # start time unknown: the PID decides
    assert not ledger.is_running(LedgerEntry(info, me + 1))  # same PID, another process
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    gone = NotifyFdInfo("g", "c", child.pid, child.pid, False, None)
    assert ledger.process_start_time(child.pid) is None
    assert not ledger.is_running(LedgerEntry(gone, 1))
    recorded = [LedgerEntry(info, me), LedgerEntry(gone, 1), LedgerEntry(NotifyFdInfo("h", "c", 1, 1, False, None), 0)]
    assert set(ledger.unreturned(recorded, {"h"}, ledger.is_running)) == {"k"}
