"""The solver: owner idle -> lend; owner back -> evict; and keeping the node consistent.

Decisions come from :mod:`spotgpu.agent.model` (pure) and
:class:`~spotgpu.core.lending.LowpowerDetector` (pure); this module holds the agent's state and
applies plans through its ports. Side effects, all through ports: the guard (arm/disarm), the
device plugin's twin list (a callable), container tasks (stop), the Kubernetes API (delete
pods, patch the node annotation) and metrics.

Lending (:class:`~spotgpu.agent.model.LendPlan`): arm the guard first (so no spot pod can run
before the owner's return is caught), then make the twins Healthy, then publish the node
annotation. If arming fails the owner stays unlent (fail closed) and is judged again later.

Eviction (:class:`~spotgpu.agent.model.EvictionPlan`), in this order:

1. the owner becomes ``evicting`` and its twins Unhealthy at once: the kubelet admits no new
   spot pod on them, and spotgpu-runtime's lend rule refuses any sync of them from now on,
   even for a spot container the kubelet restarts with an old grant;
2. for an owner's return, pod-resources is read again and the plan made from it, so a spot
   container started since the last refresh is not missed;
3. eviction metrics (reason, spot user's namespace);
4. every spot container task is stopped through containerd (SIGKILL to all processes, after
   an optional bounded SIGTERM grace) and each stop verified with Wait (containerd down: the
   containers' processes are killed through ``/proc``); containers not verified stopped are
   stopped again on every refresh;
5. the MappingCache forgets the victims, the owner is ``active`` and the guard disarmed: the
   owner's held call proceeds on a clean GPU;
6. the spot pods are deleted through the Kubernetes API (in parallel, retried within a
   bounded budget; leftovers are retried on every refresh). This comes after the release on
   purpose: the owner waits for its GPUs to be clean, not for the API server (whose latency a
   node does not control), and by step 1 nothing can put spot work back on them.

Concurrency: one lock guards all state; plans are decided under it and a state transition
(``lent`` -> ``evicting``) happens exactly once, so a guard signal and a detection poll racing
for the same owner produce one eviction. Evictions run outside the lock, so one owner's
eviction never delays another owner's guard signal. Every step is logged with the owner and
the devices.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.agent.detect import WatchedOwner
from spotgpu.agent.model import (
    AllocateRefused,
    EvictionPlan,
    LendPlan,
    LendState,
    MappingBuild,
    TwinView,
    allocate_annotations,
    build_mapping,
    device_index,
    find_violations,
    node_state_annotation,
    owners_of,
    pending_shadows,
    plan_eviction,
    runtime_container_ids,
    twin_health,
)
from spotgpu.agent.node_ports import (
    AllocatedDevices,
    GpuDevice,
    LendStore,
    LentOwner,
    RuntimeContainer,
    TaskPort,
    TaskState,
)
from spotgpu.agent.ports import GuardPort, KubePort, PodInfo
from spotgpu.agent.steer import (
    Candidate,
    DeviceUse,
    MatchResult,
    TwinKind,
    TwinPool,
    admission_candidates,
    device_use,
    in_use_of,
    match_allocation,
    pool_health,
    prefer,
    steering_mismatches,
    twin_pools,
    twin_view,
)
from spotgpu.core import keys
from spotgpu.core.clock import Clock
from spotgpu.core.errors import SpotgpuError, TemporaryError
from spotgpu.core.ids import DeviceID, NodeName, ResourceName
from spotgpu.core.lending import ActivitySample, LendingEvent, LowpowerDetector, OwnerBusy, OwnerIdle
from spotgpu.core.mapping_cache import IDLE_SPACE, MappingCache, MappingSnapshot, Owner
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import EvictionReason, Health

log = logging.getLogger(__name__)

PublishFn = Callable[[ResourceName, Sequence[tuple[DeviceID, Health, int | None]]], None]
"""Receives a resource and ``(twin ID, health, NUMA node)`` for every twin of it (that resource's
device plugin list); called once per served resource."""


@dataclass(frozen=True, slots=True)
class SolverSettings:
    node: NodeName
    gpu_resource: ResourceName
    spot_resource: ResourceName
    max_inactive_time: float
    sigterm_grace: float = 0.0
    stop_timeout: float = 10.0
    """Longest wait for spot tasks to exit (after the grace)."""
    delete_budget: float = 2.0
    """Time spent retrying pod deletions during an eviction before the owner is released anyway."""
    twin_replicas: int = 1
    """Legacy: replicas of the spot resource itself (:func:`~spotgpu.agent.steer.twin_pools`)."""
    shared_replicas: int = 0
    """Replicas per GPU of the shared spot resource (0: not served)."""
    grant_ttl: float = 60.0
    """Seconds an Allocate's grant counts as in use before pod-resources reports it (an admission
    that failed after our Allocate never shows up there)."""
    preference_ttl: float = 10.0
    """Seconds a GetPreferredAllocation's chosen pod waits for its Allocate."""
    shadow_namespace: str = keys.DEFAULT_SHADOW_NAMESPACE
    """Where authentic ShadowPods live (:mod:`spotgpu.core.shadow`)."""
    candidate_wait: float = 1.0
    """Seconds GetPreferredAllocation waits for the pod watch when no pod of the requested size is
    waiting for admission: the kubelet's own watch may deliver a freshly bound pod a moment
    before ours does."""

    @property
    def pools(self) -> tuple[TwinPool, ...]:
        return twin_pools(self.spot_resource, twin_replicas=self.twin_replicas, shared_replicas=self.shared_replicas)


@dataclass
class _Owner:
    detector: LowpowerDetector
    state: LendState = LendState.ACTIVE
    lent_at: float | None = None
    lent_since: float | None = None
    """Wall-clock seconds when it was lent (kept in the lending record across restarts)."""
    gone: bool = False


@dataclass(frozen=True, slots=True)
class EvictionOutcome:
    """What an executed eviction did, with its timings (monotonic seconds)."""

    plan: EvictionPlan
    tasks_stopped_at: float
    completed_at: float
    failed_tasks: tuple[str, ...] = ()
    undeleted_pods: tuple[PodRef, ...] = ()
    released_at: float | None = None
    """When the owner was released (guard disarmed): after the tasks stopped, before the pods
    were deleted."""

    @property
    def stop_latency(self) -> float:
        return self.tasks_stopped_at - self.plan.at


@dataclass
class _Pending:
    reason: EvictionReason
    attempts: int = 0


@dataclass(frozen=True, slots=True)
class Grant:
    """A twin an Allocate gave that pod-resources does not report yet, and to whom (a guess:
    the pod the kubelet was admitting, see :func:`~spotgpu.agent.steer.match_allocation`)."""

    resource: ResourceName
    twin: DeviceID
    real: DeviceID
    pod: PodRef | None
    container: str | None
    at: float


@dataclass
class SolverState:
    """Read-only view for tests, the CLI and the runtime's lookups."""

    lend_states: dict[ContainerRef, LendState] = field(default_factory=dict)
    health: dict[DeviceID, Health] = field(default_factory=dict)


class Solver:
    """The agent's state and executor (see module docstring)."""

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
    ) -> None:
        self.settings = settings
        self.store = store
        self.kube = kube
        self.tasks = tasks
        self.guard = guard
        self._publish_fn = publish
        self.metrics = metrics
        self.clock = clock
        self.mapping = MappingCache()
        self._lock = threading.RLock()
        self._devices: tuple[GpuDevice, ...] = ()
        self._pools = settings.pools
        self._kinds = {p.resource: p.kind for p in self._pools}
        self._pool_twins: dict[ResourceName, dict[DeviceID, DeviceID]] = {p.resource: {} for p in self._pools}
        self._twin_health: dict[ResourceName, dict[DeviceID, Health]] = {}
        self._in_use: set[tuple[ResourceName, DeviceID]] = set()
        """Served twins pod-resources reported allocated at the last refresh."""
        self._admitted: set[tuple[PodRef, str]] = set()
        """Containers holding served twins at the last refresh (no longer admission candidates)."""
        self._grants: dict[tuple[ResourceName, DeviceID], Grant] = {}
        self._preferred: dict[ResourceName, tuple[Candidate, float]] = {}
        self._mismatched: set[tuple[PodRef, str]] = set()
        self._owners: dict[ContainerRef, _Owner] = {}
        self._shadow: frozenset[ContainerRef] = frozenset()
        self._evicting: set[Owner] = set()
        self._pods: dict[PodRef, PodInfo] = {}
        self._runtime: list[RuntimeContainer] = []
        self._health: dict[DeviceID, Health] = {}
        self._evicted: dict[PodRef, float] = {}
        self._pending_deletes: dict[PodRef, _Pending] = {}
        self._pending_stops: set[str] = set()
        """Spot containers an eviction could not verify stopped: stopped again on every refresh."""
        self._last_annotation: str | None = None
        self._last_tick: float | None = None
        self._recorded: dict[ContainerRef, LentOwner] | None = None
        """The lending record as loaded at recovery (None until then) and as last saved."""
        self._deleter = ThreadPoolExecutor(max_workers=8, thread_name_prefix="evict-delete")
        self.refresh_hook: Callable[[], None] | None = None
        """Called by :meth:`allocate` when a twin's owner is unknown (re-reads pod-resources)."""
        self.sweep: Callable[[tuple[DeviceID, ...], Sequence[PodRef]], tuple[int, int]] | None = None
        """Kills what still runs on the devices for the pods; returns (killed, still running)."""
        self.fresh_allocations: Callable[[], Sequence[AllocatedDevices]] | None = None
        """Reads pod-resources now; an owner-back eviction plans from it (see :meth:`_fresh_snapshot`)."""
        self.on_eviction: Callable[[EvictionOutcome], None] | None = None
        self.live_pods: Callable[[], Sequence[PodInfo]] | None = None
        """This node's pods as the pod watch knows them now, in binding order (first seen first);
        admission candidates come from here (the refresh's copy can be a detection cycle old)."""
        self.await_pods: Callable[[Callable[[Sequence[PodInfo]], bool], float], Sequence[PodInfo]] | None = None
        """``(ready, timeout) -> pods``: waits for the pod watch until ``ready(pods)`` or the timeout."""
        self.on_allocate: Callable[[], None] | None = None
        """Called after every successful Allocate (the agent refreshes soon after, so the grant
        is confirmed by pod-resources and the node annotation tells the truth quickly)."""

    def close(self) -> None:
        self._deleter.shutdown(wait=True, cancel_futures=True)

    # -- inputs ------------------------------------------------------------------------------
    def set_devices(self, devices: Sequence[GpuDevice]) -> None:
        with self._lock:
            self._devices = tuple(devices)
            for pool in self._pools:
                twins = self._pool_twins[pool.resource] = pool.twins(self._devices)
                for device in [d.id for d in self._devices if d.id not in twins.values()]:
                    log.error(
                        "GPU %s cannot be lent as %s: its twin IDs would exceed 63 characters", device, pool.resource
                    )
            self._publish_locked()

    def refresh(
        self,
        allocations: Sequence[AllocatedDevices],
        pods: Mapping[PodRef, PodInfo],
        runtime: Sequence[RuntimeContainer] | None = None,
        *,
        recovering: bool = False,
    ) -> list[EvictionOutcome]:
        """Rebuild the mapping from the node's and cluster's view; evict spot users found on
        GPUs whose twins are not Healthy; retry pending pod deletions.

        ``recovering`` (first refresh after a start): an owner whose GPUs have spot users was
        lent before the restart and is taken as lent again (guard re-armed, detector idle), so
        the next detection judges it by its own processes; spot users on any other owner's
        GPUs are evicted with reason ``Recovery``.
        """
        now = self.clock.monotonic()
        recorded = self._load_record() if recovering else {}
        with self._lock:
            self._pods = dict(pods)
            if runtime is not None:
                self._runtime = list(runtime)
            build = self._build(allocations)
            for problem in build.problems:
                log.warning("mapping: %s", problem)
            self.metrics.forged_shadow_pods.set(len(build.forged_shadows))
            self.mapping.restore(build.snapshot)
            self._confirm_grants(allocations, now)
            self._shadow = build.shadow_owners
            self._sync_owners(now, recovering, recorded)
            self._prune_evicted()
            health = self._compute_health()
            skip: frozenset[Owner] = frozenset(self._evicting)
            violations = find_violations(
                self._devices,
                build.snapshot,
                health,
                skip_owners=skip,
                default_reason=EvictionReason.RECOVERY if recovering else EvictionReason.RESERVED_PREEMPT,
            )
            plans: list[EvictionPlan] = []
            for violation in violations:
                plan = plan_eviction(
                    build.snapshot,
                    violation.owner,
                    violation.devices,
                    self._pods,
                    self._runtime,
                    reason=violation.reason,
                    at=now,
                )
                self._begin_eviction(plan)
                plans.append(plan)
            self._publish_locked()
        self.persist()
        outcomes = [self._execute_eviction(plan) for plan in plans]
        self._retry_pending_stops()
        self._retry_pending_deletes()
        return outcomes

    def _confirm_grants(self, allocations: Sequence[AllocatedDevices], now: float) -> None:
        """Take in what pod-resources says about the served twins (caller holds the lock): the
        twins in use and their holders, grants it now reports (or that expired) dropped, and
        every container newly found on GPUs other than its assigned ones counted once."""
        self._in_use = in_use_of(allocations, self._pool_twins)
        self._admitted = {(a.pod, a.container) for a in allocations if a.resource in self._pool_twins}
        for key, grant in list(self._grants.items()):
            if key in self._in_use:
                del self._grants[key]
            elif now - grant.at > self.settings.grant_ttl:
                log.warning(
                    "Allocate of %s %s (for %s) never showed up in pod-resources within %.0fs: "
                    "the admission failed; the twin is free again",
                    grant.resource,
                    grant.twin,
                    grant.pod or "an unknown pod",
                    self.settings.grant_ttl,
                )
                del self._grants[key]
        known = {d.id for d in self._devices}
        found = steering_mismatches(allocations, self._pods, self._pool_twins, known)
        for m in found:
            if (m.pod, m.container) in self._mismatched:
                continue
            self.metrics.allocation_mismatches.labels(resource=m.resource).inc()
            log.warning(
                "steering: %s/%s holds %s twins of GPU(s) %s, but the scheduler assigned %s; "
                "the node annotation reports the truth",
                m.pod,
                m.container,
                m.resource,
                list(m.allocated),
                list(m.assigned),
            )
        self._mismatched = {(m.pod, m.container) for m in found}

    def _sync_owners(self, now: float, recovering: bool, recorded: Mapping[ContainerRef, LentOwner]) -> None:
        current = {o: d for o, d in owners_of(self.mapping.snapshot()).items() if o not in self._shadow}
        index = device_index(self.mapping.snapshot())
        for owner, devices in current.items():
            record = self._owners.get(owner)
            if record is None:
                detector = LowpowerDetector(owner, devices, self.settings.max_inactive_time, now)
                record = self._owners[owner] = _Owner(detector)
                evidence = self._lent_evidence(owner, devices, index, recorded) if recovering else None
                if evidence is not None:
                    if self._arm(owner):
                        detector.idle = True
                        record.state, record.lent_at = LendState.LENT, now
                        previous = recorded.get(owner)
                        record.lent_since = previous.since if previous is not None else self.clock.time()
                        log.info("recovery: owner %s devices %s %s: lent again", owner, list(devices), evidence)
                else:
                    log.info("new owner %s with devices %s (active)", owner, list(devices))
            elif record.detector.devices != devices:
                log.info("owner %s devices changed %s -> %s", owner, list(record.detector.devices), list(devices))
                record.detector.devices = devices
        for owner in [o for o in self._owners if o not in current]:
            record = self._owners[owner]
            if record.state is LendState.EVICTING:
                record.gone = True
                continue
            if record.state is LendState.LENT:
                self._disarm(owner)
            log.info("owner %s is gone (state %s); its devices are unallocated now", owner, record.state.value)
            del self._owners[owner]

    def _lent_evidence(
        self,
        owner: ContainerRef,
        devices: tuple[DeviceID, ...],
        index: Mapping[DeviceID, tuple[Owner, tuple[PodRef, ...]]],
        recorded: Mapping[ContainerRef, LentOwner],
    ) -> str | None:
        """Why ``owner`` was lent before the restart, or None when it was not (recovery only).

        Spot users on its GPUs prove it; so does the lending record, when it names the same
        devices and the same container (a restarted owner container may be in use: not trusted).
        """
        if any(index[d][1] for d in devices):
            return "had spot users"
        entry = recorded.get(owner)
        if entry is None or set(entry.devices) != set(devices):
            return None
        current = self._container_id(owner)
        if entry.container_id is not None and current is not None and entry.container_id != current:
            log.info("recovery: owner %s was lent, but its container was replaced; judged afresh", owner)
            return None
        return "was recorded as lent"

    def _container_id(self, owner: ContainerRef) -> str | None:
        pod = self._pods.get(owner.pod_ref)
        if pod is None:
            return None
        return next((c.container_id for c in pod.containers if c.name == owner.name), None)

    def _load_record(self) -> dict[ContainerRef, LentOwner]:
        entries = self.store.load() if self.store is not None else []
        recorded = {e.owner: e for e in entries}
        with self._lock:
            self._recorded = recorded
        return recorded

    def persist(self) -> None:
        """Save which owners are lent, when that changed (best effort: a failure is logged and
        counted; the worst case after a restart is an owner waiting ``maxInactiveTime`` again)."""
        if self.store is None:
            return
        with self._lock:
            if self._recorded is None:
                return  # not recovered yet: never overwrite the record before reading it
            lent = {
                owner: LentOwner(owner, r.detector.devices, self._container_id(owner), r.lent_since or 0.0)
                for owner, r in self._owners.items()
                if r.state is LendState.LENT
            }
            if lent == self._recorded:
                return
            self._recorded = lent
        try:
            self.store.save(list(lent.values()))
        except SpotgpuError as exc:
            with self._lock:
                self._recorded = {}  # unknown on disk: write again next time
            self.metrics.detector_errors.labels(kind="state_file").inc()
            log.warning("saving the lending record failed: %s", exc)

    def _prune_evicted(self) -> None:
        live = {u for e in self.mapping.snapshot().owners for d in e.devices for u in d.users} | set(self._pods)
        for pod in [p for p in self._evicted if p not in live]:
            del self._evicted[pod]
        for pod in [p for p in self._pending_deletes if p not in self._pods]:
            del self._pending_deletes[pod]

    # -- detection -----------------------------------------------------------------------------
    def watched_owners(self) -> list[WatchedOwner]:
        """Owners the detector judges now (not ShadowPods, not being evicted)."""
        with self._lock:
            result = []
            for owner, record in sorted(self._owners.items()):
                if record.state is LendState.EVICTING:
                    continue
                pod = self._pods.get(owner.pod_ref)
                cid = None
                if pod is not None:
                    cid = next((c.container_id for c in pod.containers if c.name == owner.name), None)
                result.append(WatchedOwner(owner, record.detector.devices, cid))
            return result

    def observe(self, samples: Mapping[ContainerRef, ActivitySample]) -> list[LendingEvent]:
        """Feed one detection round; lend or evict as the detectors decide."""
        events: list[LendingEvent] = []
        with self._lock:
            for owner, sample in samples.items():
                record = self._owners.get(owner)
                if record is None or record.state is LendState.EVICTING:
                    continue
                if sample.owner_process_active is None or (
                    record.state is LendState.ACTIVE and sample.utilization_active is None
                ):
                    self.metrics.detector_errors.labels(kind="unknown_sample").inc()
                event = record.detector.observe(sample)
                if event is not None:
                    events.append(event)
        for event in events:
            self.handle(event)
        return events

    def owner_back(self, owner: ContainerRef) -> EvictionOutcome | None:
        """The guard caught ``owner`` starting a GPU session: evict at once (no poll wait)."""
        now = self.clock.monotonic()
        with self._lock:
            record = self._owners.get(owner)
            event = record.detector.owner_back(now) if record is not None and record.state is LendState.LENT else None
            if event is None and (record is None or record.state is LendState.ACTIVE):
                log.info("guard: owner %s is back but nothing is lent; releasing its call", owner)
                self._disarm(owner)
                return None
        if event is None:
            return None  # an eviction is already running; it releases the guard when done
        return self._handle_busy(event)

    def handle(self, event: LendingEvent) -> EvictionOutcome | None:
        if isinstance(event, OwnerIdle):
            self._handle_idle(event)
            return None
        return self._handle_busy(event)

    def _handle_idle(self, event: OwnerIdle) -> None:
        with self._lock:
            record = self._owners.get(event.owner)
            if record is None or record.state is not LendState.ACTIVE:
                return
            plan = LendPlan(event.owner, record.detector.devices, event.at, event.idle_since)
            log.info(
                "owner %s idle since %.1fs ago on devices %s: lending",
                plan.owner,
                plan.at - plan.idle_since,
                list(plan.devices),
            )
            if not self._arm(plan.owner):
                record.detector.idle = False
                record.detector.last_active = plan.at
                return
            record.state, record.lent_at, record.lent_since = LendState.LENT, plan.at, self.clock.time()
            self.persist()  # on disk before the kubelet can see a Healthy twin (a crash now keeps the loan)
            self._publish_locked()
        self.annotate()

    def _handle_busy(self, event: OwnerBusy) -> EvictionOutcome | None:
        with self._lock:
            record = self._owners.get(event.owner)
            if record is None or record.state is not LendState.LENT:
                return None
            devices = record.detector.devices
            self._mark_evicting(event.owner)
            self._publish_locked()  # twins Unhealthy first: no new spot container gets these GPUs now
        fresh = self._fresh_snapshot()
        with self._lock:
            plan = plan_eviction(
                fresh or self.mapping.snapshot(),
                event.owner,
                devices,
                self._pods,
                self._runtime,
                reason=EvictionReason.OWNER_BACK,
                at=event.at,
            )
        log.info(
            "owner %s is back (%s) on devices %s: evicting %d spot pod(s)",
            event.owner,
            event.source.value,
            list(plan.devices),
            len(plan.victims),
        )
        return self._execute_eviction(plan)

    def _fresh_snapshot(self) -> MappingSnapshot | None:
        """The mapping from a pod-resources read made now, or None (no reader, or it failed).

        The cache is only as fresh as the last refresh (up to ``detectInterval`` old); a spot
        container that started since then would be missing from an eviction planned from it.
        The twins are already Unhealthy when this runs, so no user can appear after it.
        """
        if self.fresh_allocations is None:
            return None
        try:
            allocations = self.fresh_allocations()
        except Exception as exc:  # never leave an owner stuck in 'evicting': plan from the cache
            log.warning("re-reading pod-resources before an eviction failed (planning from the cache): %s", exc)
            return None
        with self._lock:
            return self._build(allocations).snapshot

    def _build(self, allocations: Sequence[AllocatedDevices]) -> MappingBuild:
        """The mapping ``allocations`` imply with the current devices and pods; caller holds the lock."""
        return build_mapping(
            self._devices,
            allocations,
            self._pods,
            gpu_resource=self.settings.gpu_resource,
            spot_resource=self.settings.spot_resource,
            extra_spot_resources=[p.resource for p in self._pools],
            shadow_namespace=self.settings.shadow_namespace,
        )

    # -- execution -------------------------------------------------------------------------------
    def _begin_eviction(self, plan: EvictionPlan) -> None:
        self._mark_evicting(plan.owner)

    def _mark_evicting(self, owner: Owner) -> None:
        self._evicting.add(owner)
        if isinstance(owner, ContainerRef):
            record = self._owners.get(owner)
            if record is not None:
                record.state = LendState.EVICTING

    def _complete_victims(self, plan: EvictionPlan) -> EvictionPlan:
        """Fill in container IDs of victims that have none yet (a spot pod whose container just
        started: the API has not reported its ID). containerd labels every CRI container with
        its pod, so one fresh listing finds it; without it the task could survive the eviction."""
        if all(v.container_ids for v in plan.victims):
            return plan
        try:
            runtime = self.tasks.list_containers()
        except SpotgpuError as exc:
            log.warning("owner %s: cannot list containers for victims without IDs: %s", plan.owner, exc)
            return plan
        with self._lock:
            self._runtime = list(runtime)
        victims = tuple(
            v if v.container_ids else replace(v, container_ids=runtime_container_ids(v.pod, runtime))
            for v in plan.victims
        )
        return replace(plan, victims=victims)

    def _sweep(self, plan: EvictionPlan, failed: set[str]) -> None:
        """The last line before the release: victims whose containers could not be stopped (or
        whose container IDs nobody knows yet) may still run on the GPUs; the sweep hook kills
        their processes on the evicted devices (found by the GPU backend, claimed by pod UID or
        container ID). A no-op when every container was verified stopped."""
        unverified = [v.pod for v in plan.victims if not v.container_ids or failed.intersection(v.container_ids)]
        if not unverified or self.sweep is None:
            return
        try:
            killed, alive = self.sweep(plan.devices, unverified)
        except Exception:
            log.exception("owner %s: sweeping the GPUs for %s failed", plan.owner, unverified)
            return
        log_fn = log.error if alive else log.warning
        log_fn(
            "owner %s: %d process(es) of unverified spot pod(s) %s killed on devices %s directly; %d still running",
            plan.owner,
            killed,
            [p.format() for p in unverified],
            list(plan.devices),
            alive,
        )

    def _release(self, owner: Owner) -> float:
        """The owner is active again (its twins stay Unhealthy) and the guard lets its call go.

        The lending record is written right after the release, not before: no file I/O on the
        owner's wait. A crash in between leaves the owner recorded as lent; the next start then
        lends it again with the guard armed, and either its first detection round sees the
        owner on its GPUs (evicted before the device plugin registers) or the guard catches its
        next session start: a stale record costs a loan, never an unprotected owner."""
        with self._lock:
            if isinstance(owner, ContainerRef):
                record = self._owners.get(owner)
                if record is not None:
                    record.state, record.lent_at = LendState.ACTIVE, None
                    if record.gone:
                        del self._owners[owner]
                self._disarm(owner)
            released_at = self.clock.monotonic()
            self._publish_locked()
        self.persist()
        return released_at

    def _execute_eviction(self, plan: EvictionPlan) -> EvictionOutcome:
        reason = plan.reason.value
        released_at: float | None = None
        try:
            plan = self._complete_victims(plan)
            for victim in plan.victims:
                with self._lock:
                    first = victim.pod not in self._evicted
                    self._evicted.setdefault(victim.pod, plan.at)
                if first:
                    self.metrics.evictions.labels(reason=reason, namespace=victim.pod.namespace or "").inc()
                log.info(
                    "evict %s from owner %s devices %s (reason %s): stopping containers %s",
                    victim.pod,
                    plan.owner,
                    list(victim.devices),
                    reason,
                    list(victim.container_ids),
                )
            failed: list[str] = []
            if plan.container_ids:
                results = self.tasks.stop_tasks(
                    plan.container_ids, grace=self.settings.sigterm_grace, timeout=self.settings.stop_timeout
                )
                for result in results:
                    if result.state is TaskState.FAILED:
                        failed.append(result.container_id)
                        with self._lock:
                            self._pending_stops.add(result.container_id)
                        self.metrics.task_stop_failures.inc()
                        log.error(
                            "owner %s: spot container %s not verified stopped: %s",
                            plan.owner,
                            result.container_id,
                            result.detail,
                        )
                    else:
                        log.info(
                            "owner %s: spot container %s %s (exit %s)",
                            plan.owner,
                            result.container_id,
                            result.state.value,
                            result.exit_status,
                        )
            self._sweep(plan, set(failed))
            stopped_at = self.clock.monotonic()
            self.metrics.eviction_seconds.labels(reason=reason).observe(max(0.0, stopped_at - plan.at))
            for victim in plan.victims:
                self.mapping.remove_user(victim.pod)
            released_at = self._release(plan.owner)  # the GPUs are clean: the owner's call proceeds now
            undeleted = self._delete_pods(plan)
        finally:
            if released_at is None:
                released_at = self._release(plan.owner)
            with self._lock:
                self._evicting.discard(plan.owner)  # from here on, leftover users are violations again
                self._publish_locked()
        completed_at = self.clock.monotonic()
        self.metrics.eviction_complete_seconds.labels(reason=reason).observe(max(0.0, completed_at - plan.at))
        log.info(
            "owner %s devices %s: eviction done in %.1f ms (tasks stopped after %.1f ms, owner released after %.1f ms)",
            plan.owner,
            list(plan.devices),
            (completed_at - plan.at) * 1000,
            (stopped_at - plan.at) * 1000,
            (released_at - plan.at) * 1000,
        )
        outcome = EvictionOutcome(plan, stopped_at, completed_at, tuple(failed), undeleted, released_at)
        self.persist()
        self.annotate()
        if self.on_eviction is not None:
            self.on_eviction(outcome)
        return outcome

    def _delete_one(self, pod: PodRef, reason: EvictionReason, message: str, deadline: float) -> bool:
        delay = 0.02
        while True:
            try:
                self.kube.delete_pod(pod, reason=reason, message=message, grace_seconds=0)
                return True
            except TemporaryError as exc:
                if time.monotonic() + delay > deadline:
                    log.warning("deleting %s failed (will retry later): %s", pod, exc)
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
            except Exception as exc:
                log.error("deleting %s failed: %s", pod, exc)
                return False

    def _delete_pods(self, plan: EvictionPlan) -> tuple[PodRef, ...]:
        if not plan.victims:
            return ()
        deadline = time.monotonic() + self.settings.delete_budget
        message = f"spotgpu: GPU(s) {', '.join(plan.devices)} taken back from {plan.owner} ({plan.reason.value})"
        futures = {
            v.pod: self._deleter.submit(self._delete_one, v.pod, plan.reason, message, deadline) for v in plan.victims
        }
        undeleted = []
        for pod, future in futures.items():
            if future.result():
                log.info("owner %s: deleted spot pod %s", plan.owner, pod)
                with self._lock:
                    self._pending_deletes.pop(pod, None)
            else:
                undeleted.append(pod)
                self.metrics.pod_delete_failures.inc()
                with self._lock:
                    self._pending_deletes.setdefault(pod, _Pending(plan.reason))
        return tuple(undeleted)

    def _retry_pending_stops(self) -> None:
        with self._lock:
            pending = sorted(self._pending_stops)
        if not pending:
            return
        results = self.tasks.stop_tasks(pending, grace=0.0, timeout=self.settings.stop_timeout)
        for result in results:
            if result.state is TaskState.FAILED:
                log.warning("spot container %s still not verified stopped: %s", result.container_id, result.detail)
                continue
            log.info("spot container %s now verified stopped (%s)", result.container_id, result.state.value)
            with self._lock:
                self._pending_stops.discard(result.container_id)

    def _retry_pending_deletes(self) -> None:
        with self._lock:
            pending = list(self._pending_deletes.items())
        for pod, entry in pending:
            entry.attempts += 1
            message = f"spotgpu: evicted ({entry.reason.value}); retry {entry.attempts}"
            ok = self._delete_one(pod, entry.reason, message, time.monotonic())
            if ok:
                with self._lock:
                    self._pending_deletes.pop(pod, None)

    def _arm(self, owner: ContainerRef) -> bool:
        if self.guard is None or not self.guard.available:
            return True
        try:
            self.guard.arm(owner)
        except Exception as exc:
            log.error("arming the guard for %s failed; not lending: %s", owner, exc)
            self.metrics.detector_errors.labels(kind="guard_arm").inc()
            return False
        log.info("guard armed for %s", owner)
        return True

    def _disarm(self, owner: ContainerRef) -> None:
        if self.guard is None or not self.guard.available:
            return
        try:
            self.guard.disarm(owner)
        except Exception as exc:  # the guard fails open by itself after its timeout
            log.error("disarming the guard for %s failed: %s", owner, exc)
            self.metrics.detector_errors.labels(kind="guard_disarm").inc()
            return
        log.info("guard disarmed for %s", owner)

    # -- publishing ------------------------------------------------------------------------------
    def _compute_health(self) -> dict[DeviceID, Health]:
        states = {o: r.state for o, r in self._owners.items()}
        return twin_health(self._devices, self.mapping.snapshot(), states, self._shadow)

    def _use_locked(self) -> dict[DeviceID, DeviceUse]:
        """Twins in use per GPU: pod-resources' and the grants it does not report yet."""
        return device_use([*self._in_use, *self._grants], self._pool_twins, self._kinds)

    def _publish_locked(self) -> None:
        self._health = self._compute_health()
        owners, pending = self._sources_locked()
        self._twin_health = pool_health(
            self._pool_twins, self._kinds, self._health, self._use_locked(), owners=owners, pending=pending
        )
        numa = {d.id: d.numa_node for d in self._devices}
        for resource, twins in self._pool_twins.items():
            health = self._twin_health[resource]
            self._publish_fn(resource, [(twin, health[twin], numa[real]) for twin, real in twins.items()])
        self.metrics.set_health({real: h is Health.HEALTHY for real, h in self._health.items()})
        counts = {s.value: 0 for s in LendState}
        for record in self._owners.values():
            counts[record.state.value] += 1
        self.metrics.set_owner_counts(counts)

    def annotate(self) -> None:
        """Patch the node annotation when the per-device state changed (best effort)."""
        with self._lock:
            value = node_state_annotation(
                self._devices,
                self.mapping.snapshot(),
                {o: r.state for o, r in self._owners.items()},
                self._health,
                self._shadow,
                replicas=max((p.replicas for p in self._pools if p.kind is TwinKind.SHARED), default=0),
            )
            if value == self._last_annotation:
                return
        try:
            self.kube.patch_node_annotations(self.settings.node, {keys.NODE_SPOT_GPU_STATE: value})
        except Exception as exc:
            log.warning("patching node %s annotation failed (retried next cycle): %s", self.settings.node, exc)
            return
        with self._lock:
            self._last_annotation = value

    def account(self) -> None:
        """Add lent and spot-used GPU-seconds since the last call."""
        now = self.clock.monotonic()
        with self._lock:
            last, self._last_tick = self._last_tick, now
            if last is None:
                return
            dt = max(0.0, now - last)
            lent = sum(len(r.detector.devices) for r in self._owners.values() if r.state is LendState.LENT)
            used = sum(1 for _, (_, users) in device_index(self.mapping.snapshot()).items() if users)
        self.metrics.lent_gpu_seconds.inc(dt * lent)
        self.metrics.spot_gpu_seconds.inc(dt * used)

    # -- device plugin and runtime lookups --------------------------------------------------------
    @property
    def resources(self) -> tuple[ResourceName, ...]:
        """The served resources; the first is the spot resource."""
        return tuple(p.resource for p in self._pools)

    def _pool(self, resource: ResourceName) -> TwinPool:
        pool = next((p for p in self._pools if p.resource == resource), None)
        if pool is None:
            raise AllocateRefused(f"resource {resource!r} is not served by this agent")
        return pool

    def _twin_view(self, resource: ResourceName, twin: str) -> TwinView | None:
        real = self._pool_twins.get(resource, {}).get(DeviceID(twin))
        if real is None:
            return None
        owners, pending = self._sources_locked()
        return twin_view(
            twin, real, self._kinds[resource], self._health, self._use_locked(), owners=owners, pending=pending
        )

    def _sources_locked(self) -> tuple[dict[DeviceID, Owner], dict[DeviceID, ContainerRef]]:
        """Who holds each GPU, and the ShadowPods announced for unheld ones (caller holds the lock)."""
        snapshot = self.mapping.snapshot()
        owners = {d: owner for d, (owner, _) in device_index(snapshot).items()}
        pending = pending_shadows(
            self._pods.values(), snapshot, node=self.settings.node, shadow_namespace=self.settings.shadow_namespace
        )
        return owners, pending

    def _admitted_keys(self) -> set[tuple[PodRef, str]]:
        """Containers holding twins: per pod-resources, or granted (caller holds the lock)."""
        return self._admitted | {(g.pod, g.container) for g in self._grants.values() if g.pod and g.container}

    def _candidates(self, resource: ResourceName, pods: Sequence[PodInfo]) -> list[Candidate]:
        """Admission candidates for ``resource`` (caller holds the lock)."""
        candidates, problems = admission_candidates(
            pods, resource, node=self.settings.node, admitted=self._admitted_keys(), known={d.id for d in self._devices}
        )
        for problem in problems:
            log.warning("steering: %s (steered without it)", problem)
        return candidates

    def _live_pods(self) -> list[PodInfo]:
        if self.live_pods is not None:
            return list(self.live_pods())
        with self._lock:
            return list(self._pods.values())

    def prefer(
        self, resource: ResourceName, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """The device plugin's GetPreferredAllocation answer for one container request (see
        :func:`~spotgpu.agent.steer.prefer`); remembers the pod it chose for the Allocate that
        follows."""
        pods = self._live_pods()
        with self._lock:
            admitted = self._admitted_keys()
            known = {d.id for d in self._devices}
            self._pool(resource)

        def waiting(candidates_of: Sequence[PodInfo]) -> bool:
            found, _ = admission_candidates(
                candidates_of, resource, node=self.settings.node, admitted=admitted, known=known
            )
            return any(c.size == size for c in found)

        if self.await_pods is not None and not waiting(pods):
            pods = list(self.await_pods(waiting, self.settings.candidate_wait))
        now = self.clock.monotonic()
        with self._lock:
            pool = self._pool(resource)
            choice = prefer(
                available,
                must_include,
                size,
                pool=pool,
                twins=self._pool_twins[resource],
                use=self._use_locked(),
                candidates=self._candidates(resource, pods),
                numa={d.id: d.numa_node for d in self._devices},
                lendable={r for r, h in self._health.items() if h is Health.HEALTHY},
                held={d for d, (owner, _) in device_index(self.mapping.snapshot()).items() if owner is not IDLE_SPACE},
            )
            if choice.candidate is not None:
                self._preferred[resource] = (choice.candidate, now)
            else:
                self._preferred.pop(resource, None)
        self.metrics.preferred_allocations.labels(
            resource=resource, result="steered" if choice.steered else "fallback"
        ).inc()
        log.info("GetPreferredAllocation %s size %d -> %s: %s", resource, size, list(choice.ids), choice.reason)
        return list(choice.ids)

    def allocate(self, twins: Sequence[str], resource: ResourceName | None = None) -> dict[str, str]:
        """The device plugin's Allocate answer for one container of ``resource`` (default: the
        spot resource): the ``container-devices-from`` annotation naming the owner of the real
        GPUs behind ``twins`` (:func:`~spotgpu.agent.model.allocate_annotations`), after the
        kind rule (:func:`~spotgpu.agent.steer.check_kinds`). The twins are recorded as granted
        (their GPUs' other kind turns Unhealthy at once) to the pod being admitted; when that
        pod was assigned other GPUs, the mismatch is logged and counted, and the answer still
        names the GPUs behind ``twins``.

        Raises :class:`~spotgpu.agent.model.AllocateRefused` for a twin we cannot give."""
        resource = resource or self._pools[0].resource
        try:
            annotations = self._allocate(resource, twins)
        except AllocateRefused:
            self.metrics.allocations.labels(resource=resource, result="refused").inc()
            raise
        if self.on_allocate is not None:
            self.on_allocate()
        return annotations

    def _allocate(self, resource: ResourceName, twins: Sequence[str]) -> dict[str, str]:
        self._pool(resource)  # an unknown resource raises here
        for attempt in (0, 1):
            with self._lock:
                views = {t: self._twin_view(resource, t) for t in twins}
            needs_refresh = any(v is not None and v.owner is IDLE_SPACE for v in views.values())
            if needs_refresh and attempt == 0 and self.refresh_hook is not None:
                log.info("Allocate %s: a twin's GPU has no holder yet; re-reading pod-resources", list(twins))
                self.refresh_hook()
                continue
            break
        pods = self._live_pods()
        now = self.clock.monotonic()
        with self._lock:
            views = {t: self._twin_view(resource, t) for t in twins}
            annotations = allocate_annotations(twins, views.get, gpu_resource=self.settings.gpu_resource)
            preferred, at = self._preferred.pop(resource, (None, 0.0))
            if preferred is not None and now - at > self.settings.preference_ttl:
                preferred = None
            match = match_allocation(twins, self._pool_twins[resource], self._candidates(resource, pods), preferred)
            who = match.candidate
            for twin in twins:
                real = self._pool_twins[resource][DeviceID(twin)]
                self._grants[(resource, DeviceID(twin))] = Grant(
                    resource, DeviceID(twin), real, who.pod if who else None, who.container if who else None, now
                )
            self._publish_locked()  # the other kind of these GPUs turns Unhealthy now
        self.metrics.allocations.labels(resource=resource, result=match.result.value).inc()
        if match.result is MatchResult.MISMATCH:
            assert who is not None
            log.warning(
                "Allocate %s %s: the kubelet chose GPU(s) %s, but %s/%s (the pod being admitted) was assigned %s; "
                "the answer names the GPUs behind the twins",
                resource,
                list(twins),
                list(match.allocated),
                who.pod,
                who.container,
                list(who.assigned),
            )
        log.info(
            "Allocate %s %s for %s (%s) -> %s",
            resource,
            list(twins),
            f"{who.pod}/{who.container}" if who else "an unidentified pod",
            match.result.value,
            annotations,
        )
        return annotations

    def owner_of(self, device: str) -> Owner | None:
        """The recorded owner of real ``device`` (for spotgpu-runtime's source check)."""
        return self.mapping.get_device_owner(device)

    def lendable(self, device: str) -> bool | None:
        """True when real ``device``'s twin is Healthy now (spot work may use it), False when it
        is not (owner active or being evicted, GPU failed), None for a device we do not serve."""
        with self._lock:
            health = self._health.get(DeviceID(device))
        return None if health is None else health is Health.HEALTHY

    def twin_health(self) -> dict[DeviceID, Health]:
        """``{twin: health}`` of every served twin as last published (exclusive twins and
        shared replicas have distinct IDs)."""
        with self._lock:
            return {twin: h for table in self._twin_health.values() for twin, h in table.items()}

    def twin_health_of(self, resource: ResourceName) -> dict[DeviceID, Health]:
        with self._lock:
            return dict(self._twin_health.get(resource, {}))

    def grants(self) -> list[Grant]:
        """Allocations pod-resources does not report yet."""
        with self._lock:
            return sorted(self._grants.values(), key=lambda g: (g.resource, g.twin))

    def state(self) -> SolverState:
        with self._lock:
            return SolverState({o: r.state for o, r in self._owners.items()}, dict(self._health))

    def devices(self) -> tuple[GpuDevice, ...]:
        with self._lock:
            return self._devices


__all__ = ["EvictionOutcome", "Grant", "PublishFn", "Solver", "SolverSettings", "SolverState"]
