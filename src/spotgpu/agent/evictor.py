"""The evictor: stop every spot task of a plan, verify it, release the owner, delete the pods.

Decides nothing (the plan comes from :func:`~spotgpu.agent.model.plan_eviction`, the decision
to evict from :mod:`spotgpu.core.lending`). Side effects, all through ports: container tasks
(pin, stop, list, the runtime's deferred bookkeeping), the sweep hook (kill what still runs on
the GPUs through ``/proc``), the Kubernetes API (delete pods, retried within a budget;
leftovers retried later), metrics, the MappingCache (victims forgotten), the release callbacks
the caller passes, and the eviction executor's threads (:class:`EvictionExecutor`).

Interface: :meth:`Evictor.evict` runs one plan and returns an :class:`EvictionOutcome` with its
timings. The owner's part (steps 1-4, up to the release) runs on the eviction executor, a
thread at raised scheduling priority (``agent.eviction.realtime``), while the calling thread
waits; the rest on the calling thread:

1. victims without a container ID are completed from a fresh containerd listing (by CRI labels);
2. eviction metrics (reason, spot user's namespace; once per pod);
3. every spot container task is stopped (optional bounded SIGTERM grace, then SIGKILL to all of
   them before any stop is verified) and each stop verified; containers not verified stopped
   are remembered and stopped again by :meth:`retry_pending`; victims still unverified are
   swept off the plan's GPUs;
4. the release check (:class:`~spotgpu.ports.node.ReleaseCheck`, :mod:`spotgpu.core.holders`):
   every process outside the owner's pod holding its GPU nodes (in a victim pod's unlisted
   container or any other pod), or a shared control node without holding a GPU, is killed and
   verified gone, found by what it holds;
   then the MappingCache forgets the victims and ``release()`` is called: the owner's held call
   may proceed now, on clean GPUs (``release`` is called exactly once, also when a step fails);
5. on the calling thread, at normal priority (:func:`~spotgpu.util.priority.normal_priority`):
   ``released()`` (the caller's bookkeeping: state, publication, the lending record), the
   metrics and log lines, then the pods are deleted through the Kubernetes API in parallel,
   retried within ``delete_budget`` seconds of real time (:class:`~spotgpu.core.clock.Timer`;
   leftovers are retried by :meth:`retry_pending`), and last the container runtime's deferred
   bookkeeping (:meth:`~spotgpu.ports.node.PinningTaskPort.after_release`).

Before a return: :meth:`Evictor.prepare` hands the task port the spot containers a return
would stop, so it can pin their processes (no containerd call before the kill).

This module holds no lock of the solver's. Its own small lock guards the pending stops and
deletions. :class:`ReturnsInFlight` counts owner returns in flight (the solver: from the
guard's signal until the eviction is complete), so detection can step aside meanwhile
(``agent.eviction.deferDetection``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TypeVar

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.agent.model import EvictionPlan, runtime_container_ids
from spotgpu.agent.settings import EvictionSettings
from spotgpu.core.clock import Clock, Timer
from spotgpu.core.errors import SpotgpuError, TemporaryError
from spotgpu.core.holders import ReleaseReport, Verdict
from spotgpu.core.ids import DeviceID
from spotgpu.core.mapping_cache import MappingCache
from spotgpu.core.refs import PodRef
from spotgpu.core.types import EvictionReason
from spotgpu.ports.kube import KubePort
from spotgpu.ports.node import (
    PinningTaskPort,
    ReleaseCheck,
    RuntimeContainer,
    TaskPort,
    TaskState,
    TaskStopResult,
)
from spotgpu.util.priority import Priority, normal_priority, raise_thread

log = logging.getLogger(__name__)
T = TypeVar("T")

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
    started_at: float | None = None
    """When the eviction executor began stopping the tasks (after the caller's planning)."""
    holders: ReleaseReport | None = None
    """What the release check found and did (None: no check configured)."""

    @property
    def stop_latency(self) -> float:
        return self.tasks_stopped_at - self.plan.at


@dataclass
class _Pending:
    reason: EvictionReason
    attempts: int = 0


@dataclass(frozen=True, slots=True)
class _OwnerPart:
    plan: EvictionPlan
    results: tuple[TaskStopResult, ...]
    started_at: float
    stopped_at: float
    released_at: float
    holders: ReleaseReport | None = None


STOPPED_MEMORY = 60.0
"""Seconds a verified stop is remembered (:meth:`Evictor.stopped_lately`)."""

EXECUTOR_THREADS = 4
"""Owners whose evictions run at once (each thread is busy only until its owner's release)."""


class EvictionExecutor:
    """Long-lived threads that run the owner's part of evictions, at raised scheduling priority
    when ``realtime`` (:func:`~spotgpu.util.priority.raise_thread`); one is started (and raised)
    at construction, so the first return pays neither a thread start nor a priority change."""

    PREFIX = "spotgpu-evict"

    def __init__(self, *, realtime: bool = True, threads: int = EXECUTOR_THREADS) -> None:
        self.realtime = realtime
        self.priorities: list[Priority] = []
        """What each thread got (the kernel may refuse ``SCHED_RR``: then nice -10, or normal)."""
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=self.PREFIX, initializer=self._raise)
        self._pool.submit(lambda: None).result()

    def _raise(self) -> None:
        if self.realtime:
            self.priorities.append(raise_thread())

    def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on one of the executor's threads (on the calling thread if it is one);
        returns its result or raises its exception."""
        if threading.current_thread().name.startswith(self.PREFIX):
            return fn()
        return self._pool.submit(fn).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class ReturnsInFlight:
    """Owner returns in flight. :meth:`enter` when one starts; the ticket's :meth:`Ticket.leave`
    (idempotent) when it is done."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count = 0

    def enter(self) -> Ticket:
        with self._cond:
            self._count += 1
        return Ticket(self)

    def _leave(self) -> None:
        with self._cond:
            self._count -= 1
            if self._count == 0:
                self._cond.notify_all()

    @property
    def active(self) -> bool:
        return self._count > 0

    def wait_clear(self, timeout: float) -> bool:
        """Block while a return is in flight, at most ``timeout`` seconds; True when none is."""
        with self._cond:
            return self._cond.wait_for(lambda: self._count == 0, timeout)


class Ticket:
    """One return in flight (see :class:`ReturnsInFlight`)."""

    def __init__(self, returns: ReturnsInFlight) -> None:
        self._returns: ReturnsInFlight | None = returns
        self._lock = threading.Lock()

    def leave(self) -> None:
        with self._lock:
            returns, self._returns = self._returns, None
        if returns is not None:
            returns._leave()


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
        release_check: ReleaseCheck | None = None,
        realtime: bool = True,
    ) -> None:
        self.tasks = tasks
        self.release_check = release_check
        """The release invariant (None: not enforced; only test doubles of a node without /proc)."""
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
        self._stopped: dict[str, float] = {}
        """Container ID -> when an eviction verified it stopped (monotonic seconds)."""
        """Spot containers an eviction could not verify stopped: stopped again by :meth:`retry_pending`."""
        self._deleter = ThreadPoolExecutor(max_workers=8, thread_name_prefix="evict-delete")
        self.executor = EvictionExecutor(realtime=realtime)
        self.sweep: SweepFn | None = None
        self.on_runtime: Callable[[list[RuntimeContainer]], None] | None = None
        """Receives a containerd listing made for victims without container IDs."""

    def close(self) -> None:
        self.executor.close()
        self._deleter.shutdown(wait=True, cancel_futures=True)

    def prepare(self, container_ids: Collection[str]) -> None:
        """Before a return: the spot containers a return would stop now (the task port pins
        their processes when it can)."""
        if isinstance(self.tasks, PinningTaskPort):
            self.tasks.pin(container_ids)

    def evict(
        self,
        plan: EvictionPlan,
        settings: EvictionSettings,
        release: ReleaseFn,
        released: Callable[[], None] | None = None,
    ) -> EvictionOutcome:
        """Run ``plan`` (steps 1-5 of the module docstring)."""
        part = self.executor.run(lambda: self._owner_part(plan, settings, release))
        with normal_priority():  # the owner runs now: nothing below may delay its wake-up
            return self._after_release(part, settings, released)

    def _after_release(
        self, part: _OwnerPart, settings: EvictionSettings, released: Callable[[], None] | None
    ) -> EvictionOutcome:
        """Step 5 and the reports, on the calling thread at normal priority."""
        plan = part.plan
        self.metrics.eviction_seconds.labels(reason=plan.reason.value).observe(max(0.0, part.stopped_at - plan.at))
        try:
            if released is not None:
                released()
            self._count(plan)
            self._report(plan, part.results)
            self._report_holders(plan, part.holders)
            undeleted = self._delete_pods(plan, settings)
        finally:
            self._runtime_bookkeeping()  # last: containerd's work must not compete with the owner's first steps
        completed_at = self.clock.monotonic()
        self.metrics.eviction_complete_seconds.labels(reason=plan.reason.value).observe(
            max(0.0, completed_at - plan.at)
        )
        log.info(
            "owner %s devices %s: eviction done in %.1f ms (tasks stopped after %.1f ms, owner released after %.1f ms)",
            plan.owner,
            list(plan.devices),
            (completed_at - plan.at) * 1000,
            (part.stopped_at - plan.at) * 1000,
            (part.released_at - plan.at) * 1000,
        )
        failed = tuple(r.container_id for r in part.results if r.state is TaskState.FAILED)
        return EvictionOutcome(
            plan, part.stopped_at, completed_at, failed, undeleted, part.released_at, part.started_at, part.holders
        )

    def _owner_part(self, plan: EvictionPlan, settings: EvictionSettings, release: ReleaseFn) -> _OwnerPart:
        """Steps 1-4: everything the owner waits for, on the eviction executor, and nothing
        else (no log line per victim, no metric, no file): the executor is idle again the moment
        the owner is released."""
        started_at = self.clock.monotonic()
        released_at: float | None = None
        try:
            plan = self._complete_victims(plan)
            results = self._stop(plan.container_ids, settings)
            failed = [r.container_id for r in results if r.state is TaskState.FAILED]
            self._sweep(plan, set(failed))
            stopped_at = self.clock.monotonic()
            report = self._clear_holders(plan, settings)
            for victim in plan.victims:
                self.mapping.remove_user(victim.pod)
            released_at = release()  # the GPUs are clean: the owner's call proceeds now
        finally:
            if released_at is None:
                released_at = release()
        return _OwnerPart(plan, tuple(results), started_at, stopped_at, released_at, report)

    def _clear_holders(self, plan: EvictionPlan, settings: EvictionSettings) -> ReleaseReport | None:
        """Step 4a, the release invariant: no process but the owner's holds its GPUs now (every
        other holder, in a victim pod or elsewhere, killed and verified)."""
        if self.release_check is None:
            return None
        try:
            return self.release_check.clear(plan.devices, plan.scope, self.clock.monotonic() + settings.stop_timeout)
        except Exception:
            log.exception("owner %s: the release check failed", plan.owner)
            return ReleaseReport(remaining=(), rounds=0, owner_known=False)

    def _runtime_bookkeeping(self) -> None:
        if isinstance(self.tasks, PinningTaskPort):
            try:
                self.tasks.after_release()
            except Exception:
                log.exception("the container runtime's bookkeeping after a release failed")

    def _count(self, plan: EvictionPlan) -> None:
        for victim in plan.victims:
            with self._lock:
                first = victim.pod not in self._evicted
                self._evicted.setdefault(victim.pod, plan.at)
            if first:
                self.metrics.evictions.labels(reason=plan.reason.value, namespace=victim.pod.namespace or "").inc()
            log.info(
                "evicted %s from owner %s devices %s (reason %s): containers %s",
                victim.pod,
                plan.owner,
                list(victim.devices),
                plan.reason.value,
                list(victim.container_ids),
            )

    def _stop(self, container_ids: Sequence[str], settings: EvictionSettings) -> list[TaskStopResult]:
        """Stop and verify these tasks; remembers the ones not verified stopped."""
        if not container_ids:
            return []
        results = self.tasks.stop_tasks(container_ids, grace=settings.sigterm_grace, timeout=settings.stop_timeout)
        now = self.clock.monotonic()
        with self._lock:
            self._pending_stops.update(r.container_id for r in results if r.state is TaskState.FAILED)
            self._stopped.update((r.container_id, now) for r in results if r.state is not TaskState.FAILED)
        return results

    def stopped_lately(self, container_ids: Collection[str], within: float) -> bool:
        """Whether every one of ``container_ids`` (at least one) was verified stopped by an
        eviction in the last ``within`` seconds: a view of the node read before that eviction's
        pod deletions (pod-resources still listing the pod) names dead work, not a violation."""
        now = self.clock.monotonic()
        with self._lock:
            return bool(container_ids) and all(
                now - self._stopped.get(c, -float("inf")) <= within for c in container_ids
            )

    def _report(self, plan: EvictionPlan, results: Sequence[TaskStopResult]) -> None:
        """Metrics and one log line per stop (after the release)."""
        for result in results:
            if result.state is TaskState.FAILED:
                self.metrics.task_stop_failures.inc()
                log.error(
                    "owner %s: spot container %s not verified stopped: %s",
                    plan.owner,
                    result.container_id,
                    result.detail,
                )
            else:
                log.info(
                    "owner %s: spot container %s %s (exit %s%s)",
                    plan.owner,
                    result.container_id,
                    result.state.value,
                    result.exit_status,
                    f"; {result.detail}" if result.detail else "",
                )

    def _report_holders(self, plan: EvictionPlan, report: ReleaseReport | None) -> None:
        """Metrics and log lines of the release check (after the release)."""
        if report is None:
            return
        self.metrics.release_check_seconds.observe(report.seconds)
        for verdict, count in report.killed.items():
            self.metrics.release_holders_killed.labels(verdict=verdict.value).inc(count)
            log_fn = log.info if verdict is Verdict.VICTIM_POD else log.error
            log_fn("owner %s: release check killed %d process(es): %s", plan.owner, count, verdict.value)
        if not report.owner_known:
            self.metrics.release_unclean.labels(why="owner-unknown").inc()
            log.error("owner %s: its pod is unknown: the release check could not judge GPU holders", plan.owner)
        if report.remaining:
            self.metrics.release_unclean.labels(why="holder-alive").inc()
            log.error(
                "owner %s released with %d condemned process(es) still alive after %d scan(s): %s",
                plan.owner,
                len(report.remaining),
                report.rounds,
                [(h.pid, h.pod_uid) for h in report.remaining],
            )

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
            self._runtime_bookkeeping()
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
            horizon = self.clock.monotonic() - STOPPED_MEMORY
            for cid in [c for c, at in self._stopped.items() if at < horizon]:
                del self._stopped[cid]
            for pod in [p for p in self._pending_deletes if p not in pods]:
                del self._pending_deletes[pod]


__all__ = [
    "EvictionExecutor",
    "EvictionOutcome",
    "Evictor",
    "ReleaseFn",
    "ReturnsInFlight",
    "SweepFn",
    "Ticket",
]
