"""One policy on one workload: the event handlers that drive the real decision code.

No I/O. Deterministic for a given scenario, workload and policy: time is the engine's, every
random draw comes from a generator seeded by the scenario's seed, and ties are broken by the
engine's (time, priority, sequence) order. The only non-simulated input is
``Hooks.perf_counter``, used for the ``profile`` figures (where the wall time went), which are
kept apart from the deterministic results.

Which decision code runs (the same as in a cluster):

* scheduling: :func:`spotgpu.scheduler.run_cycle` on a snapshot of the model (through
  :attr:`Hooks.scheduler`); its decisions (binds, ShadowPods, evictions, nominations, PodGroup
  statuses) are applied to the model;
* owner idle/busy and lend/return: the agent's lending state machine,
  :func:`spotgpu.core.lending.transition`, one :class:`spotgpu.sim.lending.OwnerAgent` per
  owner, fed samples built by :func:`spotgpu.agent.detect.owner_samples`; polling is
  event-driven: between two activity changes every poll would see the same thing, so only the
  polls that can change the state are simulated (the first and the last one inside an activity
  interval when the first ends a judged idle period, else the last one; the one at
  :meth:`~spotgpu.sim.lending.OwnerAgent.judge_at` that can lend the owner, again after a
  refusal; and the first one after a guard-less return), each at its true time on the owner's
  poll grid (a per-owner phase in ``[0, detectInterval)``);
* twin health: :func:`spotgpu.agent.model.twin_health`; eviction on return:
  :func:`spotgpu.agent.model.plan_eviction` (through :attr:`Hooks.plan_eviction`).

What is modelled (see docs/simulator.md for the full list and the latencies' sources): the
guard holds a returning owner's first GPU call from its start until the kill of every spot task
on its GPUs is done (signal + kill + release, capped by the fail-open timeout); without the
guard, the owner shares its GPUs with spot work until the next poll plus the kill. An evicted
spot gang loses the work since its last checkpoint on every member, its pods go away after
the teardown latency, and it is requeued. Reserved gangs run to completion and are never
evicted.

Scheduling cycles run only when something changed that could let pending work in (an arrival,
freed or newly Healthy GPUs, a ShadowPod to collect), at most once per ``schedulePeriod``.
Unchanged scheduler objects are reused between cycles. With :attr:`Hooks.trim_snapshots` (the
default) a cycle's snapshot holds only the nodes that can take part in its decisions (see
:meth:`Simulation.build_snapshot`; it decides exactly as a full snapshot would), and with
:attr:`Hooks.cap_pending` only the pending spot gangs that could be placed
(:meth:`Simulation._spot_candidates`).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from spotgpu.agent.model import EvictionPlan, LendState, plan_eviction, twin_health
from spotgpu.core.ids import DeviceID, NodeName
from spotgpu.core.lending import Action, Actions, Evict, Lent, Persist
from spotgpu.core.mapping_cache import IDLE_SPACE, DeviceEntry, MappingSnapshot, Owner, OwnerEntry
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import GPU_MILLI, EvictionReason, Health, QueueType
from spotgpu.ports.node import GpuDevice
from spotgpu.scheduler.apply import ApplyError, ModelApplier
from spotgpu.scheduler.config import SchedulerConfig
from spotgpu.scheduler.model import (
    GPU,
    Bind,
    CreateShadowPod,
    CycleResult,
    GPURequest,
    IdleForecast,
    Node,
    Nomination,
    Pod,
    PodGroup,
    PodGroupPhase,
    Queue,
    ShadowPod,
    Snapshot,
    VictimScale,
)
from spotgpu.sim import defaults
from spotgpu.sim.engine import Engine, Priority
from spotgpu.sim.invariants import InvariantChecker
from spotgpu.sim.lending import OwnerAgent, policy_rules
from spotgpu.sim.metrics import Metrics, summarize
from spotgpu.sim.model import Category, GpuSim, JobPhase, JobSim, NodeSim, OwnerSim, PodSim, ShadowSim
from spotgpu.sim.scenario import PolicySpec, Scenario, Workload
from spotgpu.sim.schedview import node_summary, node_views

OWNER_NAMESPACE: Final = "owners"
SPOT_QUEUE: Final = "spot"
RESERVED_QUEUE: Final = "reserved"
CONTAINER: Final = "main"
PROGRESS_STEPS: Final = 200

SchedulerFn = Callable[[Snapshot, SchedulerConfig, float], CycleResult]
EvictionPlanner = Callable[[MappingSnapshot, ContainerRef, Sequence[DeviceID], float], EvictionPlan]


def real_scheduler(snapshot: Snapshot, config: SchedulerConfig, now: float) -> CycleResult:
    """The scheduler core's cycle (imported here so that a test can pass another one)."""
    from spotgpu.scheduler import run_cycle

    return run_cycle(snapshot, config, now)


def agent_eviction_plan(
    snapshot: MappingSnapshot, owner: ContainerRef, devices: Sequence[DeviceID], at: float
) -> EvictionPlan:
    """The agent's eviction plan for a returning owner (no API or runtime view in a simulation)."""
    return plan_eviction(snapshot, owner, devices, {}, [], reason=EvictionReason.OWNER_BACK, at=at)


@dataclass(frozen=True, slots=True)
class Hooks:
    """What a caller may swap: the decision code (tests inject faulty ones), progress, a timer."""

    scheduler: SchedulerFn = real_scheduler
    plan_eviction: EvictionPlanner = agent_eviction_plan
    progress: Callable[[float], None] | None = None
    """Called with the simulated fraction done (0..1), about 200 times per run."""
    perf_counter: Callable[[], float] = time.perf_counter
    trim_snapshots: bool = True
    """Leave out of a cycle's snapshot the nodes that cannot take part in its decisions."""
    cap_pending: bool = True
    """With ``trim_snapshots``: offer only the pending spot gangs that could be placed (see
    ``Simulation._spot_candidates``)."""
    lending_log: list[Action] | None = None
    """When a list, every action of every owner's lending state machine is appended (tests)."""


# --- events -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OwnerStart:
    owner: int
    interval: int


@dataclass(frozen=True, slots=True)
class OwnerStop:
    owner: int
    interval: int


@dataclass(frozen=True, slots=True)
class IdlePoll:
    owner: int


@dataclass(frozen=True, slots=True)
class ReturnPoll:
    owner: int


@dataclass(frozen=True, slots=True)
class GuardSignal:
    owner: int


@dataclass(frozen=True, slots=True)
class EvictionDone:
    owner: int
    pods: tuple[PodRef, ...]


@dataclass(frozen=True, slots=True)
class OwnerDeadline:
    owner: int
    since: float


@dataclass(frozen=True, slots=True)
class JobArrival:
    job: int


@dataclass(frozen=True, slots=True)
class JobStart:
    job: int
    attempt: int


@dataclass(frozen=True, slots=True)
class JobFinish:
    job: int
    attempt: int


@dataclass(frozen=True, slots=True)
class PodsGone:
    job: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Requeue:
    job: int


@dataclass(frozen=True, slots=True)
class ShadowGone:
    shadow: PodRef


@dataclass(frozen=True, slots=True)
class Cycle:
    pass


@dataclass(frozen=True, slots=True)
class Tick:
    """Time-series sample, progress report and (every ``audit_every`` ticks) full audit."""

    n: int


Event = (
    OwnerStart
    | OwnerStop
    | IdlePoll
    | ReturnPoll
    | GuardSignal
    | EvictionDone
    | OwnerDeadline
    | JobArrival
    | JobStart
    | JobFinish
    | PodsGone
    | Requeue
    | ShadowGone
    | Cycle
    | Tick
)


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
        self.hooks = hooks or Hooks()
        self.lat = scenario.latencies
        self.rng = random.Random(f"{scenario.seed}:latencies")
        """Draws of the measured latencies (one stream per run, in event order)."""
        self.horizon = scenario.duration
        self.lending = policy.lending
        self.rules = policy_rules(policy.max_inactive_time, policy.lend_policy, policy.predictive, policy.guard)
        self.period = self.lat.period(scenario.cluster.nodes)
        self.engine: Engine[Event] = Engine()
        self.checker = InvariantChecker(policy.name, policy.lending, scenario.latencies)
        gpn = scenario.cluster.gpus_per_node
        self.metrics = Metrics(scenario.cluster.nodes * gpn)
        self.nodes: list[NodeSim] = []
        self.nodes_by_name: dict[str, NodeSim] = {}
        self.gpu_devices: dict[DeviceID, GpuDevice] = {}
        for n in range(scenario.cluster.nodes):
            node = NodeSim(n, NodeName(f"node-{n:05d}"))
            for i in range(gpn):
                gpu = GpuSim(DeviceID(f"GPU-{n:05d}-{i}"), i, node)
                node.gpus.append(gpu)
                self.gpu_devices[gpu.id] = GpuDevice(gpu.id, i)
            self.nodes.append(node)
            self.nodes_by_name[node.name] = node
        self.owners: list[OwnerSim] = []
        for k, slot in enumerate(workload.owners):
            node = self.nodes[slot.node]
            gpus = node.gpus[slot.first_gpu : slot.first_gpu + slot.trace.gpus]
            ref = ContainerRef(OWNER_NAMESPACE, slot.trace.name, CONTAINER)
            phase = random.Random(f"{scenario.seed}:poll:{slot.trace.name}").random() * self.lat.detect_interval
            owner = OwnerSim(k, slot.trace, ref, gpus, phase)
            for gpu in gpus:
                gpu.owner = ref
                gpu.owner_sim = owner
            self.owners.append(owner)
        self.jobs = [JobSim(i, spec) for i, spec in enumerate(workload.jobs)]
        self.job_by_group = {job.group_ref: job for job in self.jobs}
        self.pods: dict[PodRef, PodSim] = {}
        self.shadows: dict[PodRef, ShadowSim] = {}
        self.pending: dict[int, JobSim] = {}
        """Jobs waiting for placement, by index (insertion order = submission order)."""
        self.dirty: set[NodeSim] = set(self.nodes)
        self.spot_room: set[NodeSim] = set()
        self.unalloc_nodes: set[NodeSim] = set()
        self.real_room: set[NodeSim] = set()
        """Nodes with an unallocated, unused, un-nominated real GPU (room for reserved pods)."""
        self.idle_shadows: dict[PodRef, ShadowSim] = {}
        self.cycle_handle: int | None = None
        self.cycle_at = math.inf
        self.last_cycle = -math.inf
        self.nominated: dict[DeviceID, PodSim] = {}
        """Devices kept for a preempting reserved pod (no spot pod may take them)."""
        self.placed_spot: dict[int, JobSim] = {}
        """Spot gangs bound and not evicted, in bind order (the first started earliest)."""
        self.placed_sizes: dict[tuple[int, int], int] = {}
        """How many of them have each (pods, GPU milli): the victim score's normalisation maxima."""
        self.queues = (Queue(RESERVED_QUEUE, QueueType.RESERVED), Queue(SPOT_QUEUE, QueueType.SPOT))
        self.profile = {"scheduler_s": 0.0, "snapshot_s": 0.0, "apply_s": 0.0}
        self._handlers: dict[type, Callable[[Event], None]] = {
            OwnerStart: self._owner_start,  # type: ignore[dict-item]
            OwnerStop: self._owner_stop,  # type: ignore[dict-item]
            IdlePoll: self._idle_poll,  # type: ignore[dict-item]
            ReturnPoll: self._return_poll,  # type: ignore[dict-item]
            GuardSignal: self._guard_signal,  # type: ignore[dict-item]
            EvictionDone: self._eviction_done,  # type: ignore[dict-item]
            OwnerDeadline: self._owner_deadline,  # type: ignore[dict-item]
            JobArrival: self._job_arrival,  # type: ignore[dict-item]
            JobStart: self._job_start,  # type: ignore[dict-item]
            JobFinish: self._job_finish,  # type: ignore[dict-item]
            PodsGone: self._pods_gone,  # type: ignore[dict-item]
            Requeue: self._requeue,  # type: ignore[dict-item]
            ShadowGone: self._shadow_gone,  # type: ignore[dict-item]
            Cycle: self._cycle,  # type: ignore[dict-item]
            Tick: self._tick,  # type: ignore[dict-item]
        }

    # --- running --------------------------------------------------------------------------
    def run(self) -> PolicyRun:
        start = self.hooks.perf_counter()
        for owner in self.owners:
            for gpu in owner.gpus:
                self._touch(gpu)
            if owner.trace.active:
                self.engine.at(owner.trace.active[0][0], OwnerStart(owner.index, 0))
            if self.lending:
                owner.agent = OwnerAgent(
                    owner.ref, owner.devices, self.rules, 0.0, covered=self.policy.guard, log=self.hooks.lending_log
                )
                self._arm_idle_check(owner)
        for job in self.jobs:
            self.engine.at(job.arrival, JobArrival(job.index))
        audit_every = max(defaults.AUDIT_INTERVAL_S, self.horizon / defaults.AUDITS_PER_RUN)
        self.ticks_per_audit = max(1, round(audit_every / self._tick_interval()))
        self.engine.at(0.0, Tick(0), Priority.CHECK)
        metrics = self.metrics
        handlers = self._handlers
        engine = self.engine

        def handle(event: Event) -> None:
            metrics.advance(engine.now)
            handlers[type(event)](event)

        engine.run(handle, self.horizon)
        metrics.advance(self.horizon)
        self._finish()
        self.profile["total_s"] = self.hooks.perf_counter() - start
        self.profile["events"] = float(engine.processed)
        summary = self._summary()
        return PolicyRun(self.policy, summary, metrics, self.profile)

    def _tick_interval(self) -> float:
        return min(self.scenario.sample_interval, self.horizon / PROGRESS_STEPS)

    def _tick(self, event: Tick) -> None:
        now = self.engine.now
        interval = self._tick_interval()
        if event.n % max(1, round(self.scenario.sample_interval / interval)) == 0:
            self.metrics.sample(now)
        if event.n % self.ticks_per_audit == 0 and event.n:
            self._refresh_nodes()
            self.checker.audit(now, self.nodes, self.pods.values())
        if self.hooks.progress is not None:
            self.hooks.progress(now / self.horizon)
        nxt = (event.n + 1) * interval
        if nxt <= self.horizon:
            self.engine.at(nxt, Tick(event.n + 1), Priority.CHECK)

    def _finish(self) -> None:
        now = self.horizon
        for job in self.jobs:
            if job.phase is JobPhase.RUNNING and job.spot and job.started_at is not None:
                self.metrics.useful_spot_gpu_s += (now - job.started_at) * job.spec.gpus
            if job.first_start is None and job.arrival <= now:
                self.metrics.censor(job.spot, now - job.arrival)
        self._refresh_nodes()
        self.checker.audit(now, self.nodes, self.pods.values())
        self.metrics.sample(now)

    def _summary(self) -> dict[str, object]:
        p = self.policy
        spot = [j for j in self.jobs if j.spot]
        reserved = [j for j in self.jobs if not j.spot]
        out: dict[str, object] = {
            "name": p.name,
            "lending": p.lending,
            "strategy": p.strategy.value,
            "max_inactive_time_s": p.max_inactive_time if p.lending else None,
            "lend_policy": p.lend_policy.value if p.lending else None,
            "guard": p.guard,
        }
        out.update(summarize(self.metrics, self.horizon))
        out.update(
            {
                "spot_jobs_submitted": len(spot),
                "spot_jobs_started": sum(1 for j in spot if j.first_start is not None),
                "spot_jobs_completed": sum(1 for j in spot if j.phase is JobPhase.DONE),
                "spot_jobs_evicted": sum(1 for j in spot if j.evictions),
                "spot_jobs_pending_at_end": sum(
                    1 for j in spot if j.phase is JobPhase.PENDING and j.arrival <= self.horizon
                ),
                "reserved_jobs_submitted": len(reserved),
                "reserved_jobs_completed": sum(1 for j in reserved if j.phase is JobPhase.DONE),
                "scheduler_cycles": self.metrics.cycles,
                "invariant_checks": self.checker.checks,
            }
        )
        return out

    # --- owners and the agent -------------------------------------------------------------
    def _next_poll(self, owner: OwnerSim, t: float) -> float:
        d = self.lat.detect_interval
        k = math.ceil((t - owner.poll_phase) / d - 1e-9)
        return owner.poll_phase + max(0, k) * d

    def _last_poll_before(self, owner: OwnerSim, t: float) -> float:
        d = self.lat.detect_interval
        k = math.ceil((t - owner.poll_phase) / d - 1e-9) - 1
        return owner.poll_phase + k * d

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

    def _owner_start(self, event: OwnerStart) -> None:
        owner = self.owners[event.owner]
        now = self.engine.now
        owner.active = True
        owner.interval = event.interval
        owner.active_end = owner.trace.active[event.interval][1]
        if owner.active_end < self.horizon:
            self.engine.at(owner.active_end, OwnerStop(owner.index, event.interval))
        for gpu in owner.gpus:
            self._touch(gpu)
        if owner.idle_check is not None:
            self.engine.cancel(owner.idle_check)
            owner.idle_check = None
        if not self.lending or owner.lend is not LendState.LENT:
            return
        self.metrics.returns_while_lent += 1
        owner.hold_start = now
        delay: float
        if self.policy.guard:
            delay = self.lat.guard_signal.sample(self.rng)
            self.engine.at(now + delay, GuardSignal(owner.index), Priority.AGENT)
        else:
            poll = self._next_poll(owner, now)
            self.engine.at(poll, ReturnPoll(owner.index), Priority.AGENT)
            delay = poll - now
        bound = self.checker.return_bound(owner, delay, self.policy.guard)
        self.engine.at(now + bound + 1e-6, OwnerDeadline(owner.index, now), Priority.CHECK)

    def _owner_stop(self, event: OwnerStop) -> None:
        owner = self.owners[event.owner]
        now = self.engine.now
        owner.active = False
        for gpu in owner.gpus:
            self._touch(gpu)
        nxt = event.interval + 1
        if nxt < len(owner.trace.active):
            self.engine.at(owner.trace.active[nxt][0], OwnerStart(owner.index, nxt))
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

    def _arm_idle_check(self, owner: OwnerSim) -> None:
        agent = owner.agent
        if agent is None or owner.idle_check is not None or owner.active or owner.lend is not LendState.ACTIVE:
            return
        due = agent.judge_at()
        if due > self.horizon:
            return
        at = self._next_poll(owner, max(self.engine.now, due))
        while at < due or at - agent.state.last_active < self.policy.max_inactive_time:  # floating-point rounding
            at = math.nextafter(at, math.inf)
        if at <= self.engine.now and agent.state.judged:
            at = self._next_poll(owner, self.engine.now + self.lat.detect_interval / 2)  # judged now: the next poll
        if at <= self.horizon:
            owner.idle_check = self.engine.at(at, IdlePoll(owner.index), Priority.AGENT)

    def _idle_poll(self, event: IdlePoll) -> None:
        owner = self.owners[event.owner]
        owner.idle_check = None
        if owner.active or owner.lend is not LendState.ACTIVE:
            return
        self._poll(owner, self.engine.now, owner_active=False)
        if owner.lend is LendState.ACTIVE:
            self._arm_idle_check(owner)  # not lent (refused): judged again when that can change

    def _lend(self, owner: OwnerSim) -> None:
        self.metrics.loans += 1
        self.metrics.lent_gpus += len(owner.gpus)
        self.dirty.add(owner.gpus[0].node)
        self._want_cycle()

    def _guard_signal(self, event: GuardSignal) -> None:
        owner = self.owners[event.owner]
        if owner.lend is not LendState.LENT:
            return
        assert owner.agent is not None
        actions = owner.agent.guard_signal(self.engine.now)
        assert any(isinstance(a, Evict) for a in actions), "a lent owner's return must start an eviction"
        self._apply_lending(owner, actions)

    def _return_poll(self, event: ReturnPoll) -> None:
        owner = self.owners[event.owner]
        if owner.lend is not LendState.LENT:
            return
        if not owner.active:
            # The poll came after the owner had stopped again: polling missed this return. The
            # sharing ended with the owner's activity; the next return will be polled again.
            if owner.hold_start is not None:
                self.metrics.exposures_ms.append((owner.active_end - owner.hold_start) * 1000)
                owner.hold_start = None
            return
        actions = self._poll(owner, self.engine.now, owner_active=True)
        assert any(isinstance(a, Evict) for a in actions), f"a lent owner's working poll produced {actions}"

    def idle_forecast(self, node: NodeSim) -> dict[DeviceID, tuple[int, int]]:
        """``{real device id: (expected, p20)}``: the idle remainder the agent of ``node`` would
        publish now (``spotgpu.io/idle-forecast``) for its lent GPUs."""
        now = self.engine.now
        out: dict[DeviceID, tuple[int, int]] = {}
        for owner in {g.owner_sim for g in node.gpus if g.owner_sim is not None and g.owner_sim.agent is not None}:
            assert owner.agent is not None
            out.update(owner.agent.forecast(now))
        return out

    def _mapping(self, owner: OwnerSim) -> MappingSnapshot:
        devices = tuple(DeviceEntry(g.id, tuple(sorted({u.ref for u in g.users}))) for g in owner.gpus)
        return MappingSnapshot((OwnerEntry(owner.ref, devices),))

    def _start_eviction(self, owner: OwnerSim) -> None:
        now = self.engine.now
        self.metrics.lent_gpus -= len(owner.gpus)
        self.dirty.add(owner.gpus[0].node)
        plan = self.hooks.plan_eviction(self._mapping(owner), owner.ref, owner.devices, now)
        victims = tuple(v.pod for v in plan.victims)
        if victims:
            self.metrics.returns_with_eviction += 1
        self.engine.at(now + self.lat.kill(len(victims), self.rng), EvictionDone(owner.index, victims), Priority.AGENT)

    def _eviction_done(self, event: EvictionDone) -> None:
        owner = self.owners[event.owner]
        now = self.engine.now
        for ref in event.pods:
            pod = self.pods.get(ref)
            if pod is not None and not pod.killed:
                self._evict_job(pod.job, EvictionReason.OWNER_BACK)
        if owner.hold_start is not None:
            if self.policy.guard:
                hold = now + self.lat.guard_release.sample(self.rng) - owner.hold_start
                if hold > self.lat.fail_open_timeout:
                    self.metrics.exposures_ms.append((hold - self.lat.fail_open_timeout) * 1000)
                    hold = self.lat.fail_open_timeout
                self.metrics.holds_ms.append(hold * 1000)
            else:
                self.metrics.exposures_ms.append((now - owner.hold_start) * 1000)
            owner.hold_start = None
        assert owner.agent is not None
        self._apply_lending(owner, owner.agent.eviction_done(now))
        self.dirty.add(owner.gpus[0].node)
        self._arm_idle_check(owner)

    def _owner_deadline(self, event: OwnerDeadline) -> None:
        self.checker.owner_deadline(self.engine.now, self.owners[event.owner], event.since)

    # --- jobs -----------------------------------------------------------------------------
    def _new_pods(self, job: JobSim) -> None:
        ns = job.group_ref.namespace
        job.pods = []
        for i, gpus in enumerate(job.spec.pod_gpus):
            ref = PodRef(ns, f"{job.spec.name}-{job.attempt}-{i}")
            request = GPURequest.spot(gpus) if job.spot else GPURequest.reserved(gpus)
            pod = PodSim(job, ref, request)
            job.pods.append(pod)
            self.pods[ref] = pod
        job.phase = JobPhase.PENDING
        job.pod_phase = PodGroupPhase.PENDING
        job.cached_group = None
        job.submitted_at = self.engine.now
        self.pending[job.index] = job
        self._want_cycle()

    def _job_arrival(self, event: JobArrival) -> None:
        self._new_pods(self.jobs[event.job])

    def _requeue(self, event: Requeue) -> None:
        job = self.jobs[event.job]
        job.attempt += 1
        self._new_pods(job)

    def _job_start(self, event: JobStart) -> None:
        job = self.jobs[event.job]
        if event.attempt != job.attempt or job.phase is not JobPhase.BOUND:
            return
        now = self.engine.now
        job.phase = JobPhase.RUNNING
        job.started_at = now
        if job.first_start is None:
            job.first_start = now
            (self.metrics.spot_waits if job.spot else self.metrics.reserved_waits).append(now - job.arrival)
        job.completion = self.engine.at(now + job.remaining, JobFinish(job.index, job.attempt))
        for pod in job.pods:
            for gpu in pod.gpus:
                self._touch(gpu)

    def _job_finish(self, event: JobFinish) -> None:
        job = self.jobs[event.job]
        if event.attempt != job.attempt or job.phase is not JobPhase.RUNNING:
            return
        now = self.engine.now
        if job.spot:
            self.metrics.useful_spot_gpu_s += job.remaining * job.spec.gpus
            self.metrics.spot_jcts.append(now - job.arrival)
        else:
            self.metrics.reserved_jcts.append(now - job.arrival)
        job.remaining = 0.0
        job.phase = JobPhase.DONE
        job.done_at = now
        job.completion = None
        self._remove_pods(job)

    def _evict_job(self, job: JobSim, reason: EvictionReason) -> None:
        """Tear the whole gang down now: its work stops, its pods go away after the teardown."""
        if job.phase in (JobPhase.EVICTED, JobPhase.DONE):
            return
        now = self.engine.now
        if job.phase is JobPhase.PENDING:
            raise self.checker.fail(now, f"eviction of job {job.spec.name}, which has no placed pod")
        for pod in job.pods:
            self.checker.evict_allowed(now, pod)
        if job.phase is JobPhase.RUNNING:
            assert job.started_at is not None
            elapsed = now - job.started_at
            step = self.scenario.checkpoint_interval
            saved = min(job.remaining, math.floor(elapsed / step) * step) if step > 0 else 0.0
            gpus = job.spec.gpus
            self.metrics.useful_spot_gpu_s += saved * gpus
            self.metrics.checkpointed_spot_gpu_s += saved * gpus
            self.metrics.wasted_spot_gpu_s += (elapsed - saved) * gpus
            job.remaining -= saved
        if job.completion is not None:
            self.engine.cancel(job.completion)
            job.completion = None
        job.phase = JobPhase.EVICTED
        self._unplaced(job)
        job.evictions.append(reason)
        self.metrics.eviction(reason, len(job.pods))
        for pod in job.pods:
            pod.killed = True
            pod.evicting = True
            pod.cached = None
            for gpu in pod.gpus:
                self._touch(gpu)
            if pod.node is not None:
                self.dirty.add(pod.node)  # its preemption key: these GPUs are being freed
        self.engine.at(now + self.lat.gang_teardown, PodsGone(job.index, job.attempt), Priority.CONTROLLER)

    def _pods_gone(self, event: PodsGone) -> None:
        job = self.jobs[event.job]
        if event.attempt != job.attempt or job.phase is not JobPhase.EVICTED:
            return
        self._remove_pods(job)
        if job.spot:
            if self.lat.requeue_delay > 0:
                self.engine.at(self.engine.now + self.lat.requeue_delay, Requeue(job.index), Priority.CONTROLLER)
            else:
                job.attempt += 1
                self._new_pods(job)

    def _unplaced(self, job: JobSim) -> None:
        """``job`` no longer counts among the running spot gangs (evicted or done)."""
        if self.placed_spot.pop(job.index, None) is not None:
            size = (len(job.pods), job.spec.gpus * GPU_MILLI)
            left = self.placed_sizes[size] - 1
            if left:
                self.placed_sizes[size] = left
            else:
                del self.placed_sizes[size]

    def victim_scale(self) -> VictimScale:
        """The victim score's normalisation over every running spot gang (for trimmed snapshots).

        The scheduler's facts per gang are its placed pods not being evicted, their GPU milli and
        its earliest pod start; in the model a bound spot gang has all its pods placed, started at
        ``bound_at``, until it is evicted (pods evicting) or done.
        """
        first = next(iter(self.placed_spot.values()), None)
        return VictimScale(
            tasks=max((t for t, _ in self.placed_sizes), default=0),
            milli=max((m for _, m in self.placed_sizes), default=0),
            earliest_start=first.bound_at if first is not None else None,
        )

    def _remove_pods(self, job: JobSim) -> None:
        now = self.engine.now
        self._unplaced(job)
        for pod in job.pods:
            for gpu in pod.gpus:
                if job.spot:
                    gpu.users.remove(pod)
                    shadow = gpu.shadow
                    if shadow is not None and not shadow.deleting and all(not g.users for g in shadow.gpus):
                        # The scheduler deletes a ShadowPod without users once it is shadowGcGrace
                        # old; a cluster's scheduler cycles anyway, so ask for one then.
                        self.idle_shadows[shadow.ref] = shadow
                        grace = self.scenario.scheduler.shadow_gc_grace
                        self._want_cycle(max(now, shadow.created_at + grace), force=True)
                else:
                    gpu.owner = None
                    gpu.reserved_pod = None
                self.dirty.add(gpu.node)
                self._touch(gpu)
            if pod.nominated is not None:
                self._clear_nomination(pod)
            pod.gpus = []
            pod.node = None
            del self.pods[pod.ref]
        job.pods = []
        self._want_cycle()

    def _shadow_gone(self, event: ShadowGone) -> None:
        shadow = self.shadows.pop(event.shadow)
        self.idle_shadows.pop(shadow.ref, None)
        now = self.engine.now
        for gpu in shadow.gpus:
            self.checker.shadow_gone(now, gpu)
            gpu.owner = None
            gpu.shadow = None
            self._touch(gpu)
        self.dirty.add(shadow.node)
        self._want_cycle()

    # --- GPU categories -------------------------------------------------------------------
    def _touch(self, gpu: GpuSim) -> None:
        """Recompute what ``gpu`` is doing after a change, for the metrics."""
        spot = gpu.running_spot()
        if gpu.reserved_pod is not None:
            cat = Category.RESERVED
        elif gpu.owner_sim is not None:
            if gpu.owner_sim.active:
                cat = Category.SPOT_EXPOSED if spot else Category.OWNER_ACTIVE
            else:
                cat = Category.SPOT_LENT if spot else Category.OWNER_IDLE
        elif spot:
            cat = Category.SPOT_UNALLOCATED
        elif gpu.shadow is not None:
            cat = Category.SHADOW_IDLE
        else:
            cat = Category.FREE
        if cat is not gpu.category:
            self.metrics.move(gpu.category, cat)
            gpu.category = cat

    # --- scheduling -----------------------------------------------------------------------
    def _want_cycle(self, at: float | None = None, force: bool = False) -> None:
        """Ask for a cycle (at ``at`` or as soon as the period allows), when there is work for one."""
        if not force and not self.pending:
            return
        now = self.engine.now
        when = max(now if at is None else at, self.last_cycle + self.period)
        if when >= self.cycle_at or when > self.horizon:
            return
        if self.cycle_handle is not None:
            self.engine.cancel(self.cycle_handle)
        self.cycle_handle = self.engine.at(when, Cycle(), Priority.SCHEDULER)
        self.cycle_at = when

    def _refresh_nodes(self) -> None:
        for node in self.dirty:
            self._rebuild_node(node)
        self.dirty.clear()

    def _twin_health(self, node: NodeSim) -> dict[DeviceID, Health]:
        """The agent's twin health for ``node``, recomputed only when its inputs changed."""
        key = tuple(
            (g.owner, g.owner_sim.lend if g.owner_sim is not None and self.lending else None, g.shadow is not None)
            for g in node.gpus
        )
        if key == node.health_key and node.health is not None:
            return node.health
        lend_states: dict[ContainerRef, LendState] = {}
        shadows: set[ContainerRef] = set()
        table: dict[Owner, list[DeviceEntry]] = {}
        for gpu in node.gpus:
            if gpu.owner_sim is not None:
                lend_states[gpu.owner_sim.ref] = gpu.owner_sim.lend if self.lending else LendState.ACTIVE
            elif gpu.shadow is not None and gpu.owner is not None:
                shadows.add(gpu.owner)
            owner: Owner = gpu.owner if gpu.owner is not None else IDLE_SPACE
            # Twin health depends on owners only; users are left out of this mapping.
            table.setdefault(owner, []).append(DeviceEntry(gpu.id, ()))
        mapping = MappingSnapshot(tuple(OwnerEntry(o, tuple(d)) for o, d in table.items()))
        devices = [self.gpu_devices[g.id] for g in node.gpus]
        node.health = twin_health(devices, mapping, lend_states, frozenset(shadows))
        node.health_key = key
        return node.health

    def _rebuild_node(self, node: NodeSim) -> None:
        """Refresh a changed node: twin health (the agent's rule), its scheduler object, and its
        indexes from the scheduler's own per-node summary (:mod:`spotgpu.sim.schedview`)."""
        health = self._twin_health(node)
        nominated = self.nominated
        views = node_views(node, health, nominated)
        summary = node_summary(views, self.lending)
        objs = []
        kind = []
        for gpu, view in zip(node.gpus, views, strict=True):
            twin = health[gpu.id]
            obj = gpu.cached
            if obj is None or obj.owner != gpu.owner or obj.twin is not twin:
                obj = gpu.cached = GPU(gpu.id, owner=gpu.owner, twin=twin)
            objs.append(obj)
            held = gpu.owner is not None
            holder = 0 if not held else 1 if gpu.shadow is not None else 2 if gpu.owner_sim is not None else 3
            shadow = view.shadow
            draining = shadow is not None and bool(shadow.deleting or shadow.nominated)
            users = gpu.users
            kind.append(
                (holder, view.twin_ok, gpu.id in nominated, draining, bool(users), sum(u.request.milli for u in users))
            )
        node.cached = Node(node.name, tuple(objs), lending=self.lending, strategy=self.policy.strategy)
        node.free_twins = summary.spot_unallocated + summary.spot_lent
        node.unallocated = summary.available
        kind.sort()
        node.kind = tuple(kind)
        node.preempt_key = (summary.top_priority, -summary.zero_cost, -summary.available)
        (self.spot_room.add if node.free_twins else self.spot_room.discard)(node)
        (self.unalloc_nodes.add if node.unallocated else self.unalloc_nodes.discard)(node)
        (self.real_room.add if summary.free else self.real_room.discard)(node)

    def _pod_obj(self, pod: PodSim) -> Pod:
        if pod.cached is None:
            job = pod.job
            pod.cached = Pod(
                pod.ref,
                job.spec.name,
                pod.request,
                CONTAINER,
                node=pod.node.name if pod.node is not None else None,
                devices=pod.devices,
                start_time=job.bound_at if pod.node is not None else None,
                evicting=pod.evicting,
                nominated=pod.nominated,
                created_at=job.submitted_at,
            )
        return pod.cached

    def _group_obj(self, job: JobSim) -> PodGroup:
        if job.cached_group is None:
            spec = job.spec
            job.cached_group = PodGroup(
                job.group_ref,
                SPOT_QUEUE if job.spot else RESERVED_QUEUE,
                min_member=len(spec.pod_gpus),
                priority=spec.reserved_priority,
                spot_priority=spec.priority,
                phase=job.pod_phase,
                created_at=job.arrival,
                checkpoint_interval=self.scenario.checkpoint_interval if job.spot else 0.0,
            )
        return job.cached_group

    def _shadow_obj(self, shadow: ShadowSim) -> ShadowPod:
        if shadow.cached is None:
            shadow.cached = ShadowPod(
                shadow.ref,
                shadow.node.name,
                tuple(g.id for g in shadow.gpus),
                CONTAINER,
                group=shadow.group,
                created_at=shadow.created_at,
                deleting=shadow.deleting,
            )
        return shadow.cached

    def build_snapshot(self) -> Snapshot | None:
        """The snapshot for a cycle now, or None when no cycle could decide anything.

        Trimmed (the default): the nodes with room for the offered spot pods (the first of each
        node kind, :meth:`_first_per_kind`), those with room for pending reserved pods, the
        nodes nominated for them, when a reserved gang still needs victims the first
        ``pods + preemptCandidateNodes`` nodes in the scheduler's documented preemption order
        (lowest top spot priority, most GPUs free without victims, most reclaimable), the nodes
        of ShadowPods due for collection, and every node of a gang running on any of these.
        """
        self._refresh_nodes()
        now = self.engine.now
        pending = list(self.pending.values())
        gc_due = [
            s for s in self.idle_shadows.values() if now - self.scenario.scheduler.shadow_gc_grace >= s.created_at
        ]
        if not self.hooks.trim_snapshots:
            if not pending and not gc_due:
                return None
            nodes = list(self.nodes)
            jobs = pending
        else:
            spot_in = (
                self._spot_candidates(pending)
                if self.hooks.cap_pending
                else sorted((j for j in pending if j.spot), key=lambda j: (j.arrival, j.spec.name))
            )
            reserved_in = [j for j in pending if not j.spot]
            if not spot_in and not reserved_in and not gc_due:
                return None
            jobs = spot_in + reserved_in
            spot_pods = sum(len(j.pods) for j in spot_in)
            reserved_pods = sum(len(j.pods) for j in reserved_in)
            chosen: set[NodeSim] = set()
            if spot_in:
                chosen |= self._first_per_kind(self.spot_room, spot_pods)
            if reserved_in:
                chosen |= self._first_per_kind(self.real_room, reserved_pods)
                if any(p.nominated is None for j in reserved_in for p in j.pods):
                    # Victim search: the scheduler walks nodes in its preemption order and
                    # evaluates at most preemptCandidateNodes feasible ones per task. A task that
                    # is already nominated (its victims are going) is settled on its node at zero
                    # cost first, so only gangs with un-nominated pods need the candidates.
                    budget = reserved_pods + self.scenario.scheduler.preempt_candidate_nodes
                    chosen.update(sorted(self.unalloc_nodes, key=lambda n: (n.preempt_key, n.index))[:budget])
            for job in reserved_in:
                for pod in job.pods:
                    if pod.nominated is not None:
                        chosen.add(self.nodes_by_name[pod.nominated.node])
            chosen.update(s.node for s in gc_due)
            nodes = self._closure(chosen)
        return self._snapshot_of(nodes, jobs, now)

    def _snapshot_of(self, nodes: list[NodeSim], jobs: list[JobSim], now: float) -> Snapshot:
        """The snapshot of ``nodes`` (with every pod and ShadowPod on them) and pending ``jobs``."""
        # Keyed by the model's objects (identity hashing); every order below is deterministic:
        # nodes by index, their GPUs in order, pending jobs in submission order.
        pods: dict[PodSim, Pod] = {}
        groups: dict[JobSim, PodGroup] = {}
        shadows: dict[ShadowSim, ShadowPod] = {}
        node_objs = []
        for node in nodes:
            assert node.cached is not None
            forecast = self.node_idle_forecast(node, now)
            node_objs.append(dataclasses.replace(node.cached, idle_forecast=forecast) if forecast else node.cached)
            for gpu in node.gpus:
                held = gpu.reserved_pod
                if held is not None and held not in pods:
                    pods[held] = self._pod_obj(held)
                    if held.job not in groups:
                        groups[held.job] = self._group_obj(held.job)
                for user in gpu.users:
                    if user not in pods:
                        pods[user] = self._pod_obj(user)
                        if user.job not in groups:
                            groups[user.job] = self._group_obj(user.job)
                shadow = gpu.shadow
                if shadow is not None and shadow not in shadows:
                    shadows[shadow] = self._shadow_obj(shadow)
        for job in jobs:
            groups[job] = self._group_obj(job)
            for pod in job.pods:
                pods[pod] = self._pod_obj(pod)
        self.metrics.snapshot_nodes += len(node_objs)
        self.metrics.snapshot_groups += len(groups)
        # A trimmed snapshot leaves running spot gangs out: victims are scored as in the full one.
        scale = self.victim_scale() if self.hooks.trim_snapshots else None
        return Snapshot(
            tuple(node_objs),
            self.queues,
            tuple(groups.values()),
            tuple(pods.values()),
            tuple(shadows.values()),
            scale,
        )

    def node_idle_forecast(self, node: NodeSim, now: float) -> Mapping[DeviceID, IdleForecast]:
        """Hook: the agent's idle forecast for ``node``'s lent GPUs at ``now`` (real device ID ->
        :class:`~spotgpu.scheduler.model.IdleForecast`), what ``spotgpu.io/idle-forecast`` carries
        in a cluster. Empty for now: every lent GPU's forecast is unknown, so spot gangs with a
        ``min_lease`` use only unallocated GPUs and placement is as without forecasts.

        The lending model fills it per GPU. Forecasts change with time, so they are attached to the
        node objects per snapshot, not cached; once they are not empty, the node kinds of
        :meth:`_first_per_kind` must include the forecast buckets (:mod:`spotgpu.scheduler.lease`)
        for trimmed snapshots to stay exact.
        """
        del node, now
        return {}

    def _spot_candidates(self, pending: list[JobSim]) -> list[JobSim]:
        """Pending spot gangs that a cycle could place now.

        A gang needs at least its GPUs in free Healthy twins, and a node with room for its
        largest pod. Gangs of one *class* (same spot priority and pod sizes) are ordered by the
        scheduler by age alone (its job order is priority, nomination, creation time, name), and
        a spot gang frees nothing for the next one, so once one of a class fails the later ones
        fail too; and at most ``free // gpus`` of a class can be placed. Only those oldest ones
        are offered.
        """
        free_total = sum(n.free_twins for n in self.spot_room)
        free_max = max((n.free_twins for n in self.spot_room), default=0)
        taken: dict[tuple[object, tuple[int, ...]], int] = {}
        out = []
        for job in sorted((j for j in pending if j.spot), key=lambda j: (j.arrival, j.spec.name)):
            spec = job.spec
            if spec.gpus > free_total or max(spec.pod_gpus) > free_max:
                continue
            key = (spec.priority, spec.pod_gpus)
            n = taken.get(key, 0)
            if n < free_total // spec.gpus:
                taken[key] = n + 1
                out.append(job)
        return out

    @staticmethod
    def _first_per_kind(candidates: set[NodeSim], cap: int) -> set[NodeSim]:
        """The first ``cap`` candidate nodes (in snapshot order) of each node *kind*.

        A kind is the multiset of per-GPU states (holder, twin health, nomination, ShadowPod
        draining or being deleted, users, milli):
        a refinement of the scheduler's node class, whose members it tries in snapshot order
        (a node that changes class during the cycle goes to the end of its new class). Each
        placement moves its node to another class, so a cycle with ``cap`` pending pods can
        reach at most the first ``cap`` nodes of a kind.
        """
        kinds: dict[tuple[object, ...], list[NodeSim]] = {}
        for node in candidates:
            kinds.setdefault(node.kind, []).append(node)
        chosen: set[NodeSim] = set()
        for members in kinds.values():
            if len(members) > cap:
                members.sort(key=lambda n: n.index)
                del members[cap:]
            chosen.update(members)
        return chosen

    def _closure(self, chosen: set[NodeSim]) -> list[NodeSim]:
        """``chosen`` plus the nodes of every gang with a pod on them (gangs are whole in a snapshot)."""
        out = set(chosen)
        todo = list(chosen)
        seen_jobs: set[int] = set()
        while todo:
            node = todo.pop()
            for gpu in node.gpus:
                for pod in (gpu.reserved_pod, *gpu.users):
                    if pod is None or pod.job.index in seen_jobs:
                        continue
                    seen_jobs.add(pod.job.index)
                    for sibling in pod.job.pods:
                        if sibling.node is not None and sibling.node not in out:
                            out.add(sibling.node)
                            todo.append(sibling.node)
        return sorted(out, key=lambda n: n.index)

    def _cycle(self, _: Cycle) -> None:
        now = self.engine.now
        self.cycle_handle = None
        self.cycle_at = math.inf
        self.last_cycle = now
        clock = self.hooks.perf_counter
        t0 = clock()
        snapshot = self.build_snapshot()
        t1 = clock()
        self.profile["snapshot_s"] += t1 - t0
        if snapshot is None:
            self.metrics.cycles_skipped += 1
        else:
            result = self.hooks.scheduler(snapshot, self.scenario.scheduler, now)
            t2 = clock()
            self.profile["scheduler_s"] += t2 - t1
            self.metrics.cycles += 1
            self._apply(result, snapshot)
            self.profile["apply_s"] += clock() - t2
        # A ShadowPod without users that is not old enough yet gets its cycle when it is.
        grace = self.scenario.scheduler.shadow_gc_grace
        later = [s.created_at + grace for s in self.idle_shadows.values() if s.created_at + grace > now]
        if later:
            self._want_cycle(min(later), force=True)

    # --- applying decisions ---------------------------------------------------------------
    def _apply(self, result: CycleResult, snapshot: Snapshot) -> None:
        """Act out a cycle's decisions in the model, with their latencies.

        First the model-level applier (:class:`spotgpu.scheduler.apply.ModelApplier`, the one
        statement of what each decision does) checks them against the snapshot they were made
        from: a decision naming a pod, device or PodGroup the snapshot does not have fails the run.
        What it does not judge (double booking, twin health, evicting reserved work) the
        invariant checker catches as the model changes.
        """
        now = self.engine.now
        try:
            ModelApplier(snapshot, now, evicted="evicting").apply(result)
        except ApplyError as exc:
            raise self.checker.fail(now, str(exc)) from None
        for evict in result.evictions:
            pod = self.pods[evict.pod]
            self.checker.evict_allowed(now, pod)
            if not pod.evicting:
                self._evict_job(pod.job, evict.reason)
        for delete in result.shadow_deletions:
            shadow = self.shadows.get(delete.pod)
            if shadow is None or shadow.deleting:
                continue
            shadow.deleting = True
            shadow.cached = None
            self.dirty.add(shadow.node)
            self.idle_shadows.pop(shadow.ref, None)
            self.engine.at(now + self.lat.shadow_release, ShadowGone(shadow.ref), Priority.CONTROLLER)
        for clear in result.cleared_nominations:
            cleared = self.pods.get(clear.pod)  # an evicted pod may be gone
            if cleared is not None and cleared.nominated is not None:
                self._clear_nomination(cleared)
        for nominate in result.nominations:
            pod = self.pods[nominate.pod]
            if pod.nominated is not None:
                self._clear_nomination(pod)
            pod.nominated = Nomination(nominate.node, nominate.devices)
            pod.cached = None
            for device in nominate.devices:
                self.nominated[device] = pod
            self.dirty.add(self.nodes_by_name[nominate.node])
        for create in result.shadow_creations:
            self._create_shadow(create)
        placed: dict[int, JobSim] = {}
        for bind in result.binds:
            job = self._bind(bind)
            placed[job.index] = job
        for job in placed.values():
            if job.phase is JobPhase.PENDING and job.placed():
                self._job_bound(job)
        for status in result.statuses:
            target = self.job_by_group[status.group]
            if target.pod_phase is not status.phase:
                target.pod_phase = status.phase
                target.cached_group = None

    def _clear_nomination(self, pod: PodSim) -> None:
        assert pod.nominated is not None
        for device in pod.nominated.devices:
            if self.nominated.get(device) is pod:
                del self.nominated[device]
        self.dirty.add(self.nodes_by_name[pod.nominated.node])
        pod.nominated = None
        pod.cached = None

    def _create_shadow(self, create: CreateShadowPod) -> None:
        """Create a ShadowPod (its devices are on its node: the model-level applier checked)."""
        now = self.engine.now
        node = self.nodes_by_name[create.node]
        by_id = {g.id: g for g in node.gpus}
        gpus = []
        for device in create.devices:
            gpu = by_id[device]
            self.checker.real_alloc(now, gpu, f"ShadowPod {create.pod}")
            gpus.append(gpu)
        shadow = ShadowSim(create.pod, node, gpus, create.group, now)
        for gpu in gpus:
            gpu.owner = create.container_ref
            gpu.shadow = shadow
            self._touch(gpu)
        self.shadows[create.pod] = shadow
        self.dirty.add(node)

    def _bind(self, bind: Bind) -> JobSim:
        """Bind (checked by the model-level applier: a pending pod, devices on the node, device owners)."""
        now = self.engine.now
        pod = self.pods[bind.pod]
        node = self.nodes_by_name[bind.node]
        by_id = {g.id: g for g in node.gpus}
        gpus = [by_id[device] for device in bind.devices]
        if bind.spot:
            for gpu in gpus:
                self.checker.spot_bind(now, pod, gpu, bind.milli)
                gpu.users.append(pod)
                if gpu.shadow is not None:
                    self.idle_shadows.pop(gpu.shadow.ref, None)
        else:
            container = pod.ref.container(CONTAINER)
            for gpu in gpus:
                self.checker.real_alloc(now, gpu, f"reserved pod {bind.pod}")
                gpu.owner = container
                gpu.reserved_pod = pod
        pod.node = node
        pod.gpus = gpus
        pod.cached = None
        if pod.nominated is not None:
            self._clear_nomination(pod)
        for gpu in gpus:
            self._touch(gpu)
        self.dirty.add(node)
        self.metrics.binds += 1
        return pod.job

    def _job_bound(self, job: JobSim) -> None:
        now = self.engine.now
        job.phase = JobPhase.BOUND
        job.bound_at = now
        for pod in job.pods:
            pod.cached = None
        del self.pending[job.index]
        if job.spot:
            self.placed_spot[job.index] = job
            size = (len(job.pods), job.spec.gpus * GPU_MILLI)
            self.placed_sizes[size] = self.placed_sizes.get(size, 0) + 1
        start = (self.lat.spot_start if job.spot else self.lat.reserved_start).sample(self.rng)
        event = JobStart(job.index, job.attempt)
        if start > 0:
            job.completion = self.engine.at(now + start, event)
        else:
            self._job_start(event)


def run_policy(scenario: Scenario, workload: Workload, policy: PolicySpec, hooks: Hooks | None = None) -> PolicyRun:
    """Simulate ``policy`` on ``workload``; raises InvariantViolation if the model breaks a promise."""
    return Simulation(scenario, workload, policy, hooks).run()


__all__ = ["Hooks", "PolicyRun", "Simulation", "agent_eviction_plan", "real_scheduler", "run_policy"]
