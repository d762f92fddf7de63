"""The agent process: wires the solver to the device plugin, the detector loop, the pod
watch, the guard, spotgpu-runtime's service, metrics and the state dump.

Decides nothing itself (decisions: :mod:`spotgpu.agent.model`, :mod:`spotgpu.agent.detect`,
:mod:`spotgpu.core.lending`; coordination and execution: :mod:`spotgpu.agent.solver`). Its parts:
the pod view (:mod:`spotgpu.agent.nodepods`), the measurements (:mod:`spotgpu.agent.measure`),
the runtime fallback's owner record (:mod:`spotgpu.agent.owner_record`) and the state dump
(:mod:`spotgpu.agent.debugstate`).
Side effects: threads (detection loop, pod watch), the device plugin's gRPC server, the
runtime service's unix socket, the HTTP servers (``/metrics``; ``/debug/state`` on its own
loopback listener, ``debugAddress``), the
owner record file of the runtime's ``local`` fallback, and calls through the ports it is given.

Start order (:meth:`Agent.start`):

1. the guard starts and gets up to a second to attach to its fd holder (so ``available`` is
   known and recovery can re-arm lent owners with their notify fds in hand);
2. GPU inventory from the backend; the twins are published Unhealthy until proven otherwise;
3. recovery: pods on this node (Kubernetes API), device assignments (kubelet pod-resources
   ``List``) and containers (containerd) rebuild the MappingCache; owners whose GPUs carry spot
   users, or that the lending record names, are taken as lent (guard re-armed); spot users on
   any other owner's GPU, and spot pods being deleted, are evicted; then one detection round
   runs at once, so a lent owner that came back while the agent was down is evicted before
   anything else happens;
4. spotgpu-runtime's service starts (owners are known now, so its owner checks are right);
5. the device plugins (the spot resource's, and the shared spot resource's when
   ``sharedReplicas`` > 0) serve and register (twin health is now right);
6. the pod watch, the detection loop and the post-Allocate refresher start; ``/metrics`` and
   (on the loopback ``debugAddress``) ``/debug/state`` are served.

Steering (:mod:`spotgpu.agent.steer`): the pod watch keeps this node's pods in binding order
(first seen first), from which GetPreferredAllocation and Allocate infer the pod the kubelet is
admitting; after every Allocate a refresh follows within :data:`ALLOCATE_REFRESH_DELAY`, so the
grant is confirmed from pod-resources and the node annotation names the truth quickly.

:meth:`Agent.stop` stops the loops, the device plugin (socket removed), the runtime service,
the guard and the metrics server. It neither disarms nor evicts: lent GPUs stay lent and spot
work keeps running. While no agent runs, the guard's fd holder answers every caught call at
once (it lets a returning owner through; it does not hold it) and nothing evicts, so an owner
that comes back then may see spot work on its GPUs until the next agent starts: that start's
recovery re-arms every lent owner and its immediate detection round evicts the spot users of
any owner whose processes are back on its GPUs (polling covers owners that return later).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.adapters.deviceplugin import DevicePluginServer, TwinDevice
from spotgpu.adapters.procattr import CgroupIdentity, ProcessAttributor
from spotgpu.adapters.reaper import kill_and_wait
from spotgpu.agent.debugstate import EvictionLog, debug_state
from spotgpu.agent.evictor import EvictionOutcome
from spotgpu.agent.holderwatch import HolderWatch
from spotgpu.agent.measure import REF_RETRY_INTERVAL, BackendUtilization, Measurer, ReferencePoints
from spotgpu.agent.model import victim_container_ids
from spotgpu.agent.nodepods import NodePods
from spotgpu.agent.owner_record import OwnerRecord
from spotgpu.agent.settings import SolverSettings
from spotgpu.agent.solver import Solver
from spotgpu.core.clock import Clock, SystemClock
from spotgpu.core.config import AgentConfig
from spotgpu.core.errors import SpotgpuError
from spotgpu.core.ids import DeviceID, NodeName, ResourceName
from spotgpu.core.lending import Action
from spotgpu.core.mapping_cache import Owner
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import Health
from spotgpu.ports.agent import RuntimeHost, TwinHost
from spotgpu.ports.guard import GuardPort
from spotgpu.ports.kube import KubePort, PodEvent, PodEventType, PodInfo
from spotgpu.ports.node import (
    GpuBackend,
    LendStore,
    PidAttributor,
    PinningTaskPort,
    PodResourcesPort,
    ReleaseCheck,
    RuntimeContainer,
    TaskPort,
    UtilizationReader,
)

log = logging.getLogger(__name__)


RUNTIME_LIST_INTERVAL = 30.0
"""Seconds between containerd container listings (the pod watch reports container IDs live)."""

FRESH_READ_TIMEOUT = 0.5
"""Seconds an owner-back eviction waits for its fresh pod-resources read; a kubelet that is slower
does not hold the owner: the eviction plans from the cache (at most one refresh old) instead."""

GUARD_ATTACH_WAIT = 1.0
"""Seconds :meth:`Agent.start` waits for the guard to attach to its fd holder before recovery."""

ALLOCATE_REFRESH_DELAY = 0.5
"""Seconds after an Allocate before pod-resources is read again (the kubelet records the grant
right after our answer; a short delay lets a pod's other containers be admitted first)."""


RuntimeServiceFactory = Callable[["Agent"], RuntimeHost]
"""Builds spotgpu-runtime's service around the agent's lookups (:meth:`Agent.owner_of`,
:meth:`Agent.lendable`)."""


TwinHostFactory = Callable[["Agent"], TwinHost]
"""Builds the twin host around the agent's lookups (:meth:`Agent.owner_of`, :meth:`Agent.lendable`)."""


@dataclass(frozen=True, slots=True)
class CycleReport:
    """What one detection cycle did (for tests and the benchmark)."""

    events: tuple[Action, ...]
    """The loans and evictions the cycle started."""
    cpu_seconds: float
    wall_seconds: float


class Agent:
    """The node agent (see module docstring)."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        node: NodeName,
        kube: KubePort,
        backend: GpuBackend,
        tasks: TaskPort,
        pod_resources: PodResourcesPort,
        guard: GuardPort | None = None,
        guard_factory: Callable[[Callable[[ContainerRef], None]], GuardPort] | None = None,
        utilization: UtilizationReader | None = None,
        clock: Clock | None = None,
        metrics: AgentMetrics | None = None,
        serve_device_plugin: bool = True,
        attributor: PidAttributor | None = None,
        runtime_service: RuntimeServiceFactory | None = None,
        owner_record: Path | None = None,
        store: LendStore | None = None,
        release_check: ReleaseCheck | None = None,
        twin_host: TwinHostFactory | None = None,
    ) -> None:
        self.config = config
        self.twin_host: TwinHost | None = None
        self.node = node
        self.kube = kube
        self.backend = backend
        self.tasks = tasks
        self.pod_resources = pod_resources
        self.clock = clock or SystemClock()
        self.metrics = metrics or AgentMetrics()
        self.utilization = utilization or BackendUtilization(backend)
        self.attributor: PidAttributor = attributor or ProcessAttributor()
        if guard is None and guard_factory is not None:
            guard = guard_factory(self.on_owner_back)
        self.guard = guard
        self.pods = NodePods()
        """This node's pods in binding order (the pod watch keeps it)."""
        self.solver = Solver(
            SolverSettings.from_config(config, node),
            kube=kube,
            tasks=tasks,
            guard=guard,
            publish=self._publish,
            metrics=self.metrics,
            clock=self.clock,
            store=store,
            release_check=release_check,
        )
        self._wire_solver()
        check = config.eviction.release_check
        self.holder_watch = (
            HolderWatch(
                self.solver, release_check, metrics=self.metrics, clock=self.clock,
                interval=check.watch_interval, window=check.watch_window,
            )
            if release_check is not None and check.watch_interval > 0
            else None
        )  # fmt: skip
        """Between returns: GPUs lent now or lately held by nobody without right (None: off)."""
        self.plugins: dict[ResourceName, DevicePluginServer] = self._device_plugins() if serve_device_plugin else {}
        """One device plugin per served resource (:attr:`Solver.resources`)."""
        self.twin_host = twin_host(self) if twin_host is not None else None
        self._refs = ReferencePoints(tasks, self.attributor, REF_RETRY_INTERVAL)
        self._measurer = Measurer(backend, self.utilization, self._refs, metrics=self.metrics, clock=self.clock)
        self._owner_record = OwnerRecord(owner_record, self.metrics)
        self._evictions = EvictionLog()
        self._pinner = ThreadPoolExecutor(1, thread_name_prefix="agent-pin")
        self._refresh_wanted = threading.Event()
        self._runtime_factory = runtime_service
        self.runtime_service: RuntimeHost | None = None
        self._recovered = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._reconcile_lock = threading.Lock()
        self._runtime_at = -RUNTIME_LIST_INTERVAL
        self.metrics_port: int | None = None
        self.debug_port: int | None = None
        """The ``/debug/state`` listener's port (loopback only; None: not served)."""

    # -- wiring ------------------------------------------------------------------------------
    def _wire_solver(self) -> None:
        """The solver's hooks into the agent: refreshes, fresh reads, the sweep, the pod view."""
        solver, pod_resources = self.solver, self.pod_resources
        solver.refresh_hook = self._refresh_for_allocate
        solver.fresh_allocations = lambda: pod_resources.list(timeout=FRESH_READ_TIMEOUT)
        solver.sweep = self._sweep
        solver.on_eviction = self._record_eviction
        solver.live_pods = self.pods.live
        solver.await_pods = self.pods.wait_for
        solver.on_allocate = self._refresh_soon

    def _device_plugins(self) -> dict[ResourceName, DevicePluginServer]:
        """One device plugin server per resource the solver serves, answering through it."""
        config = self.config
        sockets = {config.spot_resource: config.plugin_socket_name}
        sockets[config.shared_resource] = config.shared_plugin_socket_name
        return {
            resource: DevicePluginServer(
                config.device_plugin_dir,
                resource,
                partial(self._allocate, resource),
                socket_name=sockets[resource],
                preferred=partial(self.solver.allocator.prefer, resource),
            )
            for resource in self.solver.resources
        }

    @property
    def plugin(self) -> DevicePluginServer | None:
        """The spot resource's device plugin (None when not serving)."""
        return self.plugins.get(self.config.spot_resource)

    @property
    def owner_record(self) -> Path | None:
        """Where the runtime's ``local`` fallback reads owners (None: no fallback, no file)."""
        return self._owner_record.path

    @property
    def ref_retry_interval(self) -> float:
        """Seconds before an owner container's init PID is asked for again while it does not run."""
        return self._refs.retry_interval

    @ref_retry_interval.setter
    def ref_retry_interval(self, seconds: float) -> None:
        self._refs.retry_interval = seconds

    def _publish(self, resource: ResourceName, twins: Sequence[tuple[DeviceID, Health, int | None]]) -> None:
        plugin = self.plugins.get(resource)
        if plugin is not None:
            plugin.set_devices([TwinDevice(t, h, n) for t, h, n in twins])
        if self.twin_host is not None:
            self.twin_host.twins_changed(resource, twins)

    def _allocate(self, resource: ResourceName, twins: Sequence[str]) -> dict[str, str]:
        return self.solver.allocator.allocate(resource, twins)

    def _refresh_soon(self) -> None:
        self._refresh_wanted.set()

    def _refresh_after_allocate(self) -> None:
        while not self._stop.is_set():
            if not self._refresh_wanted.wait(0.5):
                continue
            if self._stop.wait(ALLOCATE_REFRESH_DELAY):
                return
            self._refresh_wanted.clear()
            try:
                self.reconcile()
                self.solver.annotate()
            except Exception:
                self.metrics.detector_errors.labels(kind="allocate_refresh").inc()
                log.exception("refreshing after an Allocate failed")

    def _refresh_for_allocate(self) -> None:
        self.reconcile()

    def on_owner_back(self, owner: ContainerRef) -> None:
        """The guard's :data:`~spotgpu.ports.kube.OwnerBackHandler`: evict at once, on the guard's thread."""
        try:
            self.solver.owner_back(owner)
        except Exception:
            log.exception("handling the guard's owner-back signal for %s failed", owner)

    def _sweep(self, devices: Sequence[DeviceID], pods: Sequence[PodRef]) -> tuple[int, int]:
        """Kill the processes on ``devices`` that belong to ``pods`` (by the pod UID or a known
        container ID in their cgroup); returns (killed, still running at the deadline)."""
        infos = self.pods.known(pods)
        uids = {i.uid for i in infos if i.uid}
        cids = {c.container_id for i in infos for c in i.containers if c.container_id}
        try:
            processes = self.backend.processes()
        except SpotgpuError as exc:
            log.warning("sweep: GPU process list failed: %s", exc)
            return 0, 0
        candidates = {p.pid for d in devices for p in processes.get(d, ())}

        def owner(identity: CgroupIdentity) -> str | None:
            if identity.container_id is not None and identity.container_id in cids:
                return identity.container_id
            return identity.pod_uid if identity.pod_uid in uids else None

        reaped = kill_and_wait(candidates, owner, time.monotonic() + self.config.eviction_timeout)
        return sum(map(len, reaped.killed.values())), sum(map(len, reaped.alive.values()))

    def owner_of(self, device: str) -> Owner | None:
        """Who owns real ``device`` (for spotgpu-runtime's check that a sync source is the owner)."""
        return self.solver.owner_of(device)

    def lendable(self, device: str) -> bool | None:
        """Whether real ``device`` may go to spot work now (spotgpu-runtime's lend rule)."""
        return self.solver.lendable(device)

    # -- life cycle ----------------------------------------------------------------------------
    def start(self, *, serve_metrics: bool = True, loops: bool = True) -> None:
        """Start everything in the order of the module docstring."""
        self._stop.clear()
        self._start_guard()
        self.solver.set_devices(self.backend.devices())
        self.pods.load(self.kube.list_node_pods(self.node))
        self.recover()
        if self._runtime_factory is not None:
            self.runtime_service = self._runtime_factory(self)
            self.runtime_service.start()
            self.metrics.watch_runtime(self.runtime_service.counts)
        for plugin in self.plugins.values():
            plugin.start()
        if self.twin_host is not None:
            self.twin_host.start()
        if serve_metrics:
            self.metrics_port = self.metrics.serve(self.config.metrics_address)
            if self.config.debug_address:
                self.debug_port = self.metrics.serve_debug(self.config.debug_address, self.debug_state)
        if loops:
            self._spawn("pod-watch", partial(self.pods.watch, self.kube, self.node, self._stop))
            self._spawn("detect", self._detect_loop)
            self._spawn("allocate-refresh", self._refresh_after_allocate)
            if self.holder_watch is not None:
                self._spawn("holder-watch", partial(self.holder_watch.run, self._stop))

    def _start_guard(self) -> None:
        if self.guard is None:
            return
        self.guard.start()
        if self.guard.available and not self.guard.wait_attached(GUARD_ATTACH_WAIT):
            log.warning(
                "guard: not attached to its fd holder after %.1fs; lent owners are re-armed anyway "
                "and covered once it attaches",
                GUARD_ATTACH_WAIT,
            )

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"agent-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads.clear()
        for plugin in self.plugins.values():
            plugin.stop()
        if self.twin_host is not None:
            self.twin_host.stop()
        if self.runtime_service is not None:
            self.runtime_service.stop()
            self.runtime_service = None
        if self.guard is not None:
            self.guard.stop()
        self.metrics.close()
        self._pinner.shutdown(wait=True, cancel_futures=True)
        self.solver.close()

    # -- recovery and reconcile -----------------------------------------------------------------
    def recover(self) -> list[EvictionOutcome]:
        """Rebuild state from the node and the cluster, finish evictions under way, then judge
        every lent owner at once (see module docstring)."""
        outcomes = self.reconcile(recovering=True)
        deleting = self.pods.deleting()
        if deleting:
            runtime = self._runtime()
            ids = sorted({c for p in deleting for c in victim_container_ids(p.ref, p, runtime or [])})
            if ids:
                log.info("recovery: stopping tasks of %d pod(s) being deleted: %s", len(deleting), ids)
                self.tasks.stop_tasks(ids, grace=self.config.sigterm_grace, timeout=10.0)
                if isinstance(self.tasks, PinningTaskPort):
                    self.tasks.after_release()  # nobody waits: containerd may hear of the stops now
        self.detect_once(reconcile=False)
        return outcomes

    def _runtime(self) -> list[RuntimeContainer] | None:
        try:
            return self.tasks.list_containers()
        except SpotgpuError as exc:
            self.metrics.detector_errors.labels(kind="runtime_list").inc()
            log.warning("listing containers failed: %s", exc)
            return None

    def _yield_to_returns(self) -> None:
        """Wait while an owner's return is in flight (``deferDetection``): detection takes the
        solver's lock, the GIL and a CPU the eviction and the released owner need."""
        if self.config.eviction.defer_detection and self.solver.returns.active:
            self.solver.returns.wait_clear(self.config.eviction_timeout + 1.0)

    def reconcile(self, recovering: bool = False) -> list[EvictionOutcome]:
        """Re-read the node's view and refresh the solver. Until one refresh succeeded, every
        refresh is a recovering one (a pod-resources outage at start must not skip recovery)."""
        self._yield_to_returns()
        with self._reconcile_lock:
            try:
                allocations = self.pod_resources.list()
            except SpotgpuError as exc:
                self.metrics.detector_errors.labels(kind="pod_resources").inc()
                log.warning("pod-resources List failed; keeping the previous mapping: %s", exc)
                return []
            recovering = recovering or not self._recovered
            pods = self.pods.by_ref()
            runtime = None
            now = time.monotonic()
            if recovering or now - self._runtime_at >= RUNTIME_LIST_INTERVAL:
                runtime = self._runtime()  # container IDs by CRI labels: a fallback to the API's
                self._runtime_at = now
            outcomes = self.solver.refresh(allocations, pods, runtime, recovering=recovering)
            self._recovered = True
            self._owner_record.update(self.solver.mapping)
            return outcomes

    def on_pod_event(self, event: PodEvent) -> None:
        """The pod watch's handler (public so a harness without a watch can feed events)."""
        self.pods.on_event(event)
        if event.type is not PodEventType.DELETED:
            self._pin_spot_containers(event.pod)

    def _pin_spot_containers(self, pod: PodInfo) -> None:
        """A spot container the watch reports started is pinned at once, on the pinner's thread
        (an owner may return before the next detection cycle would name it)."""
        if not self.config.eviction.pin_pidfds:
            return
        spot = set(self.solver.resources)
        ids = [c.container_id for c in pod.containers if c.container_id and spot.intersection(c.requests)]
        if ids:
            with contextlib.suppress(RuntimeError):  # stopped: nothing to prepare for
                self._pinner.submit(self.solver.evictor.prepare, ids)

    # -- detection ---------------------------------------------------------------------------------
    def _detect_loop(self) -> None:
        interval = self.config.detect_interval
        next_at = time.monotonic() + interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += interval
            if next_at < time.monotonic():
                next_at = time.monotonic() + interval
            try:
                self.detect_once()
            except Exception:
                self.metrics.detector_errors.labels(kind="cycle").inc()
                log.exception("detection cycle failed")

    def detect_once(self, *, reconcile: bool = True) -> CycleReport:
        """One detection cycle: refresh the mapping, measure, judge every owner, act. Each step
        first waits while an owner's return is in flight (:meth:`_yield_to_returns`)."""
        cpu0, wall0 = time.process_time(), time.perf_counter()
        self._yield_to_returns()
        devices = self.solver.devices()
        try:
            devices_now = self.backend.devices()
            if devices_now != devices:
                self.solver.set_devices(devices_now)
                devices = devices_now
        except SpotgpuError as exc:
            self.metrics.detector_errors.labels(kind="inventory").inc()
            log.warning("GPU inventory failed: %s", exc)
        if reconcile:
            self.reconcile()
        self._yield_to_returns()
        samples = self._measurer.samples(devices, self.solver.watched_owners)
        self._yield_to_returns()
        events = self.solver.observe(samples)
        self.solver.account()
        self.solver.annotate()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        self.metrics.detect_cycle_seconds.observe(wall)
        return CycleReport(tuple(events), cpu, wall)

    # -- state dump ----------------------------------------------------------------------------------
    def _record_eviction(self, outcome: EvictionOutcome) -> None:
        self._evictions.record(outcome)
        if self.holder_watch is not None and isinstance(outcome.plan.owner, ContainerRef):
            self.holder_watch.note_loan(outcome.plan.owner)  # a loan just ended: watch its GPUs

    def debug_state(self) -> dict[str, Any]:
        """What the agent believes now, as JSON data (served on ``/debug/state``): the
        MappingCache, each owner's lending state, each twin's health, the guard, the runtime
        service's answers and the recent evictions (monotonic times)."""
        return debug_state(
            node=self.node,
            recovered=self._recovered,
            solver=self.solver,
            guard=self.guard,
            runtime=self.runtime_service,
            evictions=self._evictions,
            clock=self.clock,
        )


__all__ = ["Agent", "CycleReport", "RuntimeServiceFactory", "TwinHostFactory"]
