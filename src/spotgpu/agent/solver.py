"""The solver: the agent's locked coordinator of the lending state machine and its executors.

Decisions come from :mod:`spotgpu.core.lending` (one owner's lend / return life:
``transition(state, event, now, rules) -> (state, actions)``, the same function the simulator
runs) and :mod:`spotgpu.agent.model` (mapping, twin health, violations, eviction plans). This
module holds the node's state, turns what it learns into state-machine events and applies the
actions through small executors:

* :class:`~spotgpu.agent.evictor.Evictor`: stop + verify the spot tasks, release the owner,
  delete the pods;
* :class:`~spotgpu.agent.allocator.Allocator`: GetPreferredAllocation / Allocate, steering and
  the grants;
* :class:`~spotgpu.agent.publisher.Publisher`: twin health to the device plugins, metrics and
  the node annotations (state and idle forecast);
* :class:`~spotgpu.agent.persistence.RecordKeeper`: the lending record.

Actions are applied in their order under the lock, except the ones that do I/O off the owner's
path: :class:`~spotgpu.core.lending.Publish` is applied once at the end of the locked section
(after any earlier :class:`~spotgpu.core.lending.Persist`), a trailing ``Persist`` and the
node events after the lock is released, and :class:`~spotgpu.core.lending.Evict` by the
evictor outside the lock. When :class:`~spotgpu.core.lending.Arm` fails, the rest of its list
is skipped and :class:`~spotgpu.core.lending.ArmFailed` fed: the owner stays unlent (fail
closed) and is judged again later.

Eviction (owner back, coverage lost, or a violation), in this order:

1. the owner becomes ``evicting`` and its twins Unhealthy at once: the kubelet admits no new
   spot pod on them, and spotgpu-runtime's lend rule refuses any sync of them from now on,
   even for a spot container the kubelet restarts with an old grant;
2. for an owner's return, pod-resources is read again and the plan made from it, so a spot
   container started since the last refresh is not missed;
3. the evictor stops and verifies every spot task and runs the release check (no other process
   holds the GPUs; :mod:`spotgpu.agent.evictor`, on its raised-priority executor);
4. the MappingCache forgets the victims, the guard is disarmed: the owner's held call proceeds
   on a clean GPU (no lock of ours); then, under the lock, the owner becomes ``active`` and the
   twins are republished, and after it the lending record is written;
5. the spot pods are deleted through the Kubernetes API, after the release on purpose: the
   owner waits for clean GPUs, not for the API server, and by step 1 nothing can put spot
   work back on them.

Concurrency: one lock guards the state; ``lent`` -> ``evicting`` happens once under it (a guard
signal and a poll racing produce one eviction). Evictions run outside the lock: one owner's
eviction never delays another owner's guard signal. An owner's return takes the lock only for short sections with no I/O
(the transition, planning from the fresh read); its release takes none. :attr:`Solver.returns`
counts the owner returns from their guard signal until their eviction is complete (pods
deleted): the agent's detection waits while one is in flight (``agent.eviction.deferDetection``),
so it neither competes with the eviction nor with the released owner's first steps, and it
reads the node only after the evicted pods are gone. Every refresh hands the evictor the spot
containers on lent GPUs to pin (:meth:`~spotgpu.agent.evictor.Evictor.prepare`). Every step is
logged with the owner and the devices.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.agent.allocator import Allocator
from spotgpu.agent.detect import WatchedOwner
from spotgpu.agent.evictor import EvictionOutcome, Evictor, ReturnsInFlight, SweepFn
from spotgpu.agent.guarding import GuardExecutor
from spotgpu.agent.model import (
    EvictionPlan,
    MappingBuild,
    build_mapping,
    device_index,
    find_violations,
    owners_of,
    plan_eviction,
    twin_health,
)
from spotgpu.agent.persistence import Record, RecordKeeper, lent_evidence
from spotgpu.agent.publisher import Publisher, PublishFn
from spotgpu.agent.settings import SolverSettings
from spotgpu.agent.solver_publish import SolverPublishing
from spotgpu.core import lending
from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.clock import Clock, SystemTimer, Timer
from spotgpu.core.idle_forecast import Refusal
from spotgpu.core.lending import Action, LendRules, LendState, OwnerLending
from spotgpu.core.mapping_cache import MappingCache, MappingSnapshot, Owner
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import EvictionReason
from spotgpu.ports.guard import GuardPort
from spotgpu.ports.kube import KubePort, PodInfo
from spotgpu.ports.node import GpuDevice, LearnedOwner, LendStore, LentOwner, ReleaseCheck, RuntimeContainer, TaskPort
from spotgpu.util.priority import normal_priority

log = logging.getLogger(__name__)

STALE_VIEW = 5.0
"""Seconds after an eviction verified its spot containers stopped in which a refresh still seeing
them (read before the pods' deletion) does not evict them again; a new container is evicted."""


@dataclass
class _Effects:
    """What applying actions left to do after the lock (see module docstring)."""

    evicts: list[lending.Evict] = field(default_factory=list)
    publish: bool = False
    persist: bool = False
    events: list[tuple[str, str]] = field(default_factory=list)
    """Node events ``(reason, message)``."""
    reports: list[Action] = field(default_factory=list)
    released: Owner | None = None
    """An owner the evictor released already (its ``EvictionDone``'s Disarm is not repeated)."""


class Solver(SolverPublishing):
    """The agent's state and coordinator (see module docstring)."""

    def __init__(
        self,
        settings: SolverSettings,
        *,
        kube: KubePort,
        tasks: TaskPort,
        guard: GuardPort | None,
        publish: PublishFn,
        metrics: AgentMetrics,
        clock: Clock,
        store: LendStore | None = None,
        timer: Timer | None = None,
        release_check: ReleaseCheck | None = None,
    ) -> None:
        self._settings = settings
        self._rules = settings.rules
        self.kube = kube
        self.tasks = tasks
        self.guard = guard
        self.guards = GuardExecutor(guard, metrics=metrics)
        self.metrics = metrics
        self.clock = clock
        self.mapping = MappingCache()
        self.lock = threading.RLock()
        self._devices: tuple[GpuDevice, ...] = ()
        self._owners: dict[ContainerRef, OwnerLending] = {}
        self._since: dict[ContainerRef, float] = {}
        """Wall-clock seconds each lent owner was lent (its lending record's ``since``)."""
        self._learned_at_start: dict[ContainerRef, LearnedOwner] = {}
        self._shadow: frozenset[ContainerRef] = frozenset()
        self._evicting: set[Owner] = set()
        self._pods: dict[PodRef, PodInfo] = {}
        self._runtime: list[RuntimeContainer] = []
        self._last_tick: float | None = None
        self.allocator = Allocator(settings.pools, host=self, metrics=metrics, clock=clock)
        self.publisher = Publisher(settings.node, kube=kube, publish=publish, metrics=metrics)
        self.records = RecordKeeper(store, metrics=metrics, clock=clock)
        self.evictor = Evictor(
            tasks=tasks,
            kube=kube,
            metrics=metrics,
            clock=clock,
            timer=timer or SystemTimer(),
            mapping=self.mapping,
            release_check=release_check,
            realtime=settings.return_path.realtime,
        )
        self.returns = ReturnsInFlight()
        """Owner returns from their guard signal until their eviction is complete (see module docstring)."""
        self.evictor.on_runtime = self._set_runtime
        self.action_log: list[Action] | None = None
        """When a list, every action the state machine returned is appended (tests)."""
        self.refresh_hook: Callable[[], None] | None = None
        """Called by :meth:`allocate` when a twin's owner is unknown (re-reads pod-resources)."""
        self.fresh_allocations: Callable[[], Sequence[AllocatedDevices]] | None = None
        """Reads pod-resources now; an owner-back eviction plans from it (see :meth:`_fresh_allocations`)."""
        self.on_eviction: Callable[[EvictionOutcome], None] | None = None
        self.live_pods: Callable[[], Sequence[PodInfo]] | None = None
        """This node's pods as the pod watch knows them now, in binding order (first seen first);
        admission candidates come from here (the refresh's copy can be a detection cycle old)."""
        self.await_pods: Callable[[Callable[[Sequence[PodInfo]], bool], float], Sequence[PodInfo]] | None = None
        """``(ready, timeout) -> pods``: waits for the pod watch until ``ready(pods)`` or the timeout."""
        self.on_allocate: Callable[[], None] | None = None
        """Called after every successful Allocate (the agent refreshes soon after, so the grant
        is confirmed by pod-resources and the node annotation tells the truth quickly)."""

    @property
    def settings(self) -> SolverSettings:
        return self._settings

    @settings.setter
    def settings(self, settings: SolverSettings) -> None:
        self._settings = settings
        self._rules = settings.rules

    @property
    def rules(self) -> LendRules:
        return self._rules

    @property
    def sweep(self) -> SweepFn | None:
        """Kills what still runs on the devices for the pods; returns (killed, still running)."""
        return self.evictor.sweep

    @sweep.setter
    def sweep(self, fn: SweepFn | None) -> None:
        self.evictor.sweep = fn

    def close(self) -> None:
        self.evictor.close()

    # -- inputs ------------------------------------------------------------------------------
    def set_devices(self, devices: Sequence[GpuDevice]) -> None:
        with self.lock:
            self._devices = tuple(devices)
            self.allocator.set_devices_locked(self._devices)
            self.publish_locked()

    def refresh(
        self,
        allocations: Sequence[AllocatedDevices],
        pods: Mapping[PodRef, PodInfo],
        runtime: Sequence[RuntimeContainer] | None = None,
        *,
        recovering: bool = False,
    ) -> list[EvictionOutcome]:
        """Rebuild the mapping from the node's and cluster's view; evict spot users found on
        GPUs whose twins are not Healthy; retry pending stops and pod deletions.

        ``recovering`` (first refresh after a start): an owner whose GPUs have spot users, or
        that the lending record names, was lent before the restart and is taken as lent again
        (guard re-armed, judged by its own processes) when the guard covers it; spot users on
        any other owner's GPUs are evicted with reason ``Recovery``.
        """
        now = self.clock.monotonic()
        record = self._load_record() if recovering else None
        effects = _Effects()
        with self.lock:
            self._pods = dict(pods)
            if runtime is not None:
                self._runtime = list(runtime)
            build = self._build(allocations)
            for problem in build.problems:
                log.warning("mapping: %s", problem)
            self.metrics.forged_shadow_pods.set(len(build.forged_shadows))
            self.mapping.restore(build.snapshot)
            self.allocator.confirm_locked(allocations, self._pods, now)
            self._shadow = build.shadow_owners
            self._sync_owners(now, record, effects)
            live = {u for e in build.snapshot.owners for d in e.devices for u in d.users} | set(self._pods)
            self.evictor.prune(live, self._pods)
            plans = self._violations(build.snapshot, now, recovering, effects)
            self.publish_locked()
            lent_users = self._lent_users_locked(now)
        self._after(effects)
        self.persist()
        self.evictor.prepare(lent_users)
        outcomes = [self._run_eviction(plan) for plan in plans]
        self.evictor.retry_pending(self.settings.eviction)
        return outcomes

    def _lent_users_locked(self, now: float) -> set[str]:
        """The container IDs an owner-back eviction of each lent owner would stop now."""
        snapshot = self.mapping.snapshot()
        ids: set[str] = set()
        for owner, s in self._owners.items():
            if s.state is LendState.LENT:
                plan = plan_eviction(
                    snapshot, owner, s.devices, self._pods, self._runtime, reason=EvictionReason.OWNER_BACK, at=now
                )
                ids.update(plan.container_ids)
        return ids

    def _violations(
        self, snapshot: MappingSnapshot, now: float, recovering: bool, effects: _Effects
    ) -> list[EvictionPlan]:
        """Plans for the spot users on GPUs whose twins are not Healthy (caller holds the lock);
        their owners are ``evicting`` from now on."""
        states = {o: s.state for o, s in self._owners.items()}
        violations = find_violations(
            self._devices,
            snapshot,
            twin_health(self._devices, snapshot, states, self._shadow),
            skip_owners=frozenset(self._evicting),
            default_reason=EvictionReason.RECOVERY if recovering else EvictionReason.RESERVED_PREEMPT,
        )
        plans = []
        started = _Effects()  # its evicts are not run: the plans above are (their devices, not the owner's)
        for v in violations:
            plan = plan_eviction(
                snapshot, v.owner, v.devices, self._pods, self._runtime, reason=v.reason, at=now,
                exempt_namespaces=self.settings.exempt_namespaces,
            )  # fmt: skip
            if plan.victims and all(
                self.evictor.stopped_lately(victim.container_ids, STALE_VIEW) for victim in plan.victims
            ):
                continue  # a view read before an eviction's pod deletions: its users are dead already
            plans.append(plan)
            state = self._owners.get(v.owner) if isinstance(v.owner, ContainerRef) else None
            if state is not None:
                self._feed(state, lending.Violation(v.reason), now, started)
            self._evicting.add(v.owner)
        effects.events.extend(started.events)
        return plans

    def _sync_owners(self, now: float, record: Record | None, effects: _Effects) -> None:
        current = {o: d for o, d in owners_of(self.mapping.snapshot()).items() if o not in self._shadow}
        index = device_index(self.mapping.snapshot())
        for owner, devices in current.items():
            state = self._owners.get(owner)
            if state is None:
                learned = self._learned_at_start.pop(owner, LearnedOwner())
                state = lending.new_owner(owner, devices, now, learned.history, learned.backoff)
                self._owners[owner] = state
                if record is None:
                    log.info("new owner %s with devices %s (active)", owner, list(devices))
                    continue
                evidence = lent_evidence(owner, devices, index, record.lent.get(owner), self._container_id(owner))
                entry = record.lent.get(owner)
                lent_at = entry.since - (self.clock.time() - now) if entry is not None else None
                self._feed(
                    state, lending.Recovered(evidence is not None, self.guards.covers(owner), lent_at), now, effects
                )
                if evidence is not None and self._owners[owner].state is LendState.LENT:
                    self._since[owner] = entry.since if entry is not None else self.clock.time()
                    log.info("recovery: owner %s devices %s %s: lent again", owner, list(devices), evidence)
            elif state.devices != devices:
                log.info("owner %s devices changed %s -> %s", owner, list(state.devices), list(devices))
                self._feed(state, lending.DevicesChanged(devices), now, effects)
        for owner in [o for o in self._owners if o not in current]:
            state = self._owners[owner]
            log.info("owner %s is gone (state %s); its devices are unallocated now", owner, state.state.value)
            self._feed(state, lending.Gone(), now, effects)

    def _container_id(self, owner: ContainerRef) -> str | None:
        pod = self._pods.get(owner.pod_ref)
        if pod is None:
            return None
        return next((c.container_id for c in pod.containers if c.name == owner.name), None)

    def _set_runtime(self, runtime: list[RuntimeContainer]) -> None:
        with self.lock:
            self._runtime = runtime

    def _load_record(self) -> Record:
        record = self.records.load()
        with self.lock:
            self._learned_at_start = dict(record.learned)
        return record

    def persist(self) -> None:
        """Save which owners are lent and what they taught the model, when that changed (best
        effort; see :class:`~spotgpu.agent.persistence.RecordKeeper`)."""
        if not self.records.loaded:
            return  # not recovered yet: never overwrite the record before reading it
        with self.lock:
            lent = {
                owner: LentOwner(owner, s.devices, self._container_id(owner), self._since.get(owner, 0.0))
                for owner, s in self._owners.items()
                if s.state is LendState.LENT
            }
            learned = {
                owner: LearnedOwner(s.history, s.backoff)
                for owner, s in self._owners.items()
                if not s.history.empty or s.backoff.strikes > 0
            }
        self.records.save(Record(lent, learned))

    # -- the state machine ---------------------------------------------------------------------
    def _feed(self, state: OwnerLending, event: lending.Event, now: float, effects: _Effects) -> None:
        """Run one transition and apply its actions (caller holds the lock)."""
        after, actions = lending.transition(state, event, now, self._rules)
        self._owners[after.owner] = after
        if self.action_log is not None:
            self.action_log.extend(actions)
        owner = after.owner
        for i, action in enumerate(actions):
            if isinstance(action, lending.Arm):
                if not self.guards.arm(owner):
                    self._feed(self._owners[owner], lending.ArmFailed(), now, effects)
                    return  # the loan does not happen: skip the rest of its actions
            elif isinstance(action, lending.Disarm):
                if effects.released != owner:
                    self.guards.disarm(owner)
            elif isinstance(action, lending.Persist):
                if i + 1 < len(actions):
                    self.persist()  # on disk before what follows (a lend: before the twins turn Healthy)
                else:
                    effects.persist = True
            elif isinstance(action, lending.Publish):
                effects.publish = True
            elif isinstance(action, lending.Evict):
                self._evicting.add(owner)
                effects.evicts.append(action)
                effects.reports.append(action)
            elif isinstance(action, lending.Forget):
                self._owners.pop(owner, None)
                self._since.pop(owner, None)
            elif isinstance(action, lending.Lent):
                self._since[owner] = self.clock.time()
                log.info("owner %s idle for %.1fs on devices %s: lending", owner, action.idle_for, list(action.devices))
                effects.reports.append(action)
            elif isinstance(action, lending.NotLent):
                self._not_lent(action, effects)

    def _not_lent(self, action: lending.NotLent, effects: _Effects) -> None:
        self.metrics.not_lent.labels(reason=action.reason.value).inc()
        owner = action.owner
        if action.reason is not Refusal.UNGUARDED:
            log.info("owner %s is idle but not lent (%s)", owner, action.reason.value)
            return
        why = self.guards.why_uncovered(self._pods.get(owner.pod_ref))
        lent = self._owners.get(owner)
        ending = lent is not None and lent.state is LendState.EVICTING
        message = (
            f"owner {owner.format()}: the return guard {why}; "
            f"{'its loan ends' if ending else 'its GPUs are not lent'} (agent.lending.unguardedPolicy: refuse)"
        )
        log.warning("%s", message)
        effects.events.append(("OwnerUnguarded", message))

    def _flush_locked(self, effects: _Effects) -> None:
        if effects.publish:
            effects.publish = False
            self.publish_locked()

    def _after(self, effects: _Effects) -> None:
        """The effects that wait for the lock's release: a trailing Persist, node events."""
        if effects.persist:
            effects.persist = False
            self.persist()
        for reason, message in effects.events:
            try:
                self.kube.record_node_event(self.settings.node, reason=reason, message=message)
            except Exception as exc:  # best effort
                log.info("node event %s not recorded: %s", reason, exc)
        effects.events.clear()

    # -- detection -----------------------------------------------------------------------------
    def watched_owners(self) -> list[WatchedOwner]:
        """Owners the detector judges now (not ShadowPods, not being evicted)."""
        with self.lock:
            return [
                WatchedOwner(owner, s.devices, self._container_id(owner))
                for owner, s in sorted(self._owners.items())
                if s.state is not LendState.EVICTING
            ]

    def observe(self, samples: Mapping[ContainerRef, lending.ActivitySample]) -> list[Action]:
        """Feed one detection round; lend or evict as the state machine decides. Returns the
        loans and evictions it started (:class:`~spotgpu.core.lending.Lent`, ``Evict``)."""
        effects = _Effects()
        with self.lock:
            for owner, sample in samples.items():
                state = self._owners.get(owner)
                if state is None or state.state is LendState.EVICTING:
                    continue
                if sample.owner_process_active is None or (
                    state.state is LendState.ACTIVE and sample.utilization_active is None
                ):
                    self.metrics.detector_errors.labels(kind="unknown_sample").inc()
                self._feed(state, lending.Sample(sample, self.guards.covers(owner)), sample.at, effects)
            self._flush_locked(effects)
            self._count_unguarded()
        self._after(effects)
        if any(isinstance(a, lending.Lent) for a in effects.reports):
            self.annotate()
        for evict in effects.evicts:
            self._owner_eviction(evict)
        return effects.reports

    def _count_unguarded(self) -> None:
        unguarded = sum(1 for s in self._owners.values() if s.poll_only or s.refused is Refusal.UNGUARDED)
        self.metrics.owners_unguarded.set(unguarded)

    def owner_back(self, owner: ContainerRef) -> EvictionOutcome | None:
        """The guard caught ``owner`` starting a GPU session: evict at once (no poll wait)."""
        ticket = self.returns.enter()
        try:
            now = self.clock.monotonic()
            effects = _Effects()
            with self.lock:
                state = self._owners.get(owner)
                if state is None or state.state is LendState.ACTIVE:
                    log.info("guard: owner %s is back but nothing is lent; releasing its call", owner)
                if state is None:
                    self.guards.disarm(owner)
                    return None
                self._feed(state, lending.GuardSignal(), now, effects)
                self._flush_locked(effects)  # twins Unhealthy first: no new spot container gets these GPUs now
            self._after(effects)
            if not effects.evicts:
                return None  # not lent, or an eviction is already running (it releases the guard when done)
            return self._owner_eviction(effects.evicts[0])
        finally:
            ticket.leave()

    def _owner_eviction(self, evict: lending.Evict) -> EvictionOutcome:
        """Plan (from a fresh pod-resources read, with the container IDs the pod watch knows
        now) and run an eviction the state machine started."""
        allocations = self._fresh_allocations()
        live = {p.ref: p for p in self.live_pods()} if self.live_pods is not None else {}
        with self.lock:
            snapshot = self._build(allocations).snapshot if allocations is not None else self.mapping.snapshot()
            plan = plan_eviction(
                snapshot,
                evict.owner,
                evict.devices,
                {**self._pods, **live},  # a container ID the watch reported since the last refresh
                self._runtime,
                reason=evict.reason,
                at=evict.at,
                exempt_namespaces=self.settings.exempt_namespaces,
            )
        outcome = self._run_eviction(plan)
        with normal_priority():
            log.info(
                "owner %s %s on devices %s: evicted %d spot pod(s)",
                evict.owner,
                f"is back ({evict.source.value})" if evict.source is not None else f"({evict.reason.value})",
                list(outcome.plan.devices),
                len(outcome.plan.victims),
            )
        return outcome

    def _fresh_allocations(self) -> Sequence[AllocatedDevices] | None:
        """A pod-resources read made now, or None (no reader, or it failed).

        The cache is only as fresh as the last refresh (up to ``detectInterval`` old); a spot
        container that started since then would be missing from an eviction planned from it.
        The twins are already Unhealthy when this runs, so no user can appear after it.
        """
        if self.fresh_allocations is None:
            return None
        try:
            return self.fresh_allocations()
        except Exception as exc:  # never leave an owner stuck in 'evicting': plan from the cache
            log.warning("re-reading pod-resources before an eviction failed (planning from the cache): %s", exc)
            return None

    def _build(self, allocations: Sequence[AllocatedDevices]) -> MappingBuild:
        """The mapping ``allocations`` imply with the current devices and pods; caller holds the lock."""
        return build_mapping(
            self._devices,
            allocations,
            self._pods,
            gpu_resource=self.settings.gpu_resource,
            spot_resource=self.settings.spot_resource,
            extra_spot_resources=list(self.allocator.resources),
            shadow_namespace=self.settings.shadow_namespace,
        )

    def _run_eviction(self, plan: EvictionPlan) -> EvictionOutcome:
        try:
            outcome = self.evictor.evict(
                plan,
                self.settings.eviction,
                lambda: self._release(plan.owner),
                lambda: self._eviction_done(plan.owner),
            )
        finally:
            with normal_priority(), self.lock:  # after the release (or a failure): nobody waits on this
                self._evicting.discard(plan.owner)  # from here on, leftover users are violations again
                self.publish_locked()
        with normal_priority():
            self.persist()
            self.annotate()
            if self.on_eviction is not None:
                self.on_eviction(outcome)
        return outcome

    def _release(self, owner: Owner) -> float:
        """The guard lets the owner's held call go (no lock of ours: nothing the owner waits on
        waits behind a detection cycle); :meth:`_eviction_done` follows at once."""
        if isinstance(owner, ContainerRef):
            self.guards.disarm(owner)
        return self.clock.monotonic()

    def _eviction_done(self, owner: Owner) -> None:
        """The owner is active again (its twins stay Unhealthy; its guard was disarmed by
        :meth:`_release`).

        The lending record is written after the release, not before: no file I/O on the
        owner's wait. A crash in between leaves the owner recorded as lent; the next start then
        lends it again with the guard armed, and either its first detection round sees the
        owner on its GPUs (evicted before the device plugin registers) or the guard catches its
        next session start: a stale record costs a loan, never an unprotected owner."""
        effects = _Effects(released=owner)
        with self.lock:
            state = self._owners.get(owner) if isinstance(owner, ContainerRef) else None
            if state is not None:
                self._feed(state, lending.EvictionDone(), self.clock.monotonic(), effects)
            effects.publish = True
            self._flush_locked(effects)
        self._after(effects)


__all__ = ["Solver"]
