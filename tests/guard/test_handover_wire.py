"""The holder-to-holder handover below the container level: real unix sockets, real fd passing,
real holder objects and real predecessor processes (no root needed, no runc).

Two ``FdHolder`` objects in this process stand for an old and a new holder (the notify fds
themselves are covered with real runc in test_handover.py); scripted predecessors in child
processes die, refuse or stall at chosen steps of the protocol."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.guard import handover, protocol
from spotgpu.guard.holder import FdHolder
from spotgpu.guard.ledger import LedgerEntry
from spotgpu.guard.listener import NotifyFdInfo
from spotgpu.guard.protocol import Op, ProtocolError
from spotgpu.guard.rule import listener_ready
from spotgpu.guard.succession import ExitReason, Role
from spotgpu.guard.support import GuardSupport

SUPPORTED = GuardSupport(True, "6.1.0", "runc", "1.1.5", "2.5.4")


def _entry(key: str, pid: int = 1) -> LedgerEntry:
    return LedgerEntry(NotifyFdInfo(key, f"cid-{key}", pid, pid, False, None), 0)


@given(st.integers(0, 450), st.integers(1, 120))
def test_lost_lists_survive_chunking(count: int, chunk: int) -> None:
    entries = [_entry(f"k{i}") for i in range(count)]
    got: list[LedgerEntry] = []
    messages = handover.lost_messages(entries, chunk)
    assert len(messages) == max(1, -(-count // chunk))
    for data in messages:
        first, part = handover.parse_lost(protocol.decode(data))
        got = part if first else got + part
    assert got == entries


def test_fd_carrying_ops_are_checked() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    try:
        for op in (Op.SOCKET, Op.GUARD):
            protocol.send(a, protocol.encode(op))
            with pytest.raises(ProtocolError, match="missing fd"):
                protocol.receive(b)
        protocol.send(a, protocol.encode(Op.HANDED), r)
        with pytest.raises(ProtocolError, match="unexpected fd"):
            protocol.receive(b)
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


# --- two real holders in this process ----------------------------------------------------


class Running:
    """An FdHolder serving on a thread; ``close()`` stops it like a process exit would."""

    def __init__(self, base: Path, name: str, **kwargs: object) -> None:
        self.holder = FdHolder(
            base / "l.sock", base / "c.sock", SUPPORTED, guard_timeout=1.0, ready_file=base / f"{name}.ready", **kwargs
        )  # type: ignore[arg-type]
        self.holder.start()
        self.thread = threading.Thread(target=self.holder.serve, daemon=True)
        self.thread.start()

    def exited(self, timeout: float = 5.0) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def close(self) -> None:
        if self.thread.is_alive():
            self.holder.stop()
            self.thread.join(5)
        self.holder.close()


@pytest.fixture
def base(tmp_path: Path) -> Path:
    assert len(str(tmp_path / "c.sock")) < 108, "unix socket paths are limited to 108 bytes"
    return tmp_path


def _attach(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(str(path))
    sock.settimeout(5)
    protocol.send(sock, protocol.encode(Op.ATTACH, version=2, have=[]))
    while True:
        got = protocol.receive(sock)
        assert got is not None
        if got[0].op is Op.SYNCED:
            return sock


@pytest.fixture
def holders(base: Path) -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for running in started:
        running.close()


def _wait(predicate: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_new_holder_takes_the_very_same_sockets_and_the_old_one_stands_by(base: Path, holders: list[Running]) -> None:
    old = Running(base, "old")
    holders.append(old)
    inodes = {p: (base / p).stat().st_ino for p in ("l.sock", "c.sock")}
    guard = _attach(base / "c.sock")
    assert _wait(lambda: old.holder.guard_attached)
    new = Running(base, "new")
    holders.append(new)
    assert old.holder.role is Role.STANDBY and new.holder.role is Role.PRIMARY
    assert new.holder.guard_attached  # the guard's own connection moved, unaware
    assert {p: (base / p).stat().st_ino for p in ("l.sock", "c.sock")} == inodes  # nothing rebound
    assert listener_ready(str(base / "l.sock"))
    protocol.send(guard, protocol.encode(Op.HOLD, key="k", id=1))  # read by the new holder now
    assert (base / "new.ready").exists() and (base / "old.ready").exists()

    old.holder.request_exit()
    assert old.exited() and old.holder.exit_reason is ExitReason.SUCCESSOR_HOLDS
    old.holder.close()
    assert (base / "c.sock").exists() and not (base / "old.ready").exists()  # the successor's sockets stay
    assert _wait(lambda: listener_ready(str(base / "l.sock")))
    guard.close()
    assert _wait(lambda: not new.holder.guard_attached)
    new.holder.request_exit()
    assert new.exited() and new.holder.exit_reason is ExitReason.NOTHING_HELD
    new.holder.close()
    assert not (base / "c.sock").exists() and not (base / "l.sock").exists()  # the last one cleans up


def test_the_standby_resumes_on_the_same_sockets_when_its_successor_dies(base: Path, holders: list[Running]) -> None:
    old = Running(base, "old")
    new = Running(base, "new")
    holders += [old, new]
    assert old.holder.role is Role.STANDBY
    new.close()  # a crash: its copies close, nothing is unlinked
    assert _wait(lambda: old.holder.role is Role.PRIMARY)
    guard = _attach(base / "c.sock")  # the resumed holder accepts on the inherited socket
    assert _wait(lambda: old.holder.guard_attached)
    guard.close()
    third = Running(base, "third")
    holders.append(third)
    assert old.holder.role is Role.STANDBY and third.holder.role is Role.PRIMARY


def test_a_newer_successor_retires_the_old_standby(base: Path, holders: list[Running]) -> None:
    first = Running(base, "first")
    second = Running(base, "second")
    holders += [first, second]
    third = Running(base, "third")
    holders.append(third)
    assert second.holder.role is Role.STANDBY and third.holder.role is Role.PRIMARY
    assert _wait(lambda: first.holder.role is Role.RETIRED)
    first.holder.request_exit()
    assert first.exited() and first.holder.exit_reason is ExitReason.SUCCESSOR_HOLDS


def test_no_inherit_starts_beside_a_running_holder(base: Path, holders: list[Running]) -> None:
    old = Running(base, "old")
    holders.append(old)
    inode = (base / "c.sock").stat().st_ino
    new = Running(base, "new", inherit=False)
    holders.append(new)
    assert old.holder.role is Role.PRIMARY and new.holder.role is Role.PRIMARY
    assert (base / "c.sock").stat().st_ino != inode  # bound anew over the old one's path


# --- scripted predecessors in child processes --------------------------------------------

PREDECESSOR = textwrap.dedent(
    """
    import os, socket, sys, time
    from spotgpu.guard import protocol
    from spotgpu.guard.ledger import LedgerEntry
    from spotgpu.guard.listener import NotifyFdInfo
    from spotgpu.guard.protocol import Op
    path, mode = sys.argv[1], sys.argv[2]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    server.listen(1)
    print("ready", flush=True)
    conn, _ = server.accept()
    assert protocol.receive(conn)[0].op is Op.HANDOVER
    if mode == "refuse":
        protocol.send(conn, protocol.encode(Op.DETACH, reason="not today", retry=False))
        time.sleep(5)
        sys.exit(0)
    protocol.send(conn, protocol.encode(Op.TAKEOVER, version=2, holder_pid=os.getpid(), sockets=0, fds=1,
                                        guards=0, guard=False, quiet_s=0))
    r, w = os.pipe()
    entry = LedgerEntry(NotifyFdInfo("k1", "c1", 1, 1, False, None), 0)
    protocol.send(conn, protocol.encode(Op.FD, fd=entry.to_wire()), r)
    if mode == "die":
        os._exit(0)
    conn.close()  # "close": gives up without a word, but lives on
    time.sleep(5)
    """
)


@contextlib.contextmanager
def _predecessor(path: Path, mode: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", PREDECESSOR, str(path), mode], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_pull_keeps_what_a_predecessor_that_died_part_way_sent(base: Path) -> None:
    with _predecessor(base / "c.sock", "die"):
        got = handover.pull(base / "c.sock", 5)
        assert got is not None and not got.complete and got.link is None
        assert [entry.key for _fd, entry in got.fds] == ["k1"]
        assert stat.S_ISFIFO(os.fstat(got.fds[0][0]).st_mode)  # the predecessor's pipe, passed along
        got.close()


def test_pull_drops_everything_from_a_predecessor_that_lives_on(base: Path) -> None:
    with _predecessor(base / "c.sock", "close"):
        before = len(os.listdir("/proc/self/fd"))
        assert handover.pull(base / "c.sock", 5) is None  # it still has its copies: start alone
        assert len(os.listdir("/proc/self/fd")) == before  # and no received fd leaked


def test_pull_respects_a_refusal(base: Path) -> None:
    with _predecessor(base / "c.sock", "refuse"):
        started = time.monotonic()
        assert handover.pull(base / "c.sock", 5) is None
        assert time.monotonic() - started < 2


def test_pull_without_a_predecessor(base: Path) -> None:
    assert handover.pull(base / "c.sock", 5) is None  # nothing there
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stale.bind(str(base / "c.sock"))
    stale.close()  # a SIGKILLed holder leaves its socket file behind
    assert handover.pull(base / "c.sock", 5) is None


def test_cli_settings_reach_the_holder_config(tmp_path: Path) -> None:
    import argparse

    from spotgpu.cli import guard_holder

    parser = argparse.ArgumentParser()
    guard_holder.add_arguments(parser)
    args = parser.parse_args(["--control", str(tmp_path / "c.sock"), "--handover-timeout", "7.5", "--no-inherit"])
    config = guard_holder._config(args)
    assert config.handover_timeout == 7.5 and config.holder_path == tmp_path / "c.sock" and args.no_inherit
    (tmp_path / "agent.yaml").write_text("agent:\n  guard:\n    handoverTimeout: 2m\n")
    args = parser.parse_args(["--config", str(tmp_path / "agent.yaml")])
    assert guard_holder._config(args).handover_timeout == 120.0
