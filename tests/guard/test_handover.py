"""Holder restarts and upgrades never lose a notify fd (root, real runc, real holder processes).

A rolling upgrade starts a new ``spotgpu guard-holder`` next to the running one; the new one
takes every listening socket, notify fd and guard connection over (SCM_RIGHTS) before the old
one is stopped. These tests run that with owner containers under the rule (one armed, one not)
and then kill whatever a real upgrade or failure would kill. ENOTTY from a call means it reached
the stand-in "driver" (/dev/null's numbers); ENOSYS means the last copy of the container's notify
fd was closed, which only the stated residual risk (holder and guard SIGKILLed together, no
successor) may cause.
"""

from __future__ import annotations

import errno
import socket
import time

import pytest

from spotgpu.guard import protocol
from spotgpu.guard.protocol import Op
from spotgpu.guard.rule import listener_ready
from spotgpu.testing import standin
from spotgpu.testing.guard_testbed import HolderProcess, OwnerContainer

from .conftest import OTHER, OWNER, Node, OwnerBacks
from .harness import QUICK_S, GuardProcess, assert_quick, wait_log

pytestmark = pytest.mark.root

SESSION = standin.CHECK_VERSION_STR


def _armed_and_unarmed(node: Node, name: str) -> tuple[HolderProcess, GuardProcess, OwnerContainer, OwnerContainer]:
    """A holder, a guard process and two owners under the rule: OWNER armed with a session call
    held by the guard, OTHER unarmed."""
    holder = node.holder()
    guard = node.guard_process()
    armed = node.container(f"{name}-armed")
    unarmed = node.container(f"{name}-unarmed", owner=OTHER)
    assert guard.command("wait-fds 2")["ok"]
    guard.command(f"arm {OWNER}")
    armed.send(f"call {standin.CTL} {SESSION:#x}")
    assert guard.out is not None
    guard.out.wait_for("owner-back", 5)
    return holder, guard, armed, unarmed


def _nothing_from(container: OwnerContainer, seconds: float) -> None:
    time.sleep(seconds)
    assert container.out is not None and container.out.queue.empty(), "a held call returned too early"


def test_upgrade_hands_every_fd_and_the_guard_over_before_the_old_holder_exits(node: Node) -> None:
    """The issue's scenario: holder A and a guard; holder B starts and takes over; A gets
    SIGTERM, the guard SIGKILL; the owners' calls never fail and a new guard holds them again."""
    old, guard, armed, unarmed = _armed_and_unarmed(node, "up")

    new = node.holder()  # returns once it has taken over
    assert "took over 2 notify fds and the attached guard" in new.log()
    wait_log(old, "handed 2 fds and the attached guard over")
    assert_quick(unarmed.call(SESSION))  # the guard answers through the connection the new holder inherited
    _nothing_from(armed, 0.2)  # and still holds the armed owner's call

    assert old.terminate(5) == 0  # the old holder leaves at once: its successor has everything
    assert "exiting (successor-holds)" in old.log()
    killed = time.monotonic_ns()
    guard.kill()
    released = armed.read(5)
    assert released["errno"] == errno.ENOTTY, released
    assert (released["end_ns"] - killed) / 1e9 < QUICK_S
    for container in (armed, unarmed, armed, unarmed):
        assert_quick(container.call(SESSION))  # the new holder answers now
    assert "released 1 held calls" in new.log()

    backs = OwnerBacks()
    again = node.guard(backs)
    assert again.wait_until(lambda g: len(g.fds()) == 2, 10)
    again.arm(OWNER)
    armed.send(f"call {standin.CTL} {SESSION:#x}")
    assert backs.wait(1, 5)
    assert_quick(unarmed.call(SESSION))
    _nothing_from(armed, 0.2)
    again.disarm(OWNER)
    assert_quick(armed.read(5), bound_s=10)
    assert new.running()


def test_sigterm_keeps_the_holder_serving_until_a_successor_takes_over(node: Node) -> None:
    old = node.holder()
    first = node.container("wait-1")
    wait_log(old, "holding notify fd of container wait-1")
    old.signal()
    wait_log(old, "asked to stop while holding 1 notify fds")
    time.sleep(0.3)
    assert old.running(), "the holder left while it alone held an owner's notify fd"
    assert_quick(first.call(SESSION))  # it answers as usual meanwhile
    second = node.container("wait-2")  # and still takes new containers
    wait_log(old, "holding notify fd of container wait-2")
    guard = node.guard()  # a guard holding copies is not enough: it may restart too
    assert guard.wait_until(lambda g: len(g.fds()) == 2, 10)
    time.sleep(0.3)
    assert old.running()
    guard.stop()
    new = node.holder()
    assert old.wait(5) == 0
    assert "took over 2 notify fds" in new.log()
    for container in (first, second):
        assert_quick(container.call(SESSION))


def test_without_a_successor_the_holder_leaves_after_the_bound_and_its_guard_keeps_the_fds(node: Node) -> None:
    old, guard, owner = node.process_guarded_owner("bound", handover_timeout=1.0)
    asked = time.monotonic()
    old.signal()
    assert old.wait(5) == 0
    waited = time.monotonic() - asked
    assert 0.9 <= waited < 3.0, waited
    assert "no successor holder within 1s; exiting; the attached guard keeps the only copies" in old.log()
    assert_quick(owner.call(SESSION))  # the guard answers alone
    new = node.holder()  # starts on its own (the old one removed its sockets); the guard re-seeds it
    assert guard.command("wait-attached", timeout=15)["ok"]
    wait_log(new, "holding notify fd of container bound")  # the guard's copy, re-seeded
    guard.kill()
    for _ in range(2):
        assert_quick(owner.call(SESSION))


def test_a_successor_that_dies_leaves_its_predecessor_serving_every_fd(node: Node) -> None:
    old = node.holder()
    before = node.container("resume-1")
    wait_log(old, "holding notify fd of container resume-1")
    new = node.holder()
    after = node.container("resume-2")  # reaches the new holder, which copies it to its standby
    wait_log(new, "holding notify fd of container resume-2")
    wait_log(old, "holding notify fd of container resume-2")
    new.kill()
    wait_log(old, "the successor holder is gone; resuming as primary")
    for container in (before, after, before, after):
        assert_quick(container.call(SESSION))
    third = node.holder()  # and it hands over again
    assert "took over 2 notify fds" in third.log()
    assert old.terminate(5) == 0
    assert_quick(after.call(SESSION))


def test_a_successor_with_a_guard_dies_and_the_guard_comes_back_to_the_predecessor(node: Node) -> None:
    old, guard, owner = node.process_guarded_owner("back")
    new = node.holder()
    assert "and the attached guard" in new.log()
    new.kill()
    wait_log(old, "waiting up to 1s for its guard")
    wait_log(old, "guard attached; it answers calls for", count=2)
    assert "took back" not in old.log()  # it never raced the guard for a notification
    for _ in range(3):
        assert_quick(owner.call(SESSION))
    guard.command(f"arm {OWNER}")
    owner.send(f"call {standin.CTL} {SESSION:#x}")
    assert guard.out is not None
    guard.out.wait_for("owner-back", 5)
    _nothing_from(owner, 0.2)
    guard.command(f"disarm {OWNER}")
    assert owner.read(5)["errno"] == errno.ENOTTY


def test_a_successor_that_never_confirms_takes_nothing(node: Node) -> None:
    """A successor that receives the whole state and then stalls: the predecessor answers all
    along, aborts after its commit timeout and tells the successor to let go."""
    holder = node.holder()
    owner = node.container("stall")
    wait_log(holder, "holding notify fd of container stall")
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stalled.connect(str(node.control))
    stalled.settimeout(10)
    protocol.send(stalled, protocol.encode(Op.HANDOVER, version=protocol.PROTOCOL_VERSION, pid=1))
    ops, fds = [], []
    while not ops or ops[-1] is not Op.HANDED:
        got = protocol.receive(stalled)
        assert got is not None
        ops.append(got[0].op)
        if got[1] is not None:
            fds.append(got[1])
    assert ops == [Op.TAKEOVER, Op.SOCKET, Op.SOCKET, Op.FD, Op.LOST, Op.HANDED]
    assert_quick(owner.call(SESSION))  # not committed: the holder still answers
    # Mid-handover nobody accepts: a container starting now queues in the listener's backlog
    # (the probe and runc's connection succeed), its fd waits there, and its first session
    # call waits until the holder gives up on us and takes the connection.
    assert listener_ready(str(node.listener))
    late = node.container("stall-late")
    late.send(f"call {standin.CTL} {SESSION:#x}")
    got = protocol.receive(stalled)  # ... until it gives up on us
    assert got is not None and got[0].op is Op.DETACH and got[0].body["retry"] is True
    assert "did not confirm" in got[0].str_field("reason")
    stalled.close()
    for fd in fds:
        socket.close(fd)
    assert_quick(late.read(5), bound_s=1.0 + 2.0)  # holderTimeout (1 s) + slack
    assert_quick(owner.call(SESSION))
    assert_quick(late.call(SESSION))
    new = node.holder()  # a well-behaved successor still takes over afterwards
    assert "took over 2 notify fds" in new.log()


def test_sigkill_of_holder_and_guard_together_is_the_residual_risk(node: Node) -> None:
    """Both copies of every fd die at once, with no successor: the owners' caught calls fail
    with ENOSYS at once (never hang) until the containers restart. The next holder reports
    them from its ledger, the guard exposes them, and new processes are guarded again."""
    holder, guard, armed, unarmed = _armed_and_unarmed(node, "lost")
    time.sleep(0.1)
    killed = time.monotonic_ns()
    holder.kill()
    guard.kill()
    pending = armed.read(5)
    assert pending["errno"] == errno.ENOSYS, pending  # not a hang: the kernel fails it at once
    assert (pending["end_ns"] - killed) / 1e9 < QUICK_S
    for container in (armed, unarmed):
        result = container.call(SESSION)
        assert result["errno"] == errno.ENOSYS, result
    ordinary = unarmed.call(standin.RM_CONTROL)  # the rule only catches session starts
    assert ordinary["errno"] == errno.ENOTTY, ordinary

    new = node.holder()
    fresh = node.guard()
    assert fresh.wait_until(lambda g: len(g.lost()) == 2, 10), new.log()
    assert {info.owner for info in fresh.lost()} == {OWNER, OTHER}
    assert fresh.metrics.lost_fds._value.get() == 2
    assert not fresh.covers(OWNER) and "was LOST" in new.log()
    # A process exec'd into a broken container gets a new filter and a new fd: guarded again.
    proc = unarmed.exec("/bin/guardprobe", "call", standin.CTL, f"{SESSION:#x}")
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and f'"errno":{errno.ENOTTY}' in out.decode(), err
    assert fresh.metrics.notifications.labels("continue")._value.get() == 1
    assert_quick(node.container("after", owner=OWNER).call(SESSION))
    # Once a broken container is gone, it no longer counts.
    armed.send("exit")
    assert fresh.wait_until(lambda g: len(g.lost()) == 1, 10)
    assert fresh.lost()[0].owner == OTHER
