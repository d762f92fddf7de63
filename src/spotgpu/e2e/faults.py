"""The faults of ``spotgpu node-e2e --faults``: crashes and restarts around a loan and a return.

Decides nothing about lending; decides how each fault is struck and what counts as surviving
it. Side effects: SIGKILL of the agent process, a kubelet-double restart (every plugin socket
deleted), containerd's daemon SIGKILLed and started again, an injected API-server failure;
everything else through :class:`~spotgpu.e2e.run.Run`.

After every fault the same things must hold: the owner's GPU call never fails (no ENOSYS) and
never waits beyond the fail-open bound; once the node has recovered no spot container has a GPU
open or a running task, every spot pod is gone, and the agent's MappingCache equals what the
node says. Each fault also checks what is particular to it (below). Each returns a
:class:`~spotgpu.e2e.run.FaultOutcome` whose ``line()`` is printed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from spotgpu.core.ids import SPOT_GPU_RESOURCE
from spotgpu.core.refs import ContainerRef
from spotgpu.e2e.model import SPOT_NAMESPACE, gpu_fds, gpu_path
from spotgpu.e2e.node import OWNER, Spot
from spotgpu.e2e.run import Background, FaultOutcome, Release, Run

RECOVERY_TIMEOUT: Final = 30.0
"""Longest wait for the node to reach a clean state after a fault."""


class Checks:
    """Collects failed checks and notes for one fault."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.notes: list[str] = []

    def expect(self, ok: bool, failure: str) -> bool:
        if not ok:
            self.failed.append(failure)
        return ok

    def outcome(self, name: str, hold_ms: float | None = None) -> FaultOutcome:
        detail = "; ".join(self.notes)
        if self.failed:
            detail = "; ".join(self.failed) + (f" | {detail}" if detail else "")
        return FaultOutcome(name, not self.failed, detail, hold_ms)


def owner_ok(run: Run, release: Release, checks: Checks) -> None:
    error = run.owner_error(release)
    checks.expect(error is None, f"owner error: {error}")
    verdict = "ENOTTY" if error is None else "badly"
    checks.notes.append(f"owner's call returned {verdict} after {release.hold_ms:.1f} ms")


def owner_returns(run: Run, spots: list[Spot], checks: Checks) -> tuple[Release, float]:
    """The owner starts a GPU session and must get a clean GPU: no error, no spot process on the
    GPUs, twins Unhealthy; then it uses its GPUs. Returns the release and when it was seen."""
    release = run.owner_session()
    seen = time.monotonic()
    owner_ok(run, release, checks)
    leaked, problems = run.release_checks(spots, release)
    checks.expect(not leaked, f"spot work on the GPUs at release: {list(leaked.values())}")
    checks.failed += problems
    run.owner_hold()
    return release, seen


def recovered(run: Run, spots: list[Spot], checks: Checks, *, since: float) -> None:
    """The common end state: no spot work on the GPUs, spot pods gone, cache equals node."""
    deadline = since + RECOVERY_TIMEOUT

    def clean() -> bool:
        gone = all(run.node.api.get("", "pods", s.ref.name, s.ref.namespace or "") is None for s in spots)
        return gone and not run.gpu_holders(spots) and all(run.node.init_pid(s.cid) is None for s in spots)

    while not clean() and time.monotonic() < deadline:
        time.sleep(0.05)
    holders = run.gpu_holders(spots)
    running = [s.ref.format() for s in spots if run.node.init_pid(s.cid) is not None]
    pods = [s.ref.format() for s in spots if run.node.api.get("", "pods", s.ref.name, s.ref.namespace or "")]
    checks.expect(not holders, f"spot work still on the owner's GPUs: {list(holders.values())}")
    checks.expect(not running, f"spot tasks still running: {running}")
    checks.expect(not pods, f"spot pods not deleted: {pods}")
    if not (holders or running or pods):
        checks.notes.append(f"node clean {time.monotonic() - since:.1f} s after the fault")
    _, problems = run.settle(spots, None)
    checks.failed += problems
    mismatch = run.cache_matches([], timeout=max(1.0, deadline - time.monotonic()))
    checks.expect(mismatch is None, mismatch or "")
    if mismatch is None:
        checks.notes.append("MappingCache == node")


def _state_owner(run: Run) -> str | None:
    state = run.node.agent_state()
    return None if state is None else state.get("owners", {}).get(OWNER.format())


def _guard_ready(run: Run) -> bool:
    state = run.node.agent_state() or {}
    guard = state.get("guard") or {}
    return OWNER.format() in guard.get("armed", []) and OWNER.format() in guard.get("covers", [])


def restart_agent(run: Run, checks: Checks) -> float:
    seconds = run.node.start_agent()
    checks.notes.append(f"agent ready {seconds:.1f} s after restart")
    return seconds


def agent_killed_while_lent(run: Run) -> FaultOutcome:
    """SIGKILL the agent while the owner is lent, first with no spot user yet (the lending
    record must bring the loan back at once, without another ``maxInactiveTime``), then with
    spot users (recovery must keep them running, re-arm the guard with the fd holder's copy of
    the owner's notify fd); then the owner returns and is held and evicted as usual."""
    checks = Checks()
    run.lend()
    run.node.agent.kill()
    restart_agent(run, checks)
    checks.expect(_state_owner(run) == "lent", f"owner not lent after the restart (state {_state_owner(run)})")
    try:
        run.node.kubelet.wait_devices(SPOT_GPU_RESOURCE, run.twins_are("Healthy"), timeout=2)
    except TimeoutError:
        checks.failed.append("twins not Healthy right after the restart (the loan was not kept)")
    spots = run.start_spots()
    run.node.agent.kill()
    restart_agent(run, checks)
    checks.expect(_state_owner(run) == "lent", f"owner not lent after the 2nd restart (state {_state_owner(run)})")
    alive = [s for s in spots if run.node.init_pid(s.cid) is not None]
    stopped = len(spots) - len(alive)
    checks.expect(not stopped, f"recovery stopped {stopped} spot container(s) of a lent owner")
    checks.expect(_guard_ready(run), "guard not armed with the owner's notify fd after the restart")
    release, started = owner_returns(run, spots, checks)
    recovered(run, spots, checks, since=started)
    return checks.outcome("agent-killed-while-lent", release.hold_ms)


def agent_killed_mid_return(run: Run) -> FaultOutcome:
    """SIGKILL the agent while the owner's call is held and the eviction has not stopped any
    spot task yet: the kubelet answers pod-resources slowly meanwhile, so the agent's fresh read
    at the start of the eviction keeps it in that state for half a second. The fd holder must
    release the held call at once (not ENOSYS, not a hang) although the spot work still runs;
    the next agent's recovery must finish the eviction (stop the tasks, delete the pods)."""
    checks = Checks()
    run.lend()
    spots = run.start_spots()
    run.node.pod_resources.delay = 2.0
    try:
        session = Background(run.owner_session)
        evicting = run.node.wait_state(lambda s: s.get("owners", {}).get(OWNER.format()) == "evicting", 10, 0.005)
        checks.expect(evicting is not None, "the agent never started evicting")
        killed_at = time.monotonic()
        run.node.agent.kill()
    finally:
        run.node.pod_resources.delay = 0.0
    release: Release = session.join(run.bound_s + 15)
    owner_ok(run, release, checks)
    after_kill_ms = (int(release.reply["end_ns"]) / 1e9 - killed_at) * 1000
    checks.expect(after_kill_ms > -1.0, "the call was released before the kill: not a mid-return kill")
    checks.notes.append(f"the fd holder released the call {max(0.0, after_kill_ms):.1f} ms after the kill")
    holders = run.gpu_holders(spots)
    checks.expect(not holders, f"spot work on the GPUs when the holder released the call: {list(holders.values())}")
    if not holders:
        checks.notes.append("no spot process on the GPUs when the holder released the call")
    run.owner_hold()
    restart_agent(run, checks)
    recovered(run, spots, checks, since=killed_at)
    return checks.outcome("agent-killed-mid-return", release.hold_ms)


def kubelet_restarted(run: Run) -> FaultOutcome:
    """Restart the kubelet double while lent: every socket in the device-plugins directory is
    deleted. The agent must serve again and re-register, re-send its (Healthy) twins; spot
    containers started after the restart must still get the owner's GPU through the new
    sockets; the return then works as usual."""
    checks = Checks()
    run.lend()
    half = max(1, run.settings.spot_containers // 2)
    spots = run.start_spots(half)
    before = run.node.kubelet.registration_count(SPOT_GPU_RESOURCE)
    restarted = time.monotonic()
    run.node.restart_kubelet()
    try:
        run.node.kubelet.wait_registered(SPOT_GPU_RESOURCE, before + 1, timeout=15)
        run.node.kubelet.wait_devices(SPOT_GPU_RESOURCE, run.twins_are("Healthy"), timeout=5)
        took = time.monotonic() - restarted
        checks.notes.append(f"agent re-registered, twins Healthy {took:.2f} s after the restart")
    except TimeoutError as exc:
        checks.failed.append(f"no re-registration: {exc}")
        return checks.outcome("kubelet-restarted")
    spots += run.start_spots(run.settings.spot_containers - half, first=half)
    checks.notes.append(f"{run.settings.spot_containers - half} spot container(s) synced after the restart")
    release, started = owner_returns(run, spots, checks)
    recovered(run, spots, checks, since=started)
    return checks.outcome("kubelet-restarted", release.hold_ms)


def containerd_stopped_during_return(run: Run) -> FaultOutcome:
    """containerd's daemon is SIGKILLed (its shims and containers keep running) just before the
    owner returns, so the whole eviction runs without it: the agent must still clear the GPUs
    (it kills the spot containers' processes through ``/proc``), delete the pods and release
    the owner; once containerd is back the tasks show as stopped and nothing is left."""
    checks = Checks()
    run.lend()
    spots = run.start_spots()
    run.node.containerd.pause()
    release, started = owner_returns(run, spots, checks)
    seconds = run.node.restart_containerd()
    checks.notes.append(f"containerd back after {seconds:.1f} s")
    recovered(run, spots, checks, since=started)
    return checks.outcome("containerd-stopped-during-return", release.hold_ms)


ATTACK_WAIT_S: Final = 15.0
"""Longest wait for the attack's CPU pod to hold the GPU before the owner returns."""
WATCH_BOUND_S: Final = 12.0
"""Longest a late holder may keep the GPU before the holder watch (5 s interval) must have killed it."""


def _fd_attack(run: Run, receiver_args: list[str], mounts: list[tuple[str, str, bool]]) -> tuple[Spot, Spot]:
    """Lend; start the CPU pod (``receiver_args``) and a spot pod that sends it its GPU's fd."""
    run.lend()
    cpu_ref = ContainerRef(SPOT_NAMESPACE, f"cpu-receiver-{time.monotonic_ns() % 100000}", "main")
    cpu_uid, cpu_cid = run.node.start_plain(cpu_ref, receiver_args, mounts)
    sender = run.node.start_spot(
        "fd-sender", 0, args=["/bin/e2eclient", "sendfd", "/share/gpu.sock", "{gpu}"], mounts=mounts
    )
    sender.pid = run.node.init_pid(sender.cid)
    receiver = Spot(cpu_ref.pod_ref, cpu_uid, cpu_cid, sender.gpu, sender.twin, 0.0, run.node.init_pid(cpu_cid))
    return sender, receiver


def _holds_gpu(spot: Spot, timeout: float) -> bool:
    """Whether ``spot``'s init holds its GPU open (looked at until ``timeout``, at least once)."""
    deadline = time.monotonic() + timeout
    path = gpu_path(spot.gpu)  # and as the kernel names it once the sender's /dev is unmounted
    while True:
        if spot.pid and gpu_fds(spot.pid, [path, "/" + path.removeprefix("/dev/")]):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _drop_plain(run: Run, spot: Spot) -> None:
    run.node.remove_container(spot.cid)
    run.node.api.remove("", "pods", spot.ref.name, spot.ref.namespace or "")


def gpu_fd_received_after_release(run: Run) -> FaultOutcome:
    """The fd in flight: the spot container sends its GPU's fd to a CPU pod's socket that has not
    accepted the connection yet, so at the return no process holds it (it waits in the socket's
    queue) and the release check cannot see it. After the owner's release the CPU pod accepts
    and holds the owner's GPU: the agent's holder watch must kill it within about its interval
    (``watchInterval``, 5 s here). The owner's call itself is clean; how long the stranger held
    the GPU after the release is the documented limit (docs/security.md)."""
    checks = Checks()
    share = run.node.paths.base / f"share-{time.monotonic_ns()}"
    share.mkdir()
    mounts = [("/share", str(share), False)]
    sender, receiver = _fd_attack(run, ["/bin/e2eclient", "recvfd", "/share/gpu.sock", "/share/go"], mounts)
    time.sleep(0.3)  # the sender connects and sends while the receiver has not accepted
    checks.expect(not _holds_gpu(receiver, 0.0), "the CPU pod held the GPU before the release")
    run.watch_exits([sender])
    release, started = owner_returns(run, [sender], checks)
    (share / "go").write_text("")
    took = _holds_gpu(receiver, 5.0)
    held_from = time.monotonic()
    checks.expect(took, "the attack did not take: the CPU pod never received the GPU after the release")
    gone = False
    while took and time.monotonic() < held_from + WATCH_BOUND_S:
        if receiver.pid is None or not _holds_gpu(receiver, 0.0):
            gone = True
            break
        time.sleep(0.05)
    if took:
        checks.expect(gone, f"the CPU pod still held the owner's GPU {WATCH_BOUND_S:.0f} s after receiving it")
        if gone:
            checks.notes.append(
                f"holder watch killed the late holder {time.monotonic() - held_from:.1f} s after it got the fd"
            )
    _drop_plain(run, receiver)
    recovered(run, [sender], checks, since=started)
    return checks.outcome("gpu-fd-received-after-release", release.hold_ms)


def gpu_fd_passed_to_cpu_pod(run: Run) -> FaultOutcome:
    """The attack of an fd handed out of the victim set: a spot container opens its synced GPU
    and sends the fd (SCM_RIGHTS over a unix socket on a volume it shares with another pod of
    the same tenant) to an ordinary CPU pod, which keeps it. On the return only the spot pod is a
    victim (pod-resources knows nothing of the CPU pod), yet the CPU pod holds the owner's GPU:
    the agent's release check must find it by what it holds and kill it before the owner's call
    is released. Checked as for spot containers: its process exited before the owner's call
    returned, and nothing but the owner holds a GPU then."""
    checks = Checks()
    share = run.node.paths.base / f"share-{time.monotonic_ns()}"
    share.mkdir()
    mounts = [("/share", str(share), False)]
    sender, receiver = _fd_attack(run, ["/bin/e2eclient", "recvfd", "/share/gpu.sock"], mounts)
    took = _holds_gpu(receiver, ATTACK_WAIT_S)
    checks.expect(took, "the attack did not take: the CPU pod never held the GPU")
    if took:
        checks.notes.append("the CPU pod held the owner's GPU through a passed fd")
    run.watch_exits([sender, receiver])
    release, started = owner_returns(run, [sender, receiver], checks)
    _drop_plain(run, receiver)
    recovered(run, [sender], checks, since=started)
    return checks.outcome("gpu-fd-passed-to-cpu-pod", release.hold_ms)


FAULTS: Final[tuple[tuple[str, Callable[[Run], FaultOutcome]], ...]] = (
    ("agent-killed-while-lent", agent_killed_while_lent),
    ("agent-killed-mid-return", agent_killed_mid_return),
    ("kubelet-restarted", kubelet_restarted),
    ("containerd-stopped-during-return", containerd_stopped_during_return),
    ("gpu-fd-passed-to-cpu-pod", gpu_fd_passed_to_cpu_pod),
    ("gpu-fd-received-after-release", gpu_fd_received_after_release),
)


def run_faults(run: Run) -> list[FaultOutcome]:
    """Every fault in order; a fault that raises is a failed outcome, and the run goes on only
    if the node still works (the agent is started again when it is down)."""
    outcomes = []
    for name, fault in FAULTS:
        try:
            outcome = fault(run)
        except Exception as exc:
            outcome = FaultOutcome(name, False, f"{type(exc).__name__}: {exc}")
            if not run.node.agent.running:
                run.node.start_agent()
            if not run.owner_holding:
                run.owner_hold()
        outcomes.append(outcome)
        run.say(outcome.line())
    return outcomes


__all__ = [
    "FAULTS",
    "RECOVERY_TIMEOUT",
    "Checks",
    "agent_killed_mid_return",
    "agent_killed_while_lent",
    "containerd_stopped_during_return",
    "gpu_fd_passed_to_cpu_pod",
    "gpu_fd_received_after_release",
    "kubelet_restarted",
    "owner_ok",
    "owner_returns",
    "recovered",
    "restart_agent",
    "run_faults",
]
