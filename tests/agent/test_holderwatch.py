"""The release check as the agent drives it (on fakes): the eviction plan's scope reaches the
check before the owner's release, and the holder watch looks, between returns, at the GPUs lent
now or lately with the right people allowed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from spotgpu.agent.holderwatch import HolderWatch
from spotgpu.core.holders import ReleaseReport, ReleaseScope
from spotgpu.core.ids import DeviceID
from spotgpu.core.lending import LendState
from spotgpu.core.refs import PodRef

from .helpers import OWNER, make_rig, pod


class RecordingCheck:
    """A release check that records what it is asked and kills nothing."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.calls: list[tuple[tuple[DeviceID, ...], ReleaseScope]] = []

    def clear(self, devices: Sequence[DeviceID], scope: ReleaseScope, deadline: float) -> ReleaseReport:
        self.calls.append((tuple(devices), scope))
        self.events.append("check")
        return ReleaseReport(rounds=1, owner_known=scope.owner_known)


def test_the_check_runs_before_the_release_and_the_watch_allows_what_is_lent(tmp_path: Path) -> None:
    events: list[str] = []
    check = RecordingCheck(events)
    rig = make_rig(tmp_path, release_check=check)
    watch = rig.agent.holder_watch
    assert isinstance(watch, HolderWatch)
    rig.cycle(0)
    rig.cycle(61)  # idle past maxInactiveTime: lent
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.LENT
    spot = rig.add_spot("job-1", [rig.d[0]], "c" * 64)
    cpu = PodRef("spot", "cpu-pod")
    rig.add_pod(pod(cpu))
    rig.cycle()
    watch.tick()
    ((devices, scope),) = check.calls
    assert set(devices) == {rig.d[0], rig.d[1]}
    assert {"uid-devbox", "uid-job-1"} <= scope.owner_pods and "uid-cpu-pod" not in scope.owner_pods
    assert scope.only_known and "uid-cpu-pod" in scope.known_pods
    check.calls.clear()
    disarms = len([c for c in rig.guard.calls if c[0] == "disarm"])
    rig.agent.on_owner_back(OWNER)
    ((_, plan_scope),) = check.calls  # exactly one check, and the release came after it:
    assert len([c for c in rig.guard.calls if c[0] == "disarm"]) == disarms + 1
    assert plan_scope.victim_pods == {"uid-job-1"} and plan_scope.owner_pods == {"uid-devbox"}
    assert not plan_scope.only_known
    rig.remove_pod(spot)
    rig.cycle()
    check.calls.clear()
    watch.tick()  # the owner was lent lately: still watched, now only its own pod may hold its GPUs
    ((_, after),) = check.calls
    assert after.owner_pods == {"uid-devbox"}


def test_a_loan_shorter_than_a_round_is_watched_from_its_eviction(tmp_path: Path) -> None:
    check = RecordingCheck([])
    rig = make_rig(tmp_path, release_check=check)
    watch = rig.agent.holder_watch
    assert isinstance(watch, HolderWatch)
    assert watch.watched() == []
    rig.cycle(0)
    rig.cycle(61)
    rig.add_spot("job-1", [rig.d[0]], "c" * 64)
    rig.cycle(1)
    rig.agent.on_owner_back(OWNER)  # no round saw the owner lent
    rig.cycle(1)
    assert watch.watched() == [OWNER]
    rig.clock.advance(watch.window + 1)
    assert watch.watched() == []
