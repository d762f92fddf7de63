"""The agent's coordinator and the simulator's owner agent apply one state machine the same way:
driven by one generated trace (detection rounds with the owner idle or working and the guard
covering it or not, guard signals, evictions done, agent restarts), both produce the same
sequence of actions (hypothesis).

The agent side is the whole agent on in-memory fakes (:func:`make_rig`): measurements go
through the GPU backend, the attributor, the solver's coordinator and its executors; a restart
is a new agent on the same lending record. Its evictions finish within the call that starts
them, so the simulator side (:class:`spotgpu.sim.lending.OwnerAgent`, as the simulation drives
it) completes each eviction at once (a kill latency of 0), and the trace's own "eviction done"
events are no-ops on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotgpu.core.config import LendingConfig, LendPolicyKind, PredictiveConfig, UnguardedPolicy
from spotgpu.core.configfile import Seconds
from spotgpu.core.lending import Action, Evict, LendRules
from spotgpu.sim.lending import OwnerAgent
from spotgpu.testing.fakes import FakeLendStore

from .helpers import OWNER, Rig, make_rig

MAX_INACTIVE = 60.0


@dataclass(frozen=True)
class Poll:
    dt: int
    owner_active: bool
    covered: bool


@dataclass(frozen=True)
class Guard:
    dt: int


@dataclass(frozen=True)
class Done:
    dt: int


@dataclass(frozen=True)
class Restart:
    dt: int


Step = Poll | Guard | Done | Restart
dts = st.integers(min_value=1, max_value=1500)
step = st.one_of(
    st.builds(Poll, dts, st.booleans(), st.sampled_from([True, True, True, False])),
    st.builds(Poll, dts, st.booleans(), st.sampled_from([True, True, True, False])),
    st.builds(Poll, dts, st.booleans(), st.sampled_from([True, True, True, False])),
    st.builds(Guard, dts),
    st.builds(Done, dts),
    st.builds(Restart, dts),
)
lendings = st.builds(
    lambda policy, unguarded: LendingConfig(
        policy,
        unguarded,
        PredictiveConfig(min_expected_idle=Seconds(1200), min_likely_idle=Seconds(300), quick_return=Seconds(900)),
    ),
    st.sampled_from(list(LendPolicyKind)),
    st.sampled_from(list(UnguardedPolicy)),
)


class AgentSide:
    def __init__(self, tmp: Path, lending: LendingConfig) -> None:
        self.tmp, self.lending = tmp, lending
        self.store = FakeLendStore()
        self.log: list[Action] = []
        self.active, self.covered, self.now = False, True, 1000.0
        self.rig = self._start()

    def _start(self) -> Rig:
        rig = make_rig(self.tmp, store=self.store, start=False, max_inactive=MAX_INACTIVE, lending=self.lending)
        rig.clock.set(self.now)
        rig.agent.solver.action_log = self.log
        self._world(rig)
        rig.agent.start(serve_metrics=False, loops=False)  # recovery, then a detection round now
        return rig

    def _world(self, rig: Rig) -> None:
        rig.backend.clear()
        if self.active:
            rig.backend.run(rig.d[0], 888)
            rig.attributor.owner_of[888] = "owner-cid"
        rig.guard.uncovered = set() if self.covered else {OWNER}

    def step(self, s: Step) -> None:
        self.now += s.dt
        self.rig.clock.set(self.now)
        if isinstance(s, Poll):
            self.active, self.covered = s.owner_active, s.covered
            self._world(self.rig)
            self.rig.agent.detect_once()
        elif isinstance(s, Guard):
            self.rig.guard.owner_back(OWNER)
        elif isinstance(s, Restart):
            self.rig.agent.stop()
            self.rig = self._start()


class SimSide:
    def __init__(self, lending: LendingConfig, devices: tuple[str, ...]) -> None:
        self.log: list[Action] = []
        self.now = 1000.0
        self.active = False
        rules = LendRules(MAX_INACTIVE, lending)
        self.agent = OwnerAgent(OWNER, devices, rules, self.now, log=self.log)  # type: ignore[arg-type]
        self._poll()

    def _poll(self) -> None:
        self._done(self.agent.poll(self.now, self.active, [False] * len(self.agent.state.devices)))

    def _done(self, actions: tuple[Action, ...]) -> None:
        if any(isinstance(a, Evict) for a in actions):
            self.agent.eviction_done(self.now)  # what the simulation schedules after the kill

    def step(self, s: Step) -> None:
        self.now += s.dt
        if isinstance(s, Poll):
            self.active, self.agent.covered = s.owner_active, s.covered
            self._poll()
        elif isinstance(s, Guard):
            self._done(self.agent.guard_signal(self.now))
        elif isinstance(s, Done):
            self.agent.eviction_done(self.now)
        else:
            self.agent.restart(self.now)
            self._poll()


@settings(max_examples=150, deadline=None)
@given(st.lists(step, max_size=30), lendings)
def test_the_agent_and_the_simulator_act_alike_on_one_trace(
    tmp_path_factory: pytest.TempPathFactory, trace: list[Step], lending: LendingConfig
) -> None:
    tmp = tmp_path_factory.mktemp("trace")
    agent = AgentSide(tmp, lending)
    sim = SimSide(lending, tuple(agent.rig.d[:2]))
    try:
        for s in trace:
            agent.step(s)
            sim.step(s)
            assert agent.log == sim.log, f"after {s}"
    finally:
        agent.rig.agent.stop()
