"""The faults ``spotgpu soak`` strikes besides those of ``node-e2e --faults``: restarts of the
guard's fd holder, containerd and the agent at drawn points of a return, owners that come back
at awkward moments, spot containers that misbehave.

Decides nothing about lending; decides how each fault is struck and what counts as surviving
it: the same end state as :mod:`spotgpu.e2e.faults` (the owner's call never fails, no spot
process on its GPUs when its call returns, the node clean and the MappingCache equal to it
afterwards). Side effects: SIGKILL/SIGTERM of the holder, containerd and agent processes, and
everything :class:`~spotgpu.e2e.run.Run` does.

Each fault is a function of the run and a :class:`random.Random` drawn from the soak's seed (the
point of a kill), returning a :class:`~spotgpu.e2e.run.FaultOutcome`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Final

from spotgpu.e2e.faults import Checks, owner_ok, owner_returns, recovered, restart_agent
from spotgpu.e2e.model import Spot
from spotgpu.e2e.processes import ChildProcess
from spotgpu.e2e.run import Background, FaultOutcome, Release, Run
from spotgpu.guard.rule import listener_ready

HOLDER_READY_S: Final = 30.0

SPOT_SCRIPTS: Final[dict[str, str]] = {
    "spot-forks": "exec 3<>{gpu}; sleep 1000000 & sleep 1000000 & exec sleep 1000000",
    "spot-ignores-sigterm": "trap '' TERM INT; exec 3<>{gpu}; while true; do sleep 1; done",
    "spot-execs": "exec 3<>{gpu}; exec sh -c 'exec sh -c \"exec sleep 1000000\"'",
    "spot-device-in-child": "sh -c 'exec 3<>{gpu}; exec sleep 1000000' & exec sleep 1000000",
    "spot-hands-fd-to-child": "exec 3<>{gpu}; sleep 1000000 & exec 3<&-; exec sleep 1000000",
}
"""Spot containers that are no well-behaved single process (``{gpu}``: the synced GPU's path)."""

Fault = Callable[[Run, random.Random], FaultOutcome]


def _ready(run: Run) -> bool:
    state = run.node.agent_state() or {}
    return bool((state.get("guard") or {}).get("attached"))


def _wait_holder(holder: ChildProcess, run: Run, checks: Checks) -> None:
    deadline = time.monotonic() + HOLDER_READY_S
    listener = str(run.node.listener)
    while not (listener_ready(listener) and holder.running and _ready(run)):
        if time.monotonic() > deadline or not holder.running:
            checks.failed.append(f"the new holder (or the guard's attach) never came up:\n{holder.log_tail(10)}")
            return
        time.sleep(0.05)


def _return_and_recover(run: Run, checks: Checks, name: str, spots: list[Spot]) -> FaultOutcome:
    release, started = owner_returns(run, spots, checks)
    recovered(run, spots, checks, since=started)
    return checks.outcome(name, release.hold_ms)


def holder_restarted(run: Run, rng: random.Random) -> FaultOutcome:
    """SIGKILL the fd holder while lent with spot users (the guard keeps copies of every notify
    fd); start a new one, which the guard attaches to and hands the fds; the owner returns."""
    checks = Checks()
    run.lend()
    spots = run.start_spots()
    run.node.holder.kill()
    run.node.holder.start()
    _wait_holder(run.node.holder, run, checks)
    return _return_and_recover(run, checks, "holder-restarted", spots)


def holder_upgraded(run: Run, rng: random.Random) -> FaultOutcome:
    """A rolling upgrade of the fd holder while lent: a new holder takes every fd over from the
    running one (the handover), then the old one is asked to stop (SIGTERM) and must exit; the
    owner returns to the new holder's guard."""
    checks = Checks()
    run.lend()
    spots = run.start_spots()
    old = run.node.holder
    new = ChildProcess(old.name, old.argv, old.log_path)
    new.starts = old.starts
    new.start()
    time.sleep(0.5)
    asked = time.monotonic()
    old.stop(timeout=HOLDER_READY_S)  # SIGTERM: it exits once the new holder took its fds
    took = time.monotonic() - asked
    checks.expect(took < HOLDER_READY_S, f"the old holder did not exit within {HOLDER_READY_S:.0f} s of SIGTERM")
    checks.expect(new.running, f"the new holder exited during the handover:\n{new.log_tail(10)}")
    checks.notes.append(f"old holder exited {took:.1f} s after SIGTERM")
    run.node.holder = new
    _wait_holder(new, run, checks)
    return _return_and_recover(run, checks, "holder-upgraded", spots)


def containerd_restarted(run: Run, rng: random.Random) -> FaultOutcome:
    """containerd's daemon SIGKILLed and started again while lent with spot users (shims and
    containers keep running); the owner then returns to a fresh containerd."""
    checks = Checks()
    run.lend()
    spots = run.start_spots()
    run.node.containerd.pause()
    seconds = run.node.restart_containerd()
    checks.notes.append(f"containerd back after {seconds:.1f} s")
    return _return_and_recover(run, checks, "containerd-restarted", spots)


def agent_killed_during_return(run: Run, rng: random.Random) -> FaultOutcome:
    """SIGKILL the agent at a drawn point of a return (0-60 ms after the owner's call started:
    before the kills, between the kills and the release, or after the release): whoever
    releases the owner (the agent, or the fd holder once the agent is gone) must first have the
    spot processes off its GPUs; the restarted agent finishes the eviction."""
    checks = Checks()
    run.lend()
    spots = run.start_spots()
    delay = rng.uniform(0.0, 0.06)
    session = Background(run.owner_session)
    time.sleep(delay)
    killed_at = time.monotonic()
    run.node.agent.kill()
    release: Release = session.join(run.bound_s + 15)
    owner_ok(run, release, checks)
    leaked, problems = run.release_checks(spots, release)
    checks.expect(not leaked, f"spot work on the GPUs at release: {list(leaked.values())}")
    checks.failed += [p for p in problems if "Unhealthy" not in p]  # a dead agent publishes nothing
    after = (release.end_ns / 1e9 - killed_at) * 1000
    point = "after the release" if after < 0 else "before the release"
    checks.notes.append(f"agent killed {delay * 1000:.0f} ms into the return ({point}, {after:+.1f} ms)")
    run.owner_hold()
    restart_agent(run, checks)
    recovered(run, spots, checks, since=killed_at)
    return checks.outcome("agent-killed-during-return", release.hold_ms)


def agent_killed_after_release(run: Run, rng: random.Random) -> FaultOutcome:
    """SIGKILL the agent right after the owner's call returned (the pods' deletion and
    containerd's clean-up still under way); the restarted agent must finish them."""
    checks = Checks()
    run.lend()
    spots = run.start_spots()
    release, started = owner_returns(run, spots, checks)
    run.node.agent.kill()
    restart_agent(run, checks)
    recovered(run, spots, checks, since=started)
    return checks.outcome("agent-killed-after-release", release.hold_ms)


def owner_returns_during_lend(run: Run, rng: random.Random) -> FaultOutcome:
    """The owner comes back the moment it is lent, before any spot pod started: held briefly
    (no victim), released clean; then a second return right after (not lent any more)."""
    checks = Checks()
    run.lend()
    first = run.owner_session()
    owner_ok(run, first, checks)
    second = run.owner_session()
    owner_ok(run, second, checks)
    run.owner_hold()
    recovered(run, [], checks, since=time.monotonic())
    return checks.outcome("owner-returns-during-lend", max(first.hold_ms, second.hold_ms))


def owner_returns_twice(run: Run, rng: random.Random) -> FaultOutcome:
    """The owner returns (the spot pods are evicted) and at once starts another session, before
    the agent finished deleting the pods: the second call must not fail or be held long."""
    checks = Checks()
    run.lend()
    spots = run.start_spots()
    release, started = owner_returns(run, spots, checks)
    again = run.owner_session()
    owner_ok(run, again, checks)
    recovered(run, spots, checks, since=started)
    return checks.outcome("owner-returns-twice", max(release.hold_ms, again.hold_ms))


def spot_misbehaves(name: str) -> Fault:
    """A lend/return cycle whose spot containers run ``SPOT_SCRIPTS[name]``."""

    def strike(run: Run, rng: random.Random) -> FaultOutcome:
        checks = Checks()
        run.lend()
        spots = run.start_spots(args=["/bin/sh", "-c", SPOT_SCRIPTS[name]])
        checks.notes.append(f"{sum(len(s.watched) for s in spots)} spot process(es) pinned")
        return _return_and_recover(run, checks, name, spots)

    return strike


SOAK_FAULTS: Final[dict[str, Fault]] = {
    "holder-restarted": holder_restarted,
    "holder-upgraded": holder_upgraded,
    "containerd-restarted": containerd_restarted,
    "agent-killed-during-return": agent_killed_during_return,
    "agent-killed-after-release": agent_killed_after_release,
    "owner-returns-during-lend": owner_returns_during_lend,
    "owner-returns-twice": owner_returns_twice,
    **{name: spot_misbehaves(name) for name in SPOT_SCRIPTS},
}
"""The soak's own faults by kind (``node-e2e``'s come from :data:`spotgpu.e2e.faults.FAULTS`)."""

__all__ = ["SOAK_FAULTS", "SPOT_SCRIPTS", "Fault"]
