"""Owners and their node agent: activity from the trace, lending through the shared state machine.

No I/O. One :class:`~spotgpu.sim.lending.OwnerAgent` per owner runs
:func:`spotgpu.core.lending.transition` (the agent's own decisions), fed the samples the agent
would build; :class:`Owners` applies its actions to the model (a loan makes the twins Healthy,
an ``Evict`` plans the kill with the agent's :func:`~spotgpu.agent.model.plan_eviction` and
schedules it) and models the return path: the guard signals a lent owner's first GPU call and
holds it until the kill is done (capped by the fail-open timeout); without the guard, the next
poll sees the owner.

Polling is event-driven: between two activity changes every poll would see the same thing, so
only the polls that can change the state are simulated, each at its true time on the owner's
poll grid (a per-owner phase in ``[0, detectInterval)``): the first and the last one inside an
activity interval when the first ends a judged idle period, else the last one; the one at
:meth:`~spotgpu.sim.lending.OwnerAgent.judge_at` that can lend the owner, again after a refusal;
and the first one after a guard-less return. ``tests/sim/test_lending_sim.py`` checks that this
decides as feeding every poll does.

:meth:`Owners.node_forecast` is what the node's agent publishes in ``spotgpu.io/idle-forecast``
(the scheduler's :class:`~spotgpu.scheduler.model.IdleForecast` per lent GPU), as of its last
detection round.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import assert_never

from spotgpu.core.ids import DeviceID
from spotgpu.core.lending import Actions, Evict, LendRules, LendState, Lent, Persist
from spotgpu.core.mapping_cache import DeviceEntry, MappingSnapshot, OwnerEntry
from spotgpu.core.types import EvictionReason
from spotgpu.scheduler.model import MAX_FORECAST_S, IdleForecast
from spotgpu.sim.engine import Priority
from spotgpu.sim.events import (
    EvictionDone,
    GuardSignal,
    IdlePoll,
    OwnerDeadline,
    OwnerEvent,
    OwnerStart,
    OwnerStop,
    ReturnPoll,
)
from spotgpu.sim.lending import OwnerAgent, policy_rules
from spotgpu.sim.model import JobSim, NodeSim, OwnerSim
from spotgpu.sim.state import Cycles, Run, World

EvictJob = Callable[[JobSim, EvictionReason], None]


class Owners:
    """The owners' activity and their agents' lending (see module docstring)."""

    __slots__ = ("cycles", "dirty", "evict_job", "rules", "run", "world")

    def __init__(self, run: Run, world: World, cycles: Cycles, dirty: set[NodeSim], evict_job: EvictJob) -> None:
        self.run = run
        self.world = world
        self.cycles = cycles
        self.dirty = dirty
        """The node index's changed nodes (a loan or a return changes twin health)."""
        self.evict_job = evict_job
        p = run.policy
        self.rules: LendRules = policy_rules(p.max_inactive_time, p.lend_policy, p.predictive, p.guard)

    def start(self) -> None:
        """Schedule every owner's first activity and, on a lending policy, start its agent."""
        run = self.run
        for owner in self.world.owners:
            for gpu in owner.gpus:
                run.touch(gpu)
            if owner.trace.active:
                run.engine.at(owner.trace.active[0][0], OwnerStart(owner.index, 0))
            if run.policy.lending:
                owner.agent = OwnerAgent(
                    owner.ref, owner.devices, self.rules, 0.0, covered=run.policy.guard, log=run.hooks.lending_log
                )
                self._arm_idle_check(owner)

    def handle(self, event: OwnerEvent) -> None:
        owner = self.world.owners[event.owner]
        match event:
            case OwnerStart():
                self._owner_start(owner, event)
            case OwnerStop():
                self._owner_stop(owner, event)
            case IdlePoll():
                self._idle_poll(owner)
            case ReturnPoll():
                self._return_poll(owner)
            case GuardSignal():
                self._guard_signal(owner)
            case EvictionDone():
                self._eviction_done(owner, event)
            case OwnerDeadline():
                self.run.checker.owner_deadline(self.run.engine.now, owner, event.since)
            case _:
                assert_never(event)

    # --- the poll grid ----------------------------------------------------------------------
    def _next_poll(self, owner: OwnerSim, t: float) -> float:
        d = self.run.lat.detect_interval
        k = math.ceil((t - owner.poll_phase) / d - 1e-9)
        return owner.poll_phase + max(0, k) * d

    def _last_poll_before(self, owner: OwnerSim, t: float) -> float:
        d = self.run.lat.detect_interval
        k = math.ceil((t - owner.poll_phase) / d - 1e-9) - 1
        return owner.poll_phase + k * d

    def _last_poll_at(self, owner: OwnerSim, t: float) -> float:
        """The last poll at or before ``t``."""
        d = self.run.lat.detect_interval
        return owner.poll_phase + math.floor((t - owner.poll_phase) / d + 1e-9) * d

    def _poll(self, owner: OwnerSim, at: float, owner_active: bool) -> Actions:
        """One detection round of the agent for ``owner`` at ``at`` (the shared state machine)."""
        assert owner.agent is not None
        actions = owner.agent.poll(at, owner_active, [g.running_spot() for g in owner.gpus])
        self._apply_lending(owner, actions)
        return actions

    def _apply_lending(self, owner: OwnerSim, actions: Actions) -> None:
        """Apply what the state machine decided to the model: a loan makes the twins Healthy,
        an ``Evict`` starts the kill; arming, records and publication need nothing here."""
        assert owner.agent is not None
        for action in actions:
            if isinstance(action, Lent):
                self._lend(owner)
            elif isinstance(action, Evict):
                self._start_eviction(owner)
        owner.lend = owner.agent.lend

    # --- activity ---------------------------------------------------------------------------
    def _owner_start(self, owner: OwnerSim, event: OwnerStart) -> None:
        run = self.run
        engine = run.engine
        now = engine.now
        owner.active = True
        owner.interval = event.interval
        owner.active_end = owner.trace.active[event.interval][1]
        if owner.active_end < run.horizon:
            engine.at(owner.active_end, OwnerStop(owner.index, event.interval))
        for gpu in owner.gpus:
            run.touch(gpu)
        if owner.idle_check is not None:
            engine.cancel(owner.idle_check)
            owner.idle_check = None
        if not run.policy.lending or owner.lend is not LendState.LENT:
            return
        run.metrics.returns.while_lent += 1
        owner.hold_start = now
        delay: float
        guard = run.policy.guard
        if guard:
            delay = run.lat.guard_signal.sample(run.rng)
            engine.at(now + delay, GuardSignal(owner.index), Priority.AGENT)
        else:
            poll = self._next_poll(owner, now)
            engine.at(poll, ReturnPoll(owner.index), Priority.AGENT)
            delay = poll - now
        bound = run.checker.return_bound(owner, delay, guard)
        engine.at(now + bound + 1e-6, OwnerDeadline(owner.index, now), Priority.CHECK)

    def _owner_stop(self, owner: OwnerSim, event: OwnerStop) -> None:
        run = self.run
        now = run.engine.now
        owner.active = False
        for gpu in owner.gpus:
            run.touch(gpu)
        nxt = event.interval + 1
        if nxt < len(owner.trace.active):
            run.engine.at(owner.trace.active[nxt][0], OwnerStart(owner.index, nxt))
        agent = owner.agent
        if agent is None:
            return
        start = owner.trace.active[event.interval][0]
        last = self._last_poll_before(owner, now)
        if last >= start and agent.lend is LendState.ACTIVE:
            # The polls inside the interval saw the owner working (delivered now; no decision
            # depends on them before now: an active owner's working polls only move its idle
            # start, and end a judged idle period, which the first of them does).
            first = self._next_poll(owner, start)
            polls = (first, last) if agent.state.judged and first < last else (last,)
            for at in polls:
                result = self._poll(owner, at, owner_active=True)
                assert all(isinstance(a, Persist) for a in result), f"a working poll produced {result}"
        if owner.lend is LendState.ACTIVE:
            self._arm_idle_check(owner)

    # --- lending ----------------------------------------------------------------------------
    def _arm_idle_check(self, owner: OwnerSim) -> None:
        agent = owner.agent
        if agent is None or owner.idle_check is not None or owner.active or owner.lend is not LendState.ACTIVE:
            return
        run = self.run
        now, horizon = run.engine.now, run.horizon
        due = agent.judge_at()
        if due > horizon:
            return
        at = self._next_poll(owner, max(now, due))
        while at < due or at - agent.state.last_active < run.policy.max_inactive_time:  # floating-point rounding
            at = math.nextafter(at, math.inf)
        if at <= now and agent.state.judged:
            at = self._next_poll(owner, now + run.lat.detect_interval / 2)  # judged now: the next poll
        if at <= horizon:
            owner.idle_check = run.engine.at(at, IdlePoll(owner.index), Priority.AGENT)

    def _idle_poll(self, owner: OwnerSim) -> None:
        owner.idle_check = None
        if owner.active or owner.lend is not LendState.ACTIVE:
            return
        self._poll(owner, self.run.engine.now, owner_active=False)
        if owner.lend is LendState.ACTIVE:
            self._arm_idle_check(owner)  # not lent (refused): judged again when that can change

    def _lend(self, owner: OwnerSim) -> None:
        metrics = self.run.metrics
        metrics.returns.loans += 1
        metrics.time.lent_gpus += len(owner.gpus)
        self.dirty.add(owner.gpus[0].node)
        self.cycles.want()

    # --- the return -------------------------------------------------------------------------
    def _guard_signal(self, owner: OwnerSim) -> None:
        if owner.lend is not LendState.LENT:
            return
        assert owner.agent is not None
        actions = owner.agent.guard_signal(self.run.engine.now)
        assert any(isinstance(a, Evict) for a in actions), "a lent owner's return must start an eviction"
        self._apply_lending(owner, actions)

    def _return_poll(self, owner: OwnerSim) -> None:
        if owner.lend is not LendState.LENT:
            return
        if not owner.active:
            # The poll came after the owner had stopped again: polling missed this return. The
            # sharing ended with the owner's activity; the next return will be polled again.
            if owner.hold_start is not None:
                self.run.metrics.returns.exposures_ms.append((owner.active_end - owner.hold_start) * 1000)
                owner.hold_start = None
            return
        actions = self._poll(owner, self.run.engine.now, owner_active=True)
        assert any(isinstance(a, Evict) for a in actions), f"a lent owner's working poll produced {actions}"

    def _mapping(self, owner: OwnerSim) -> MappingSnapshot:
        devices = tuple(DeviceEntry(g.id, tuple(sorted({u.ref for u in g.users}))) for g in owner.gpus)
        return MappingSnapshot((OwnerEntry(owner.ref, devices),))

    def _start_eviction(self, owner: OwnerSim) -> None:
        run = self.run
        now = run.engine.now
        run.metrics.time.lent_gpus -= len(owner.gpus)
        self.dirty.add(owner.gpus[0].node)
        plan = run.hooks.plan_eviction(self._mapping(owner), owner.ref, owner.devices, now)
        victims = tuple(v.pod for v in plan.victims)
        if victims:
            run.metrics.returns.with_eviction += 1
        run.engine.at(now + run.lat.kill(len(victims), run.rng), EvictionDone(owner.index, victims), Priority.AGENT)

    def _eviction_done(self, owner: OwnerSim, event: EvictionDone) -> None:
        run = self.run
        now = run.engine.now
        lat = run.lat
        for ref in event.pods:
            pod = self.world.pods.get(ref)
            if pod is not None and not pod.killed:
                self.evict_job(pod.job, EvictionReason.OWNER_BACK)
        if owner.hold_start is not None:
            if run.policy.guard:
                hold = now + lat.guard_release.sample(run.rng) - owner.hold_start
                if hold > lat.fail_open_timeout:
                    run.metrics.returns.exposures_ms.append((hold - lat.fail_open_timeout) * 1000)
                    hold = lat.fail_open_timeout
                run.metrics.returns.holds_ms.append(hold * 1000)
            else:
                run.metrics.returns.exposures_ms.append((now - owner.hold_start) * 1000)
            owner.hold_start = None
        assert owner.agent is not None
        self._apply_lending(owner, owner.agent.eviction_done(now))
        self.dirty.add(owner.gpus[0].node)
        self._arm_idle_check(owner)

    # --- what the agent publishes -----------------------------------------------------------
    def idle_forecast(self, node: NodeSim) -> dict[DeviceID, tuple[int, int]]:
        """``{real device id: (expected, p20)}``: the idle remainder the agent of ``node`` would
        publish now (``spotgpu.io/idle-forecast``) for its lent GPUs."""
        now = self.run.engine.now
        out: dict[DeviceID, tuple[int, int]] = {}
        for owner in _owners_of(node):
            assert owner.agent is not None
            out.update(owner.agent.forecast(now))
        return out

    def node_forecast(self, node: NodeSim, now: float) -> Mapping[DeviceID, IdleForecast]:
        """What ``spotgpu.io/idle-forecast`` carries for ``node`` at ``now``, as the scheduler reads it.

        The agent patches the annotation after every detection round (and at each loan): each
        lent owner's :func:`~spotgpu.core.lending.idle_forecast` as of its last poll at or before
        ``now`` (or its loan, if later), in whole seconds; the scheduler ignores entries outside
        ``0..MAX_FORECAST_S`` (``spotgpu.kube.leases.parse_idle_forecast``), so they are left out.
        The same mapping object is returned while nothing changed (snapshots reuse by identity).
        """
        parts = tuple(self._published(owner, now) for owner in _owners_of(node))
        last = node.forecast
        if last is not None and last[0] == parts:
            return last[1]
        merged: Mapping[DeviceID, IdleForecast]
        if len(parts) <= 1:
            merged = parts[0] if parts else _NOTHING
        else:
            combined: dict[DeviceID, IdleForecast] = {}
            for part in parts:
                combined.update(part)
            merged = combined
        node.forecast = (parts, merged)
        return merged

    def _published(self, owner: OwnerSim, now: float) -> dict[DeviceID, IdleForecast]:
        """One owner's part of the annotation (the previous object while it is equal)."""
        agent = owner.agent
        assert agent is not None
        state = agent.state
        if state.state is not LendState.LENT or state.lent_at is None:
            return _NOTHING
        at = max(state.lent_at, self._last_poll_at(owner, now))
        last = owner.forecast
        if last is not None and last[0] is state and last[1] == at:
            return last[2]
        out = {
            device: IdleForecast(expected, p20)
            for device, (expected, p20) in agent.forecast(at).items()
            if expected <= MAX_FORECAST_S and p20 <= MAX_FORECAST_S
        }
        if last is not None and last[2] == out:
            out = last[2]
        owner.forecast = (state, at, out)
        return out


_NOTHING: dict[DeviceID, IdleForecast] = {}


def _owners_of(node: NodeSim) -> list[OwnerSim]:
    """The owners on ``node`` with an agent, in GPU order."""
    out: list[OwnerSim] = []
    for gpu in node.gpus:
        owner = gpu.owner_sim
        if owner is not None and owner.agent is not None and (not out or out[-1] is not owner):
            out.append(owner)
    return out


__all__ = ["Owners"]
