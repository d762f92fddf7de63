"""The return guard end to end with real runc (root): owner containers run the stand-in GPU
client (a static C program issuing NVIDIA-encoded ioctls on /dev/null-numbered stand-in
devices, since this machine has no GPU); the fd holder and, where a test kills it, the guard run
as separate processes. ENOTTY from a call means it reached the "driver"; ENOSYS would mean a
notify fd without a listener, which the guard must never allow."""

from __future__ import annotations

import errno
import threading
import time

import pytest

from spotgpu.core.refs import ContainerRef
from spotgpu.guard import service as guard_service
from spotgpu.testing import standin
from spotgpu.util.cpuboost import Knob, cpu_knobs
from spotgpu.util.priority import thread_policy

from .conftest import OWNER, Node, OwnerBacks

pytestmark = pytest.mark.root

SESSION = standin.CHECK_VERSION_STR


def test_unarmed_owner_calls_pass_at_once(node: Node) -> None:
    _guard, owner = node.guarded_owner("unarmed")
    result = owner.call(SESSION)
    assert result["errno"] == errno.ENOTTY
    seq = owner.command(f"seq {standin.sequence_arg(standin.TORCH_SESSION)}")
    assert seq["calls"] == len(standin.TORCH_SESSION) and seq["enotty"] == seq["calls"]


def test_armed_owner_call_is_held_until_eviction_completes(node: Node) -> None:
    backs = OwnerBacks()
    guard, owner = node.guarded_owner("armed", backs)
    assert guard.covers(OWNER) and not guard.covers(OWNER.pod_ref.container("other"))
    guard.arm(OWNER)
    owner.send(f"call {standin.CTL} {SESSION:#x}")
    assert backs.wait(1, 5), "owner-back was not signalled"
    assert backs.items[0][0] == OWNER
    time.sleep(0.3)  # the "eviction"
    released_at = time.monotonic_ns()
    guard.disarm(OWNER)
    result = owner.read(5)
    assert result["errno"] == errno.ENOTTY
    assert result["end_ns"] >= released_at
    assert result["end_ns"] - result["start_ns"] >= 300e6


def test_a_realtime_guard_receives_the_call_and_runs_the_handler_at_sched_rr(node: Node) -> None:
    """``agent.eviction.realtime``: the loop thread that receives the held call raises itself
    to SCHED_RR 10, and the thread it starts for the agent's handler inherits that."""
    policies: list[str] = []
    backs = OwnerBacks()

    def handler(owner: ContainerRef) -> None:
        policies.append(thread_policy(threading.get_native_id()))
        backs(owner)

    guard, owner = node.guarded_owner("realtime", handler, realtime=True)
    assert guard.priority is not None and guard.priority.policy == "SCHED_RR 10"
    guard.arm(OWNER)
    owner.send(f"call {standin.CTL} {SESSION:#x}")
    assert backs.wait(1, 5), "owner-back was not signalled"
    guard.disarm(OWNER)
    assert owner.read(5)["errno"] == errno.ENOTTY
    assert policies == ["SCHED_RR 10"]


def test_fail_open_releases_a_call_after_the_timeout_with_a_metric(node: Node) -> None:
    backs = OwnerBacks()
    guard, owner = node.guarded_owner("failopen", backs, fail_open=0.5)
    guard.arm(OWNER)
    result = owner.call(SESSION, timeout=5)  # nobody disarms
    assert result["errno"] == errno.ENOTTY
    held_ms = (result["end_ns"] - result["start_ns"]) / 1e6
    assert 450 <= held_ms < 2500, held_ms
    assert guard.metrics.fail_open._value.get() == 1
    # The arming failed open: the owner's next session is not held again for another timeout.
    again = owner.call(SESSION, timeout=5)
    assert (again["end_ns"] - again["start_ns"]) / 1e6 < 200
    assert guard.is_armed(OWNER) and guard.state(OWNER).value == "failed-open"
    assert len(backs.items) == 1


def test_runc_exec_into_an_armed_owner_is_held_too(node: Node) -> None:
    backs = OwnerBacks()
    guard, owner = node.guarded_owner("execd", backs)
    guard.arm(OWNER)
    proc = owner.exec("/bin/guardprobe", "call", standin.CTL, f"{SESSION:#x}")
    assert guard.wait_until(lambda g: len(g.fds()) == 2, 10), "runc exec sent no second notify fd"
    assert [f.exec for f in sorted(guard.fds(), key=lambda f: f.exec)] == [False, True]
    assert backs.wait(1, 10)
    time.sleep(0.2)
    assert proc.poll() is None, "the exec'd session start was not held"
    guard.disarm(OWNER)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert f'"errno":{errno.ENOTTY}' in out.decode()
    # The exec'd process exited: its fd polls POLLHUP and is closed, the init's stays.
    assert guard.wait_until(lambda g: len(g.fds()) == 1, 10)


def test_other_containers_and_disarmed_owners_are_never_held(node: Node) -> None:
    from .conftest import OTHER

    node.holder()
    guard = node.guard()
    owner = node.container("owner")
    other = node.container("other", owner=OTHER)
    assert guard.wait_until(lambda g: len(g.fds()) == 2, 10)
    guard.arm(OTHER)
    result = owner.call(SESSION)
    assert (result["end_ns"] - result["start_ns"]) / 1e6 < 200
    guard.disarm(OTHER)
    assert other.call(SESSION)["errno"] == errno.ENOTTY
    assert guard.metrics.notifications.labels("continue")._value.get() == 2
    assert guard.metrics.notifications.labels("hold")._value.get() == 0


def test_steady_state_gpu_work_never_reaches_the_guard(node: Node) -> None:
    guard, owner = node.guarded_owner("steady")
    guard.arm(OWNER)  # armed: any notification would hold the call
    for call in standin.STEADY_STATE:
        result = owner.command(f"loop {call.device} {call.request:#x} 2000")
        assert result["unexpected_errors"] == 0
    assert guard.metrics.notifications.labels("hold")._value.get() == 0
    assert guard.metrics.notifications.labels("continue")._value.get() == 0


def test_container_exit_closes_its_fds_in_guard_and_holder(node: Node) -> None:
    guard, owner = node.guarded_owner("exits")
    owner.send("exit")
    assert guard.wait_until(lambda g: not g.fds(), 10)


def test_a_clean_guard_stop_releases_held_calls_and_hands_over_to_the_holder(node: Node) -> None:
    backs = OwnerBacks()
    guard, owner = node.guarded_owner("stop", backs)
    guard.arm(OWNER)
    owner.send(f"call {standin.CTL} {SESSION:#x}")
    assert backs.wait(1, 5)
    guard.stop()
    result = owner.read(5)
    assert result["errno"] == errno.ENOTTY
    assert guard.metrics.releases.labels("stopped")._value.get() == 1
    again = owner.call(SESSION)  # the holder answers now
    assert again["errno"] == errno.ENOTTY and (again["end_ns"] - again["start_ns"]) / 1e6 < 200


def test_a_released_owner_threads_cgroups_get_the_top_cpu_weight_for_a_moment(node: Node) -> None:
    """``agent.eviction.boostCpu``: the held thread must run to return from its call; its
    cgroup (and ancestors) get the top CPU weight from the release for ``RELEASE_BOOST_S``,
    then their values back."""
    backs = OwnerBacks()
    guard, owner = node.guarded_owner("boosted", backs, boost_cpu=True)
    guard.arm(OWNER)
    owner.send(f"call {standin.CTL} {SESSION:#x}")
    assert backs.wait(1, 5), "owner-back was not signalled"
    knobs: tuple[Knob, ...] = ()
    deadline = time.monotonic() + 5
    while not knobs and time.monotonic() < deadline:
        with guard._lock:
            knobs = next(iter(guard._hold_knobs.values()), ())
        time.sleep(0.01)
    weights = [k for k in knobs if k.file.name in ("cpu.shares", "cpu.weight")]
    assert weights, "the held thread's cgroup knobs were not found"
    assert weights == [k for k in cpu_knobs(owner.init_pid()) if k in weights]
    before = [k.file.read_text().strip() for k in weights]
    guard.disarm(OWNER)
    during = [k.file.read_text().strip() for k in weights]
    assert owner.read(5)["errno"] == errno.ENOTTY
    assert during == [k.value for k in weights]
    time.sleep(guard_service.RELEASE_BOOST_S + 0.2)
    assert [k.file.read_text().strip() for k in weights] == before
