"""The scheduler control loop: informer caches -> snapshot -> ``run_cycle`` -> API calls.

Side effects: informers (list+watch) of nodes, spotgpu pods, PodGroups, Queues and
PriorityClasses; API writes through :class:`~spotgpu.kube.apply.Applier`; a background thread.
Scheduling itself is the pure core's (:func:`spotgpu.scheduler.run_cycle`); this module only
translates (:mod:`spotgpu.kube.snapshot`) and applies.

A cycle runs after any change (at most every ``min_interval``) and at least every ``period``,
and only while ``may_act()`` is true: the leader election's :meth:`~spotgpu.kube.leader.LeaderElector.is_leader`
is checked before the snapshot and again before applying, so a replica that lost its Lease
mid-cycle applies nothing.

Informers lag behind our own writes. Like kube-scheduler's "assume", every applied decision
is remembered as an *assumption* (the pod as it will look: bound with its devices, evicting, a
ShadowPod that exists) and laid over the cache until the cache confirms it (or ``assume_ttl``
passes). Without this, the next cycle could see a just-bound pod as pending and place a second
pod on the same GPUs.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightkube.types import PatchType

from spotgpu.core import keys
from spotgpu.core.clock import Clock, SystemClock
from spotgpu.core.errors import ValidationError
from spotgpu.core.refs import PodRef
from spotgpu.kube.agent_port import disruption_condition
from spotgpu.kube.apply import Applier, ApplyConfig, ApplyReport, nomination_annotation, shadow_pod_manifest
from spotgpu.kube.client import Connection, KubeApiError, Retrier
from spotgpu.kube.events import WARNING, EventRecorder
from spotgpu.kube.informer import Informer, WatchTarget, collection_path, object_key, stop_all
from spotgpu.kube.metrics import ControllerMetrics
from spotgpu.kube.objects import disruption, is_deleting
from spotgpu.kube.resources import API_VERSION, GROUP, VERSION, QueueResource, format_time
from spotgpu.kube.snapshot import SnapshotBuild, TranslateConfig, build_snapshot
from spotgpu.scheduler.config import SchedulerConfig
from spotgpu.scheduler.decisions import (
    Bind,
    ClearNomination,
    CreateShadowPod,
    CycleResult,
    Decision,
    DeleteShadowPod,
    Evict,
    Nominate,
    PodGroupPhase,
    PodGroupStatus,
)
from spotgpu.scheduler.model import Snapshot

log = logging.getLogger(__name__)

JSON = dict[str, Any]
CycleFn = Callable[[Snapshot, SchedulerConfig, float], CycleResult]


def _default_cycle(snapshot: Snapshot, config: SchedulerConfig, now: float) -> CycleResult:
    from spotgpu.scheduler import run_cycle

    return run_cycle(snapshot, config, now=now)


@dataclass(slots=True)
class _Assumption:
    obj: JSON | None
    """The pod as we expect it; None: we expect it gone."""
    kind: str
    until: float


@dataclass(slots=True)
class CycleOutcome:
    build: SnapshotBuild
    result: CycleResult | None
    report: ApplyReport | None
    error: str | None = None
    skipped: bool = False


@dataclass(slots=True)
class Assumptions:
    """Applied-but-not-yet-seen pod states, keyed ``namespace/name``."""

    ttl: float
    items: dict[str, _Assumption] = field(default_factory=dict)

    def add(self, key: str, kind: str, obj: JSON | None, now: float) -> None:
        self.items[key] = _Assumption(obj, kind, now + self.ttl)

    def overlay(self, pods: list[JSON], now: float) -> list[JSON]:
        """Pods with assumptions laid over; confirmed or expired assumptions are dropped."""
        by_key = {object_key(p): p for p in pods}
        for key, a in list(self.items.items()):
            current = by_key.get(key)
            if now >= a.until or _confirmed(a, current):
                del self.items[key]
                continue
            if a.obj is None:
                by_key.pop(key, None)
            else:
                by_key[key] = a.obj
        return list(by_key.values())


def _annotation(obj: JSON | None, key: str) -> str | None:
    if obj is None:
        return None
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    return None if value is None else str(value)


def _confirmed(a: _Assumption, current: JSON | None) -> bool:
    if a.kind == "bind":
        return current is None or bool((current.get("spec") or {}).get("nodeName"))
    if a.kind == "create":
        return current is not None
    if a.kind in ("evict", "delete"):
        return current is None or is_deleting(current) or disruption(current) is not None
    if a.kind == "phase":
        assumed = ((a.obj or {}).get("status") or {}).get("phase")
        return current is None or ((current.get("status") or {}).get("phase")) == assumed
    if a.kind == "nominate":
        return current is None or _annotation(current, keys.NOMINATED_DEVICES) == _annotation(
            a.obj, keys.NOMINATED_DEVICES
        )
    return True


class SchedulerLoop:
    def __init__(
        self,
        connection: Connection,
        *,
        may_act: Callable[[], bool] = lambda: True,
        scheduler_config: SchedulerConfig | None = None,
        translate: TranslateConfig | None = None,
        apply: ApplyConfig | None = None,
        metrics: ControllerMetrics | None = None,
        clock: Clock | None = None,
        cycle: CycleFn = _default_cycle,
        period: float = 5.0,
        min_interval: float = 0.2,
        assume_ttl: float = 30.0,
        idle_timeout: float = 30.0,
        resync: float = 300.0,
        retrier: Retrier | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self._may_act = may_act
        self._events = events
        self.scheduler_config = scheduler_config or SchedulerConfig()
        self.translate = translate or TranslateConfig()
        self.metrics = metrics or ControllerMetrics()
        self._clock = clock or SystemClock()
        self._cycle = cycle
        self._period = period
        self._min_interval = min_interval
        self.assumptions = Assumptions(assume_ttl)
        self.group_assumptions = Assumptions(assume_ttl)
        """PodGroup phases we set and the cache has not shown yet (so a cycle never sets them again)."""
        self.applier = Applier(
            connection,
            config=apply,
            retrier=retrier or Retrier(on_retry=self.metrics.on_retry),
            metrics=self.metrics,
            clock=self._clock,
            events=events,
        )
        self._connection = connection
        self._queue_status: dict[str, tuple[int, int]] = {}
        common: dict[str, Any] = {"idle_timeout": idle_timeout, "resync": resync, "handlers": [self._changed]}
        self.nodes = Informer(connection, WatchTarget("nodes", collection_path("", "v1", "nodes")), **common)
        self.pods = Informer(
            connection,
            WatchTarget(
                "pods", collection_path("", "v1", "pods"), field_selector=f"spec.schedulerName={keys.SCHEDULER_NAME}"
            ),
            **common,
        )
        self.podgroups = Informer(
            connection, WatchTarget("podgroups", collection_path(GROUP, VERSION, "podgroups")), **common
        )
        self.queues = Informer(connection, WatchTarget("queues", collection_path(GROUP, VERSION, "queues")), **common)
        self.priority_classes = Informer(
            connection,
            WatchTarget("priorityclasses", collection_path("scheduling.k8s.io", "v1", "priorityclasses")),
            **common,
        )
        self.informers = (self.nodes, self.pods, self.podgroups, self.queues, self.priority_classes)
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.last: CycleOutcome | None = None

    def _changed(self, kind: object, obj: JSON) -> None:
        self._dirty.set()

    # ----------------------------------------------------------------- lifecycle

    def start(self, *, run_thread: bool = True) -> SchedulerLoop:
        for informer in self.informers:
            informer.start()
        if run_thread:
            self._thread = threading.Thread(target=self._run, name="scheduler-loop", daemon=True)
            self._thread.start()
        return self

    def stop(self, *, wait: bool = True) -> None:
        """Stop cycling; ``wait`` joins the threads (a process about to exit need not)."""
        self._stop.set()
        self._dirty.set()
        if self._thread is not None and wait:
            self._thread.join(timeout=30)
        stop_all(self.informers, wait=wait)

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(i.wait_synced(max(0.0, deadline - time.monotonic())) for i in self.informers)

    def _run(self) -> None:
        last = -1e18
        while not self._stop.is_set():
            self._dirty.wait(self._period)
            if self._stop.is_set():
                return
            wait = self._min_interval - (time.monotonic() - last)
            if wait > 0:
                self._stop.wait(wait)
            self._dirty.clear()
            last = time.monotonic()
            try:
                self.run_once()
            except Exception:  # never let the loop die: the next change or period tries again
                log.exception("scheduling cycle failed")
                self.metrics.errors.labels("scheduler").inc()

    # ----------------------------------------------------------------- one cycle

    def build(self) -> SnapshotBuild:
        now = self._clock.monotonic()
        with self._lock:
            pods = self.assumptions.overlay(self.pods.store.items(), now)
            groups = self.group_assumptions.overlay(self.podgroups.store.items(), now)
        build = build_snapshot(
            nodes=self.nodes.store.items(),
            pods=pods,
            podgroups=groups,
            queues=self.queues.store.items(),
            priority_classes=self.priority_classes.store.items(),
            config=self.translate,
        )
        for s in build.skipped:
            self.metrics.snapshot_skipped.labels(s.kind).inc()
            log.debug("left out of the snapshot: %s %s: %s", s.kind, s.key, s.reason)
        self.metrics.forged_shadow_pods.set(len(build.forged_shadows))
        for s in build.forged_shadows:
            log.warning("pod %s %s", s.key, s.reason)
        if build.forecasts_ignored:
            self.metrics.forecasts_ignored.inc(build.forecasts_ignored)
        return build

    def run_once(self) -> CycleOutcome:
        """One cycle now (if leader and synced); returns what happened."""
        leading = self._may_act()
        self.metrics.leader.set(1 if leading else 0)
        for informer in self.informers:
            self.metrics.informer_relists.labels(informer.target.name).set(informer.stats.relists_gone)
        if not leading or not all(i.synced for i in self.informers):
            self.metrics.cycles.labels("skipped").inc()
            outcome = CycleOutcome(SnapshotBuild(Snapshot.of((), ())), None, None, skipped=True)
            self.last = outcome
            return outcome
        started = time.perf_counter()
        build = self.build()
        self.metrics.pending_pods.set(sum(1 for p in build.snapshot.pods if not p.placed))
        try:
            result = self._cycle(build.snapshot, self.scheduler_config, self._clock.time())
        except ValidationError as exc:
            log.error("the snapshot was refused: %s", exc)
            self.metrics.cycles.labels("invalid").inc()
            outcome = CycleOutcome(build, None, None, error=str(exc))
            self.last = outcome
            return outcome
        if not self._may_act():
            log.warning("lost leadership during the cycle; applying nothing")
            self.metrics.cycles.labels("skipped").inc()
            outcome = CycleOutcome(build, result, None, skipped=True)
            self.last = outcome
            return outcome
        report = self.applier.apply(result.decisions())
        self._assume(build, report)
        self.metrics.unschedulable.set(len(result.unschedulable))
        self.metrics.cycles.labels("ok").inc()
        self.metrics.cycle_seconds.observe(time.perf_counter() - started)
        for group, reason in result.reasons().items():
            log.info("gang %s not placed: %s", group, reason)
            if self._events is not None and group.namespace is not None:
                ref = {
                    "apiVersion": API_VERSION,
                    "kind": "PodGroup",
                    "metadata": {"namespace": group.namespace, "name": group.name},
                }
                self._events.record(ref, reason="Unschedulable", message=reason, type=WARNING)
        self._update_queues(build, result)
        outcome = CycleOutcome(build, result, report)
        self.last = outcome
        return outcome

    def _update_queues(self, build: SnapshotBuild, result: CycleResult) -> None:
        """Queue status: gangs pending and running, as of this cycle's decisions (written when changed)."""
        phases = {g.ref: g.phase for g in build.snapshot.groups}
        for status in result.statuses:
            phases[status.group] = status.phase
        counts: dict[str, list[int]] = {q.name: [0, 0] for q in build.snapshot.queues}
        for group in build.snapshot.groups:
            if group.queue in counts:
                counts[group.queue][1 if phases[group.ref] is PodGroupPhase.RUNNING else 0] += 1
        for name, (pending, running) in counts.items():
            if self._queue_status.get(name) == (pending, running):
                continue
            try:
                self._patch_queue(name, {"status": {"pending": pending, "running": running}})
                self._queue_status[name] = (pending, running)
            except KubeApiError as exc:
                log.warning("queue %s status not updated: %s", name, exc)

    def _patch_queue(self, name: str, body: JSON) -> None:
        self.applier.retry(
            f"update status of Queue {name}",
            lambda: self._connection.client.patch(QueueResource.Status, name, body, patch_type=PatchType.MERGE),
        )

    def _assume(self, build: SnapshotBuild, report: ApplyReport) -> None:
        now = self._clock.monotonic()
        stamp = format_time(self._clock.time())
        with self._lock:
            for d in report.applied:
                self._assume_one(build, d, now, stamp)

    def _assume_one(self, build: SnapshotBuild, d: Decision, now: float, stamp: str) -> None:
        def base(ref: PodRef) -> JSON | None:
            obj = build.pod_objects.get(ref)
            return copy.deepcopy(obj) if obj is not None else None

        if isinstance(d, Bind):
            obj = base(d.pod)
            if obj is not None:
                obj.setdefault("spec", {})["nodeName"] = d.node
                obj.setdefault("metadata", {}).setdefault("annotations", {}).update(d.annotations())
                obj["metadata"]["annotations"].pop(keys.NOMINATED_DEVICES, None)
                self.assumptions.add(f"{d.pod.namespace}/{d.pod.name}", "bind", obj, now)
        elif isinstance(d, CreateShadowPod):
            obj = shadow_pod_manifest(d, self.applier.config)
            obj["metadata"]["creationTimestamp"] = stamp
            self.assumptions.add(f"{d.pod.namespace}/{d.pod.name}", "create", obj, now)
        elif isinstance(d, Evict | DeleteShadowPod):
            obj = base(d.pod)
            if obj is not None:
                obj.setdefault("metadata", {})["deletionTimestamp"] = stamp
                if isinstance(d, Evict):
                    cond = disruption_condition(d.reason, d.message, self._clock.time())
                    obj.setdefault("status", {}).setdefault("conditions", []).append(cond)
                self.assumptions.add(f"{d.pod.namespace}/{d.pod.name}", "evict", obj, now)
        elif isinstance(d, Nominate | ClearNomination):
            obj = base(d.pod)
            if obj is not None:
                annotations = obj.setdefault("metadata", {}).setdefault("annotations", {})
                if isinstance(d, Nominate):
                    annotations[keys.NOMINATED_DEVICES] = nomination_annotation(d)
                else:
                    annotations.pop(keys.NOMINATED_DEVICES, None)
                self.assumptions.add(f"{d.pod.namespace}/{d.pod.name}", "nominate", obj, now)
        elif isinstance(d, PodGroupStatus):
            key = f"{d.group.namespace}/{d.group.name}"
            group = self.podgroups.store.get(key)
            if group is not None:
                group = copy.deepcopy(group)
                group.setdefault("status", {})["phase"] = d.phase.value
                self.group_assumptions.add(key, "phase", group, now)


__all__ = ["Assumptions", "CycleOutcome", "SchedulerLoop"]
