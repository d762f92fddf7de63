"""The GangJob controller's I/O: informers in, :func:`spotgpu.kube.gangjob.reconcile` plans out to the API.

Side effects: watches GangJobs, and the PodGroups and pods labelled with a GangJob, in all
namespaces; creates and deletes PodGroups and pods; patches GangJob status. Acts only while
``may_act()`` is true (the leader election of the ``spotgpu scheduler`` process).

A work queue of GangJob keys (``namespace/name``) with de-duplication and delayed requeue
(backoff timers) feeds one worker thread; any event on a job, or on a pod or PodGroup carrying
its label, queues the job. Failures of an apply are retried with backoff by requeueing the key
(the next reconcile starts again from the cache, so a partial apply is completed, never repeated
blindly: creates that find the object present are success, deletes that find it gone too).
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightkube.generic_resource import GenericNamespacedResource
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from spotgpu.core import keys
from spotgpu.core.clock import Clock, SystemClock
from spotgpu.kube.client import AlreadyExists, Connection, NotFound, Retrier, api_errors
from spotgpu.kube.events import WARNING, EventRecorder
from spotgpu.kube.gangjob import CreateObject, DeleteObject, PatchStatus, Plan, reconcile
from spotgpu.kube.informer import EventType, Informer, WatchTarget, collection_path, stop_all
from spotgpu.kube.metrics import ControllerMetrics
from spotgpu.kube.objects import disruption
from spotgpu.kube.resources import GROUP, VERSION, GangJobResource, PodGroupResource, name_of, namespace_of

log = logging.getLogger(__name__)

JSON = dict[str, Any]


class WorkQueue:
    """Keys to process: each at most once in the queue; ``add_after`` schedules a later visit."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._ready: list[str] = []
        self._queued: set[str] = set()
        self._timers: list[tuple[float, int, str]] = []
        self._seq = 0
        self._closed = False

    def add(self, key: str) -> None:
        with self._cond:
            if key not in self._queued:
                self._queued.add(key)
                self._ready.append(key)
                self._cond.notify()

    def add_after(self, key: str, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            self._seq += 1
            heapq.heappush(self._timers, (self._clock.monotonic() + delay, self._seq, key))
            self._cond.notify()

    def get(self, timeout: float) -> str | None:
        """The next key, or None after ``timeout`` seconds or when closed."""
        with self._cond:
            waited = 0.0
            while True:
                now = self._clock.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    _, _, key = heapq.heappop(self._timers)
                    if key not in self._queued:
                        self._queued.add(key)
                        self._ready.append(key)
                if self._ready:
                    key = self._ready.pop(0)
                    self._queued.discard(key)
                    return key
                if self._closed or waited >= timeout:
                    return None
                step = min(0.05, timeout - waited)
                self._cond.wait(step)
                waited += step

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._ready) + len(self._timers)


@dataclass(slots=True)
class _Expectations:
    """Pods created by us and not yet seen in the cache, per job key."""

    pending: dict[str, set[str]] = field(default_factory=dict)

    def expect(self, key: str, name: str) -> None:
        self.pending.setdefault(key, set()).add(name)

    def observed(self, key: str, name: str) -> None:
        names = self.pending.get(key)
        if names is not None:
            names.discard(name)

    def of(self, key: str) -> frozenset[str]:
        return frozenset(self.pending.get(key, ()))


def job_key_of(obj: JSON) -> str | None:
    """The GangJob key a pod or PodGroup belongs to (its ``gang-job`` label), or None."""
    job = ((obj.get("metadata") or {}).get("labels") or {}).get(keys.GANG_JOB)
    return f"{namespace_of(obj)}/{job}" if job else None


class GangJobController:
    """Reconciles every GangJob; start() it, and it acts whenever ``may_act()`` is true."""

    def __init__(
        self,
        connection: Connection,
        *,
        may_act: Callable[[], bool] = lambda: True,
        clock: Clock | None = None,
        retrier: Retrier | None = None,
        metrics: ControllerMetrics | None = None,
        idle_timeout: float = 30.0,
        resync: float = 300.0,
        error_backoff: float = 1.0,
        stale_wait: float = 10.0,
        events: EventRecorder | None = None,
    ) -> None:
        self._events = events
        self._connection = connection
        self._client = connection.client
        self._may_act = may_act
        self._clock = clock or SystemClock()
        self._retry = retrier or Retrier()
        self.metrics = metrics
        self._error_backoff = error_backoff
        self.queue = WorkQueue(self._clock)
        self._expect = _Expectations()
        self._written: dict[str, tuple[str, float]] = {}
        self._gone: dict[str, dict[str, str]] = {}
        self._stale_wait = stale_wait
        self._lock = threading.Lock()
        label = keys.GANG_JOB
        common: dict[str, Any] = {"idle_timeout": idle_timeout, "resync": resync}
        self.jobs = Informer(connection, WatchTarget("gangjobs", collection_path(GROUP, VERSION, "gangjobs")), **common)
        self.pods = Informer(
            connection, WatchTarget("gangjob-pods", collection_path("", "v1", "pods"), label_selector=label), **common
        )
        self.podgroups = Informer(
            connection,
            WatchTarget("gangjob-podgroups", collection_path(GROUP, VERSION, "podgroups"), label_selector=label),
            **common,
        )
        self.jobs.add_handler(self._on_job)
        self.pods.add_handler(self._on_member)
        self.podgroups.add_handler(self._on_member)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------- events

    def _on_job(self, kind: EventType, obj: JSON) -> None:
        self.queue.add(f"{namespace_of(obj)}/{name_of(obj)}")

    def _on_member(self, kind: EventType, obj: JSON) -> None:
        key = job_key_of(obj)
        if key is None:
            return
        if obj.get("kind", "Pod") == "Pod":
            with self._lock:
                if kind is not EventType.DELETED:
                    self._expect.observed(key, name_of(obj))
                else:
                    cond = disruption(obj)
                    if cond is not None:
                        self._gone.setdefault(key, {})[name_of(obj)] = str(cond.get("reason") or "")
        self.queue.add(key)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> GangJobController:
        for informer in (self.jobs, self.pods, self.podgroups):
            informer.start()
        self._thread = threading.Thread(target=self._run, name="gangjob-controller", daemon=True)
        self._thread.start()
        return self

    def stop(self, *, wait: bool = True) -> None:
        """Stop reconciling; ``wait`` joins the threads (a process about to exit need not)."""
        self._stop.set()
        self.queue.close()
        if self._thread is not None and wait:
            self._thread.join(timeout=10)
        stop_all((self.jobs, self.pods, self.podgroups), wait=wait)

    def wait_synced(self, timeout: float) -> bool:
        return all(i.wait_synced(timeout) for i in (self.jobs, self.pods, self.podgroups))

    def _run(self) -> None:
        while not self._stop.is_set():
            key = self.queue.get(timeout=0.5)
            if key is None:
                continue
            if not self._may_act() or not (self.jobs.synced and self.pods.synced and self.podgroups.synced):
                self.queue.add_after(key, 1.0)
                continue
            try:
                self.sync(key)
            except Exception as exc:
                log.warning("gangjob %s: %s; retrying", key, exc)
                if self.metrics is not None:
                    self.metrics.errors.labels("gangjob").inc()
                self.queue.add_after(key, self._error_backoff)

    # ----------------------------------------------------------------- one job

    def sync(self, key: str) -> Plan | None:
        """Reconcile one job from the caches and apply the plan; raises on a failed apply.

        A job whose cached version is not yet the one our last status write produced is not
        reconciled (its MODIFIED event requeues it): deciding from a status older than our own
        write would undo it (count an eviction twice, delete the members of the new attempt).
        """
        job = self.jobs.store.get(key)
        if job is None:
            with self._lock:
                self._expect.pending.pop(key, None)
                self._written.pop(key, None)
            return None
        rv = str((job.get("metadata") or {}).get("resourceVersion") or "")
        with self._lock:
            written = self._written.get(key)
            if written is not None:
                if rv != written[0] and self._clock.monotonic() < written[1]:
                    self.queue.add_after(key, 0.5)
                    return None
                del self._written[key]
        pods = [p for p in self.pods.store.items() if job_key_of(p) == key]
        groups = [g for g in self.podgroups.store.items() if job_key_of(g) == key]
        with self._lock:
            expected = self._expect.of(key)
            gone = dict(self._gone.get(key, {}))
        plan = reconcile(job, groups, pods, now=self._clock.time(), expected=expected, gone=gone)
        if plan.evicted:
            with self._lock:
                self._gone.pop(key, None)
        self._apply(key, rv, plan)
        if plan.evicted and self.metrics is not None:
            self.metrics.gang_evictions.labels(plan.eviction_reason or "unknown").inc()
        if plan.refused:
            log.warning("gangjob %s: template refused, no pod created: %s", key, "; ".join(plan.refused))
            if self.metrics is not None:
                self.metrics.templates_refused.inc()
        status = plan.status or {}
        if self._events is not None and status.get("phase") in ("Requeued", "Failed"):
            kind = "TemplateRefused" if plan.refused else str(status["phase"])
            self._events.record(job, reason=kind, message=str(status.get("message", "")), type=WARNING)
        if plan.requeue_after is not None:
            self.queue.add_after(key, plan.requeue_after)
        return plan

    def _apply(self, key: str, rv: str, plan: Plan) -> None:
        ns, name = key.split("/", 1)
        for action in plan.actions:
            if isinstance(action, DeleteObject):
                self._delete(action)
            elif isinstance(action, CreateObject):
                if action.kind == "Pod":
                    with self._lock:
                        self._expect.expect(key, name_of(action.obj))
                self._create(action)
            elif isinstance(action, PatchStatus):
                written = self._patch_status(ns, name, rv, action.status)
                with self._lock:
                    self._written[key] = (written, self._clock.monotonic() + self._stale_wait)

    def _patch_status(self, ns: str, name: str, rv: str, status: JSON) -> str:
        """Merge-patch the status, conditional on the version we decided from (409 if it moved)."""
        body = {"metadata": {"resourceVersion": rv}, "status": status}
        what = f"patch status of gangjob {ns}/{name}"
        with api_errors(what):  # a 409 is not retried here: the next reconcile decides anew
            answer = self._client.patch(GangJobResource.Status, name, body, namespace=ns, patch_type=PatchType.MERGE)
        log.info("gangjob %s/%s: status %s", ns, name, status)
        return str(answer.metadata.resourceVersion if answer.metadata else "")

    def _create(self, action: CreateObject) -> None:
        obj = action.obj
        ns = namespace_of(obj)
        what = f"create {action.kind} {ns}/{name_of(obj)}"
        if action.kind == "Pod":
            path = collection_path("", "v1", "pods", ns)
        else:
            path = collection_path(GROUP, VERSION, "podgroups", ns)
        with contextlib.suppress(AlreadyExists):
            self._retry(what, lambda: self._connection.post(path, obj, what))

    def _delete(self, action: DeleteObject) -> None:
        res: type[Pod] | type[GenericNamespacedResource] = Pod if action.kind == "Pod" else PodGroupResource
        with contextlib.suppress(NotFound):  # already gone: done
            self._retry(
                f"delete {action.kind} {action.namespace}/{action.name}",
                lambda: self._client.delete(res, action.name, namespace=action.namespace),
            )
        log.info("deleted %s %s/%s: %s", action.kind, action.namespace, action.name, action.reason)


__all__ = ["GangJobController", "WorkQueue", "job_key_of"]
