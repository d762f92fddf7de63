"""One policy on one workload: the dispatching core that drives the real decision code.

No I/O. Deterministic for a given scenario, workload and policy: time is the engine's, every
random draw comes from a generator seeded by the scenario's seed, and ties are broken by the
engine's (time, priority, sequence) order. The only non-simulated input is
``Hooks.perf_counter``, used for the ``profile`` figures (where the wall time went), which are
kept apart from the deterministic results.

Which decision code runs (the same as in a cluster):

* scheduling: :func:`spotgpu.scheduler.run_cycle` on a snapshot of the model (through
  :attr:`Hooks.scheduler`; snapshots: :mod:`spotgpu.sim.snapshot`); its decisions (binds,
  ShadowPods, evictions, nominations, PodGroup statuses) are applied to the model
  (:mod:`spotgpu.sim.apply`);
* owner idle/busy and lend/return: the agent's lending state machine,
  :func:`spotgpu.core.lending.transition`, one :class:`spotgpu.sim.lending.OwnerAgent` per
  owner, fed samples built by :func:`spotgpu.agent.detect.owner_samples`, polled event-driven
  (:mod:`spotgpu.sim.owners`);
* twin health: :func:`spotgpu.agent.model.twin_health`; eviction on return:
  :func:`spotgpu.agent.model.plan_eviction` (through :attr:`Hooks.plan_eviction`).

The pieces: :mod:`spotgpu.sim.owners` (owner activity and the agent's lending),
:mod:`spotgpu.sim.jobs` (arrival, start, finish, requeue), :mod:`spotgpu.sim.apply` (a cycle's
decisions and evictions acted out), :mod:`spotgpu.sim.snapshot` (the scheduler's snapshot,
trimmed), their shared state in :mod:`spotgpu.sim.state`, and here the core: it builds them,
dispatches each event (:mod:`spotgpu.sim.events`) to its owner, runs scheduling cycles and
time-series ticks, and sums the run up.

What is modelled (see docs/simulator.md for the full list and the latencies' sources): the
guard holds a returning owner's first GPU call from its start until the kill of every spot task
on its GPUs is done (signal + kill + release, capped by the fail-open timeout); without the
guard, the owner shares its GPUs with spot work until the next poll plus the kill. An evicted
spot gang loses the work since its last checkpoint on every member, its pods go away after
the teardown latency, and it is requeued. Reserved gangs run to completion and are never
evicted. Scheduling cycles run only when something changed that could let pending work in (an
arrival, freed or newly Healthy GPUs, a ShadowPod to collect), at most once per
``schedulePeriod``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, assert_never

from spotgpu.core.ids import DeviceID
from spotgpu.core.lending import LendRules
from spotgpu.core.refs import PodRef
from spotgpu.scheduler.decisions import CycleResult
from spotgpu.scheduler.model import IdleForecast, Snapshot
from spotgpu.sim import defaults
from spotgpu.sim.apply import Decisions
from spotgpu.sim.engine import Engine, Priority
from spotgpu.sim.events import (
    Cycle,
    Event,
    EvictionDone,
    GuardSignal,
    IdlePoll,
    JobArrival,
    JobFinish,
    JobStart,
    OwnerDeadline,
    OwnerStart,
    OwnerStop,
    PodsGone,
    Requeue,
    ReturnPoll,
    ShadowGone,
    Tick,
)
from spotgpu.sim.invariants import InvariantChecker
from spotgpu.sim.jobs import Jobs
from spotgpu.sim.latency import Latencies
from spotgpu.sim.metrics import Metrics, summarize
from spotgpu.sim.model import JobPhase, JobSim, NodeSim, OwnerSim, PodSim, ShadowSim
from spotgpu.sim.owners import Owners
from spotgpu.sim.scenario import PolicySpec, Scenario, Workload
from spotgpu.sim.snapshot import Snapshots
from spotgpu.sim.state import Cycles, Hooks, NodeIndex, PlacedSpot, Run, World

PROGRESS_STEPS: Final = 200


@dataclass(slots=True)
class PolicyRun:
    """What one policy produced: its summary entry, the raw metrics (for plots), a profile."""

    policy: PolicySpec
    summary: dict[str, object]
    metrics: Metrics
    profile: dict[str, float] = field(default_factory=dict)


class Simulation:
    """One policy over one workload. Call :meth:`run` once."""

    def __init__(self, scenario: Scenario, workload: Workload, policy: PolicySpec, hooks: Hooks | None = None) -> None:
        self.scenario = scenario
        self.workload = workload
        self.policy = policy
        self.state = Run(scenario, policy, hooks or Hooks(), scenario.duration)
        self.world = World.build(scenario, workload)
        self.index = NodeIndex(set(self.world.nodes))
        self.placed = PlacedSpot()
        self.cycles = Cycles(self.state, self.world)
        self.decisions = Decisions(self.state, self.world, self.index, self.placed, self.cycles)
        self.lenders = Owners(self.state, self.world, self.cycles, self.index.dirty, self.decisions.evict_job)
        self.snapshots = Snapshots(self.state, self.world, self.index, self.placed, self.node_idle_forecast)
        self.job_events = Jobs(self.state, self.world, self.placed, self.cycles, self.decisions)
        self.ticks_per_audit = 1

    # --- views (tests and callers read these) -----------------------------------------------
    @property
    def hooks(self) -> Hooks:
        return self.state.hooks

    @hooks.setter
    def hooks(self, hooks: Hooks) -> None:
        self.state.hooks = hooks

    @property
    def horizon(self) -> float:
        return self.state.horizon

    @horizon.setter
    def horizon(self, horizon: float) -> None:
        self.state.horizon = horizon

    @property
    def engine(self) -> Engine[Event]:
        return self.state.engine

    @property
    def metrics(self) -> Metrics:
        return self.state.metrics

    @property
    def checker(self) -> InvariantChecker:
        return self.state.checker

    @property
    def lat(self) -> Latencies:
        return self.state.lat

    @property
    def rules(self) -> LendRules:
        return self.lenders.rules

    @property
    def nodes(self) -> list[NodeSim]:
        return self.world.nodes

    @property
    def owners(self) -> list[OwnerSim]:
        return self.world.owners

    @property
    def jobs(self) -> list[JobSim]:
        return self.world.jobs

    @property
    def pods(self) -> dict[PodRef, PodSim]:
        return self.world.pods

    @property
    def shadows(self) -> dict[PodRef, ShadowSim]:
        return self.world.shadows

    # --- running --------------------------------------------------------------------------
    def run(self) -> PolicyRun:
        state = self.state
        start = state.hooks.perf_counter()
        self.lenders.start()
        self.job_events.start()
        horizon = state.horizon
        audit_every = max(defaults.AUDIT_INTERVAL_S, horizon / defaults.AUDITS_PER_RUN)
        self.ticks_per_audit = max(1, round(audit_every / self._tick_interval()))
        engine = state.engine
        engine.at(0.0, Tick(0), Priority.CHECK)
        metrics = state.metrics
        gpu_time = metrics.time
        dispatch = self._dispatch

        def handle(event: Event) -> None:
            gpu_time.advance(engine.now)
            dispatch(event)

        engine.run(handle, horizon)
        gpu_time.advance(horizon)
        self._finish()
        state.profile["total_s"] = state.hooks.perf_counter() - start
        state.profile["events"] = float(engine.processed)
        return PolicyRun(self.policy, self._summary(), metrics, state.profile)

    def _dispatch(self, event: Event) -> None:
        match event:
            case OwnerStart() | OwnerStop() | IdlePoll() | ReturnPoll() | GuardSignal() | EvictionDone():
                self.lenders.handle(event)
            case OwnerDeadline():
                self.lenders.handle(event)
            case JobArrival() | JobStart() | JobFinish() | PodsGone() | Requeue():
                self.job_events.handle(event)
            case Cycle():
                self._cycle()
            case ShadowGone():
                self.decisions.shadow_gone(event)
            case Tick():
                self._tick(event)
            case _:
                assert_never(event)

    def _tick_interval(self) -> float:
        return min(self.scenario.sample_interval, self.state.horizon / PROGRESS_STEPS)

    def _tick(self, event: Tick) -> None:
        state = self.state
        now = state.engine.now
        interval = self._tick_interval()
        if event.n % max(1, round(self.scenario.sample_interval / interval)) == 0:
            state.metrics.time.sample(now)
        if event.n % self.ticks_per_audit == 0 and event.n:
            self.snapshots.refresh()
            state.checker.audit(now, self.world.nodes, self.world.pods.values())
        if state.hooks.progress is not None:
            state.hooks.progress(now / state.horizon)
        nxt = (event.n + 1) * interval
        if nxt <= state.horizon:
            state.engine.at(nxt, Tick(event.n + 1), Priority.CHECK)

    def _finish(self) -> None:
        state = self.state
        now = state.horizon
        for job in self.world.jobs:
            if job.phase is JobPhase.RUNNING and job.spot and job.started_at is not None:
                state.metrics.spot.useful += (now - job.started_at) * job.spec.gpus
            if job.first_start is None and job.arrival <= now:
                state.metrics.jobs.censor(job.spot, now - job.arrival)
        self.snapshots.refresh()
        state.checker.audit(now, self.world.nodes, self.world.pods.values())
        state.metrics.time.sample(now)

    def _summary(self) -> dict[str, object]:
        p = self.policy
        horizon = self.state.horizon
        jobs = self.world.jobs
        spot = [j for j in jobs if j.spot]
        reserved = [j for j in jobs if not j.spot]
        out: dict[str, object] = {
            "name": p.name,
            "lending": p.lending,
            "strategy": p.strategy.value,
            "max_inactive_time_s": p.max_inactive_time if p.lending else None,
            "lend_policy": p.lend_policy.value if p.lending else None,
            "guard": p.guard,
        }
        out.update(summarize(self.state.metrics, horizon))
        out.update(
            {
                "spot_jobs_submitted": len(spot),
                "spot_jobs_started": sum(1 for j in spot if j.first_start is not None),
                "spot_jobs_completed": sum(1 for j in spot if j.phase is JobPhase.DONE),
                "spot_jobs_evicted": sum(1 for j in spot if j.evictions),
                "spot_jobs_pending_at_end": sum(
                    1 for j in spot if j.phase is JobPhase.PENDING and j.arrival <= horizon
                ),
                "reserved_jobs_submitted": len(reserved),
                "reserved_jobs_completed": sum(1 for j in reserved if j.phase is JobPhase.DONE),
                "scheduler_cycles": self.state.metrics.cycles.run,
                "invariant_checks": self.state.checker.checks,
            }
        )
        return out

    # --- scheduling -----------------------------------------------------------------------
    def build_snapshot(self) -> Snapshot | None:
        """The snapshot for a cycle now (trimmed unless ``Hooks.trim_snapshots`` is off), or
        None when no cycle could decide anything (:meth:`spotgpu.sim.snapshot.Snapshots.build`)."""
        return self.snapshots.build()

    def _cycle(self) -> None:
        state = self.state
        now = state.engine.now
        self.cycles.started(now)
        clock = state.hooks.perf_counter
        profile = state.profile
        t0 = clock()
        snapshot = self.build_snapshot()
        t1 = clock()
        profile["snapshot_s"] += t1 - t0
        if snapshot is None:
            state.metrics.cycles.skipped += 1
        else:
            result = state.hooks.scheduler(snapshot, self.scenario.scheduler, now)
            t2 = clock()
            profile["scheduler_s"] += t2 - t1
            state.metrics.cycles.run += 1
            self._apply(result, snapshot)
            profile["apply_s"] += clock() - t2
        # A ShadowPod without users that is not old enough yet gets its cycle when it is.
        grace = self.scenario.scheduler.shadow_gc_grace
        later = [s.created_at + grace for s in self.world.idle_shadows.values() if s.created_at + grace > now]
        if later:
            self.cycles.want(min(later), force=True)

    def _apply(self, result: CycleResult, snapshot: Snapshot) -> None:
        """Act out a cycle's decisions (:meth:`spotgpu.sim.apply.Decisions.apply`) and start the
        gangs it placed whole."""
        for job in self.decisions.apply(result, snapshot):
            self.job_events.bound(job)

    # --- what the agents publish ------------------------------------------------------------
    def idle_forecast(self, node: NodeSim) -> dict[DeviceID, tuple[int, int]]:
        """``{real device id: (expected, p20)}``: the idle remainder the agent of ``node`` would
        publish now (``spotgpu.io/idle-forecast``) for its lent GPUs."""
        return self.lenders.idle_forecast(node)

    def node_idle_forecast(self, node: NodeSim, now: float) -> Mapping[DeviceID, IdleForecast]:
        """The agent's idle forecast for ``node``'s lent GPUs at ``now`` (real device ID ->
        :class:`~spotgpu.scheduler.model.IdleForecast`): what ``spotgpu.io/idle-forecast`` carries
        in a cluster (:meth:`spotgpu.sim.owners.Owners.node_forecast`). Snapshots ask it of nodes
        with a lent owner, once per cycle."""
        return self.lenders.node_forecast(node, now)


def run_policy(scenario: Scenario, workload: Workload, policy: PolicySpec, hooks: Hooks | None = None) -> PolicyRun:
    """Simulate ``policy`` on ``workload``; raises InvariantViolation if the model breaks a promise."""
    return Simulation(scenario, workload, policy, hooks).run()


__all__ = ["PolicyRun", "Simulation", "run_policy"]
