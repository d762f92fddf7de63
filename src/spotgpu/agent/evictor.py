"""The evictor: stop every spot task of a plan, verify it, release the owner, delete the pods.

Decides nothing (the plan comes from :func:`~spotgpu.agent.model.plan_eviction`, the decision
to evict from :mod:`spotgpu.core.lending`). Side effects, all through ports: container tasks
(stop, list), the sweep hook (kill what still runs on the GPUs through ``/proc``), the
Kubernetes API (delete pods, retried within a budget; leftovers retried later), metrics, the
MappingCache (victims forgotten) and the release callback the caller passes.

Interface: :meth:`Evictor.evict` runs one plan on the calling thread, in this order, and
returns an :class:`EvictionOutcome` with its timings:

1. victims without a container ID are completed from a fresh containerd listing (by CRI labels);
2. eviction metrics (reason, spot user's namespace; once per pod);
3. every spot container task is stopped (optional bounded SIGTERM grace, then SIGKILL) and each
   stop verified; containers not verified stopped are remembered and stopped again by
   :meth:`retry_pending`; victims still unverified are swept off the plan's GPUs;
4. the MappingCache forgets the victims and ``release()`` is called: the owner's held call may
   proceed now, on clean GPUs (``release`` is called exactly once, also when a step fails);
5. the pods are deleted through the Kubernetes API in parallel, retried within
   ``delete_budget`` seconds of real time (:class:`~spotgpu.core.clock.Timer`); leftovers are
   retried by :meth:`retry_pending`.

This module holds no lock of the solver's: the steps before ``release`` wait only on container
tasks (a future version may kill all victims in parallel before verifying any). Its own small
lock guards the pending stops and deletions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.agent.model import EvictionPlan, runtime_container_ids
from spotgpu.agent.ports import KubePort
from spotgpu.agent.settings import EvictionSettings
from spotgpu.core.clock import Clock, Timer
from spotgpu.core.errors import SpotgpuError, TemporaryError
from spotgpu.core.ids import DeviceID
from spotgpu.core.mapping_cache import MappingCache
from spotgpu.core.refs import PodRef
from spotgpu.core.types import EvictionReason
from spotgpu.ports.node import RuntimeContainer, TaskPort, TaskState

log = logging.getLogger(__name__)

SweepFn = Callable[[tuple[DeviceID, ...], Sequence[PodRef]], tuple[int, int]]
"""Kills what still runs on the devices for the pods; returns (killed, still running)."""
ReleaseFn = Callable[[], float]
"""Releases the plan's owner; returns when it did (monotonic seconds)."""


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


class Evictor:
    """Executes eviction plans (see module docstring)."""

    def __init__(
        self,
        *,
        tasks: TaskPort,
        kube: KubePort,
        metrics: AgentMetrics,
        clock: Clock,
        timer: Timer,
        mapping: MappingCache,
    ) -> None:
        self.tasks = tasks
        self.kube = kube
        self.metrics = metrics
        self.clock = clock
        self.timer = timer
        self.mapping = mapping
        self._lock = threading.Lock()
        self._evicted: dict[PodRef, float] = {}
        """Pods evicted and not gone yet (counted once in the eviction metric)."""
        self._pending_deletes: dict[PodRef, _Pending] = {}
        self._pending_stops: set[str] = set()
        """Spot containers an eviction could not verify stopped: stopped again by :meth:`retry_pending`."""
        self._deleter = ThreadPoolExecutor(max_workers=8, thread_name_prefix="evict-delete")
        self.sweep: SweepFn | None = None
        self.on_runtime: Callable[[list[RuntimeContainer]], None] | None = None
        """Receives a containerd listing made for victims without container IDs."""

    def close(self) -> None:
        self._deleter.shutdown(wait=True, cancel_futures=True)

    def evict(self, plan: EvictionPlan, settings: EvictionSettings, release: ReleaseFn) -> EvictionOutcome:
        """Run ``plan`` (steps 1-5 of the module docstring)."""
        released_at: float | None = None
        try:
            plan = self._complete_victims(plan)
            self._count(plan)
            failed = self._stop(plan, settings)
            self._sweep(plan, set(failed))
            stopped_at = self.clock.monotonic()
            self.metrics.eviction_seconds.labels(reason=plan.reason.value).observe(max(0.0, stopped_at - plan.at))
            for victim in plan.victims:
                self.mapping.remove_user(victim.pod)
            released_at = release()  # the GPUs are clean: the owner's call proceeds now
            undeleted = self._delete_pods(plan, settings)
        finally:
            if released_at is None:
                released_at = release()
        completed_at = self.clock.monotonic()
        self.metrics.eviction_complete_seconds.labels(reason=plan.reason.value).observe(
            max(0.0, completed_at - plan.at)
        )
        log.info(
            "owner %s devices %s: eviction done in %.1f ms (tasks stopped after %.1f ms, owner released after %.1f ms)",
            plan.owner,
            list(plan.devices),
            (completed_at - plan.at) * 1000,
            (stopped_at - plan.at) * 1000,
            (released_at - plan.at) * 1000,
        )
        return EvictionOutcome(plan, stopped_at, completed_at, tuple(failed), undeleted, released_at)

    def _count(self, plan: EvictionPlan) -> None:
        for victim in plan.victims:
            with self._lock:
                first = victim.pod not in self._evicted
                self._evicted.setdefault(victim.pod, plan.at)
            if first:
                self.metrics.evictions.labels(reason=plan.reason.value, namespace=victim.pod.namespace or "").inc()
            log.info(
                "evict %s from owner %s devices %s (reason %s): stopping containers %s",
                victim.pod,
                plan.owner,
                list(victim.devices),
                plan.reason.value,
                list(victim.container_ids),
            )

    def _stop(self, plan: EvictionPlan, settings: EvictionSettings) -> list[str]:
        """Stop and verify every task of the plan; the IDs not verified stopped."""
        if not plan.container_ids:
            return []
        failed: list[str] = []
        results = self.tasks.stop_tasks(plan.container_ids, grace=settings.sigterm_grace, timeout=settings.stop_timeout)
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
        return failed

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
        if self.on_runtime is not None:
            self.on_runtime(list(runtime))
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

    # -- pod deletion -------------------------------------------------------------------------
    def _delete_one(self, pod: PodRef, reason: EvictionReason, message: str, deadline: float) -> bool:
        delay = 0.02
        while True:
            try:
                self.kube.delete_pod(pod, reason=reason, message=message, grace_seconds=0)
                return True
            except TemporaryError as exc:
                if self.timer.monotonic() + delay > deadline:
                    log.warning("deleting %s failed (will retry later): %s", pod, exc)
                    return False
                self.timer.sleep(delay)
                delay = min(delay * 2, 0.5)
            except Exception as exc:
                log.error("deleting %s failed: %s", pod, exc)
                return False

    def _delete_pods(self, plan: EvictionPlan, settings: EvictionSettings) -> tuple[PodRef, ...]:
        if not plan.victims:
            return ()
        deadline = self.timer.monotonic() + settings.delete_budget
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

    # -- leftovers ------------------------------------------------------------------------------
    def retry_pending(self, settings: EvictionSettings) -> None:
        """Stop again the containers not verified stopped, delete again the pods not deleted."""
        with self._lock:
            stops = sorted(self._pending_stops)
        if stops:
            for result in self.tasks.stop_tasks(stops, grace=0.0, timeout=settings.stop_timeout):
                if result.state is TaskState.FAILED:
                    log.warning("spot container %s still not verified stopped: %s", result.container_id, result.detail)
                    continue
                log.info("spot container %s now verified stopped (%s)", result.container_id, result.state.value)
                with self._lock:
                    self._pending_stops.discard(result.container_id)
        with self._lock:
            deletes = list(self._pending_deletes.items())
        for pod, entry in deletes:
            entry.attempts += 1
            message = f"spotgpu: evicted ({entry.reason.value}); retry {entry.attempts}"
            if self._delete_one(pod, entry.reason, message, self.timer.monotonic()):
                with self._lock:
                    self._pending_deletes.pop(pod, None)

    def prune(self, live: Collection[PodRef], pods: Collection[PodRef]) -> None:
        """Forget evicted pods no longer ``live`` (users or known pods), and pending deletions
        of pods the API no longer has."""
        with self._lock:
            for pod in [p for p in self._evicted if p not in live]:
                del self._evicted[pod]
            for pod in [p for p in self._pending_deletes if p not in pods]:
                del self._pending_deletes[pod]


__all__ = ["EvictionOutcome", "Evictor", "ReleaseFn", "SweepFn"]
