"""GuardService and FdHolder behaviour beyond the happy path: no support, disabled, a second
guard taking over, a misbehaving control client."""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from spotgpu.core.clock import ManualClock
from spotgpu.core.config import GuardConfig
from spotgpu.guard import protocol
from spotgpu.guard.holder import FdHolder
from spotgpu.guard.listener import NotifyFdInfo
from spotgpu.guard.protocol import Op
from spotgpu.guard.service import GuardService
from spotgpu.guard.support import GuardSupport
from spotgpu.testing import standin

from .conftest import OWNER, Node

UNSUPPORTED = GuardSupport(False, "5.4.0", "runc", "1.0.3", "2.5.1", ("runc 1.0.3 is older than 1.1",))
SUPPORTED = GuardSupport(True, "6.1.0", "runc", "1.1.5", "2.5.4")


def test_without_support_the_guard_reports_unavailable_and_stays_inert(tmp_path: Path) -> None:
    calls: list[object] = []
    guard = GuardService(GuardConfig(holder_path=tmp_path / "h.sock"), calls.append, registry=CollectorRegistry(),
                         support=UNSUPPORTED)  # fmt: skip
    guard.start()
    assert not guard.available and guard.metrics.available._value.get() == 0
    guard.arm(OWNER)
    assert guard.is_armed(OWNER)
    guard.disarm(OWNER)
    guard.stop()
    disabled = GuardService(GuardConfig(enabled=False), calls.append, registry=CollectorRegistry(), support=SUPPORTED)
    disabled.start()
    assert not disabled.available
    disabled.stop()
    assert calls == []


def test_holder_without_support_opens_no_listener(tmp_path: Path) -> None:
    holder = FdHolder(tmp_path / "l.sock", tmp_path / "c.sock", UNSUPPORTED)
    holder.start()
    try:
        assert not (tmp_path / "l.sock").exists() and (tmp_path / "c.sock").exists()
    finally:
        holder.close()
    assert not (tmp_path / "c.sock").exists()


def test_holder_detaches_a_control_client_that_breaks_the_protocol(tmp_path: Path) -> None:
    holder = FdHolder(tmp_path / "l.sock", tmp_path / "c.sock", SUPPORTED, guard_timeout=5)
    holder.start()
    thread = threading.Thread(target=holder.serve, daemon=True)
    thread.start()
    try:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        client.connect(str(tmp_path / "c.sock"))
        protocol.send(client, protocol.encode(Op.HOLD, key="k", id=1))  # before attach
        client.settimeout(5)
        got = protocol.receive(client)
        assert got is not None and got[0].op is Op.DETACH and "before attach" in got[0].str_field("reason")
        assert protocol.receive(client) is None  # and the connection is closed
        client.close()
        # A well-behaved client still attaches afterwards.
        client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        client.connect(str(tmp_path / "c.sock"))
        client.settimeout(5)
        protocol.send(client, protocol.encode(Op.ATTACH, version=1, have=[]))
        ops = []
        while not ops or ops[-1] is not Op.SYNCED:
            got = protocol.receive(client)
            assert got is not None
            ops.append(got[0].op)
        assert ops == [Op.WELCOME, Op.LOST, Op.SYNCED]
        client.close()
    finally:
        holder.stop()
        thread.join(5)
        holder.close()


@pytest.mark.root
def test_a_second_guard_takes_over_and_the_first_lets_go(node: Node) -> None:
    node.holder()
    first = node.guard()
    owner = node.container("two-guards")
    assert first.wait_until(lambda g: len(g.fds()) == 1, 10)
    second = node.guard()
    assert second.wait_until(lambda g: len(g.fds()) == 1, 10)
    assert first.wait_until(lambda g: g.detaches == 1 and not g.fds(), 10)
    assert first.superseded
    time.sleep(1.0)  # the first one must not come back and take the fds again
    assert second.attached and len(second.fds()) == 1 and not first.fds()
    result = owner.call(standin.CHECK_VERSION_STR)
    assert result["errno"] == errno.ENOTTY
    assert second.metrics.notifications.labels("continue")._value.get() == 1
    assert first.metrics.notifications.labels("continue")._value.get() == 0


def test_holder_times_out_a_silent_control_connection_on_its_injected_clock(tmp_path: Path) -> None:
    clock = ManualClock()
    holder = FdHolder(tmp_path / "l.sock", tmp_path / "c.sock", SUPPORTED, guard_timeout=0.2, clock=clock)
    holder.start()
    thread = threading.Thread(target=holder.serve, daemon=True)
    thread.start()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        client.connect(str(tmp_path / "c.sock"))
        client.settimeout(0.6)  # three real timeouts: the holder's clock has not moved
        with pytest.raises(TimeoutError):
            client.recv(64)
        client.settimeout(0.1)
        for _ in range(50):  # the accept may still be on its way: move the clock until it counts
            clock.advance(1.0)
            holder.loop.poke()
            try:
                got = client.recv(64)
            except TimeoutError:
                continue
            break
        else:
            raise AssertionError("the holder never ended the connection")
        assert got == b""  # "no attach": closed without a word
    finally:
        client.close()
        holder.stop()
        thread.join(5)
        holder.close()


class RecordingGate:
    """A :class:`~spotgpu.guard.gate.ReleaseGate` that records whom it was asked to clear."""

    def __init__(self) -> None:
        self.cleared: list[int] = []

    def clear(self, pid: int) -> str:
        self.cleared.append(pid)
        return "recorded"


def test_the_holder_clears_the_owner_s_gpus_before_releasing_a_lost_guard_s_held_call(tmp_path: Path) -> None:
    """The guard that held the owner's call is gone: the holder asks its gate (the release check)
    about the owner container's process before it continues the call, and only for held calls."""
    gate = RecordingGate()
    holder = FdHolder(tmp_path / "l.sock", tmp_path / "c.sock", UNSUPPORTED, gate=gate)
    holder.start()
    read, write = os.pipe()  # stands in for the owner's notify fd (its CONTINUE fails and is logged)
    try:
        info = NotifyFdInfo(key="k1", container_id="c" * 64, pid=os.getpid(), init_pid=1, exec=False, owner=None)
        assert holder.adopt(read, info, 1, forward=False) is not None
        holder.takeover("no call held")
        assert gate.cleared == []
        holder.link.reported.add(("k1", 7))
        holder.takeover("guard lost while holding a call")
        assert gate.cleared == [os.getpid()]
        assert not holder.link.reported
    finally:
        os.close(write)
        holder.close()
