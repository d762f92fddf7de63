"""The GangJob controller's decision: one GangJob and what exists for it in, actions out.

Pure: no I/O, no clock (``now`` is an argument). :mod:`spotgpu.kube.gangjob_controller`
feeds it from informers and applies the actions through the API.

A GangJob runs in *attempts*. Attempt ``k`` is the PodGroup ``<job>-<k>`` (``minMember`` =
``minAvailable``) and pods ``<job>-<k>-<i>`` for ``i < replicas``, all labelled with the job,
the attempt, the PodGroup and the queue, owned by the GangJob (garbage collection removes them
with it), requesting ``platform/spot-gpu`` and naming ``schedulerName: spotgpu``. The job's
``minLease`` and ``checkpointInterval`` go onto the PodGroup's spec (in seconds, ``"3600s"``) and
onto every pod (annotations ``spotgpu.io/min-lease``, ``spotgpu.io/checkpoint-interval``).

The phases (``status.phase``):

* ``Pending``: attempt created, fewer than ``minAvailable`` pods running.
* ``Running``: at least ``minAvailable`` pods running.
* ``Requeued``: a member was evicted (its ``DisruptionTarget`` condition, or it vanished
  although this controller recorded creating it). The whole gang is torn down, ``evictions``
  counts up, and the next attempt starts at ``nextAttemptTime`` =
  eviction + ``requeueBackoffSeconds * 2**(evictions-1)`` (capped at 600 s): an
  evicted gang goes back to the queue, not at once to the same contended GPUs.
* ``Failed``: evicted more than ``retryLimit`` times, a member failed on its own, or the spec
  is invalid. ``Succeeded``: every member of the attempt succeeded. Both are final.

A template that carries what only the scheduler (or spotgpu-runtime) writes, or ``spec.nodeName``
(:mod:`spotgpu.kube.template_check`), is refused before anything is created: the job is ``Failed``
with the condition ``TemplateAccepted=False`` (reason ``SchedulerOnlyMetadata``) naming each
offending key; the controller's pods are the scheduler's service account's, which admission trusts.

``expected`` protects against the informer's lag: pods this controller created and has not seen
in its cache yet are not "vanished". ``gone`` gives the ``DisruptionTarget`` reason a member
carried when it was deleted (the informer may deliver the deletion before a reconcile saw the
condition), so evictions are counted under their real reason.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from spotgpu.core import keys
from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import SPOT_GPU_RESOURCE
from spotgpu.core.types import EvictionReason
from spotgpu.kube.objects import disruption, is_deleting, pod_phase
from spotgpu.kube.resources import (
    API_VERSION,
    MAX_REQUEUE_BACKOFF,
    GangJobPhase,
    GangJobView,
    TemplateRefused,
    format_time,
    name_of,
    parse_time,
)

JSON = dict[str, Any]

FINAL_PHASES: Final = frozenset({GangJobPhase.SUCCEEDED, GangJobPhase.FAILED})
TEMPLATE_ACCEPTED: Final = "TemplateAccepted"
"""Status condition type: ``False`` (reason :data:`TEMPLATE_REFUSED_REASON`) when the template was refused."""
TEMPLATE_REFUSED_REASON: Final = "SchedulerOnlyMetadata"
MAX_REFUSALS_SHOWN: Final = 20
"""A refused template's status names at most this many offending keys (the condition's message is bounded)."""


@dataclass(frozen=True, slots=True)
class CreateObject:
    """Create a PodGroup or pod (``obj`` is its full JSON)."""

    kind: str
    obj: JSON


@dataclass(frozen=True, slots=True)
class DeleteObject:
    kind: str
    namespace: str
    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class PatchStatus:
    """Merge-patch the GangJob's status subresource with ``status``."""

    status: JSON


Action = CreateObject | DeleteObject | PatchStatus


@dataclass(frozen=True, slots=True)
class Plan:
    actions: tuple[Action, ...] = ()
    requeue_after: float | None = None
    """Reconcile again after this many seconds (a pending backoff), even without events."""
    evicted: tuple[str, ...] = ()
    """Names of the members whose eviction this plan reacts to (for events and metrics)."""
    eviction_reason: str = ""
    refused: tuple[str, ...] = ()
    """Why the job's template was refused (:class:`~spotgpu.kube.resources.TemplateRefused`),
    set by the plan that first reports it (for the log, the event and the metric)."""

    @property
    def creates(self) -> list[CreateObject]:
        return [a for a in self.actions if isinstance(a, CreateObject)]

    @property
    def deletes(self) -> list[DeleteObject]:
        return [a for a in self.actions if isinstance(a, DeleteObject)]

    @property
    def status(self) -> JSON | None:
        return next((a.status for a in self.actions if isinstance(a, PatchStatus)), None)


def podgroup_name(job: str, attempt: int) -> str:
    return f"{job}-{attempt}"


def _owner_ref(job: Mapping[str, Any]) -> JSON:
    return {
        "apiVersion": API_VERSION,
        "kind": "GangJob",
        "name": name_of(job),
        "uid": (job.get("metadata") or {}).get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _labels(view: GangJobView, attempt: int) -> dict[str, str]:
    return {
        keys.GANG_JOB: view.name,
        keys.GANG_ATTEMPT: str(attempt),
        keys.POD_GROUP: podgroup_name(view.name, attempt),
        keys.QUEUE: view.queue,
    }


def _lease_spec(view: GangJobView) -> dict[str, str]:
    """``minLease``/``checkpointInterval`` as the PodGroup carries them (seconds, ``"3600s"``)."""
    out = {}
    if view.min_lease is not None:
        out["minLease"] = f"{view.min_lease:g}s"
    if view.checkpoint_interval is not None:
        out["checkpointInterval"] = f"{view.checkpoint_interval:g}s"
    return out


def build_podgroup(job: Mapping[str, Any], view: GangJobView, attempt: int) -> JSON:
    return {
        "apiVersion": API_VERSION,
        "kind": "PodGroup",
        "metadata": {
            "name": podgroup_name(view.name, attempt),
            "namespace": view.namespace,
            "labels": _labels(view, attempt),
            "ownerReferences": [_owner_ref(job)],
        },
        "spec": {
            "queue": view.queue,
            "minMember": view.min_available,
            "priorityClassName": view.priority.value,
            **_lease_spec(view),
        },
    }


def build_pod(job: Mapping[str, Any], view: GangJobView, attempt: int, index: int) -> JSON:
    template = copy.deepcopy(view.template)
    meta = template.get("metadata") or {}
    spec = template["spec"]
    spec["schedulerName"] = keys.SCHEDULER_NAME
    spec["priorityClassName"] = view.priority.value
    spec.setdefault("restartPolicy", "Never")
    if view.gpus:
        first = spec["containers"][0]
        resources = first.setdefault("resources", {})
        for part in ("limits", "requests"):
            resources.setdefault(part, {})[SPOT_GPU_RESOURCE] = str(view.gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{podgroup_name(view.name, attempt)}-{index}",
            "namespace": view.namespace,
            "labels": {**(meta.get("labels") or {}), **_labels(view, attempt)},
            "annotations": {**(meta.get("annotations") or {}), **_lease_annotations(view)},
            "ownerReferences": [_owner_ref(job)],
        },
        "spec": spec,
    }


def _lease_annotations(view: GangJobView) -> dict[str, str]:
    lease = _lease_spec(view)
    out = {}
    if "minLease" in lease:
        out[keys.MIN_LEASE] = lease["minLease"]
    if "checkpointInterval" in lease:
        out[keys.CHECKPOINT_INTERVAL] = lease["checkpointInterval"]
    return out


def requeue_delay(view: GangJobView, evictions: int) -> float:
    """``requeueBackoffSeconds * 2**(evictions-1)``, capped at :data:`MAX_REQUEUE_BACKOFF`."""
    if evictions <= 0 or view.requeue_backoff <= 0:
        return 0.0
    return float(min(MAX_REQUEUE_BACKOFF, view.requeue_backoff * 2 ** min(evictions - 1, 20)))


def _attempt_of(obj: Mapping[str, Any]) -> int | None:
    value = ((obj.get("metadata") or {}).get("labels") or {}).get(keys.GANG_ATTEMPT)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@dataclass(slots=True)
class _Builder:
    actions: list[Action] = field(default_factory=list)

    def delete_all(self, objs: Iterable[Mapping[str, Any]], kind: str, reason: str) -> None:
        for obj in objs:
            if not is_deleting(obj):
                meta = obj.get("metadata") or {}
                self.actions.append(DeleteObject(kind, str(meta.get("namespace", "")), str(meta.get("name")), reason))


@dataclass(slots=True)
class _Attempt:
    """The attempt a reconcile works on: what the job's status says, and its objects."""

    job: Mapping[str, Any]
    view: GangJobView
    status: JSON
    podgroups: list[Mapping[str, Any]]
    pods: list[Mapping[str, Any]]
    attempt: int
    evictions: int
    retries: int
    current_pg: str = ""
    desired: JSON = field(default_factory=dict)
    mine: list[Mapping[str, Any]] = field(default_factory=list)
    """The pods of this attempt."""
    stale_pods: list[Mapping[str, Any]] = field(default_factory=list)
    stale_groups: list[Mapping[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.current_pg = podgroup_name(self.view.name, self.attempt)
        self.mine = [p for p in self.pods if _attempt_of(p) == self.attempt]
        self.stale_pods = [p for p in self.pods if _attempt_of(p) != self.attempt]
        self.stale_groups = [g for g in self.podgroups if name_of(g) != self.current_pg]
        self.desired = {
            "observedGeneration": self.view.generation,
            "attempt": self.attempt,
            "podGroup": self.current_pg,
        }

    def start_next(self) -> None:
        """Move on to the next attempt (nothing of it exists yet)."""
        self.attempt += 1
        self.retries += 1
        self.current_pg = podgroup_name(self.view.name, self.attempt)
        self.desired = {
            "observedGeneration": self.view.generation,
            "attempt": self.attempt,
            "retries": self.retries,
            "podGroup": self.current_pg,
            "message": f"attempt {self.attempt} after {self.evictions} eviction(s)",
        }
        self.mine, self.stale_pods, self.stale_groups = [], [], []
        self.status = {**self.status, "podGroup": None}  # nothing of this attempt was created yet


def reconcile(
    job: Mapping[str, Any],
    podgroups: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    now: float,
    expected: frozenset[str] = frozenset(),
    gone: Mapping[str, str] | None = None,
) -> Plan:
    """Decide what to do for ``job`` given its PodGroups and pods (any attempt) at time ``now``."""
    status: JSON = dict(job.get("status") or {})
    meta = job.get("metadata") or {}
    podgroups = list(podgroups)
    pods = list(pods)
    b = _Builder()
    if meta.get("deletionTimestamp"):
        return Plan()  # garbage collection removes what it owns
    try:
        view = GangJobView.parse(job)
    except TemplateRefused as exc:
        return _refuse(status, b, exc, now)
    except ValidationError as exc:
        return _finish(status, b, {"phase": GangJobPhase.FAILED.value, "message": f"invalid spec: {exc}"})
    try:
        phase = GangJobPhase(status.get("phase") or GangJobPhase.PENDING.value)
    except ValueError:
        phase = GangJobPhase.PENDING
    at = _Attempt(
        job,
        view,
        status,
        podgroups,
        pods,
        attempt=int(status.get("attempt") or 0),
        evictions=int(status.get("evictions") or 0),
        retries=int(status.get("retries") or 0),
    )
    if phase in FINAL_PHASES:
        return _final(at, phase, b)
    if phase is GangJobPhase.REQUEUED:
        waiting = _requeued(at, b, now)
        if waiting is not None:
            return waiting
    b.delete_all(at.stale_pods, "Pod", f"left over from an earlier attempt of {view.name}")
    b.delete_all(at.stale_groups, "PodGroup", f"left over from an earlier attempt of {view.name}")
    created = at.status.get("podGroup") == at.current_pg
    by_name = {name_of(p): p for p in at.mine}
    wanted = [f"{at.current_pg}-{i}" for i in range(view.replicas)]
    evicted, reason = _evicted_members(wanted, by_name, created=created, expected=expected, gone=gone or {})
    if evicted:
        return _on_eviction(at, b, evicted, reason, now)
    return _progress(at, b, wanted, by_name, created=created)


def _refuse(status: Mapping[str, Any], b: _Builder, exc: TemplateRefused, now: float) -> Plan:
    """A template the controller must not copy into pods: the job fails, nothing is created, and the
    condition ``TemplateAccepted=False`` names every offending key (its time kept once set, so a
    later reconcile writes nothing)."""
    shown = exc.refusals[:MAX_REFUSALS_SHOWN]
    more = len(exc.refusals) - len(shown)
    message = "; ".join(shown) + (f"; and {more} more" if more else "")
    conditions = status.get("conditions") or []
    old = next((c for c in conditions if isinstance(c, dict) and c.get("type") == TEMPLATE_ACCEPTED), {})
    since = old.get("lastTransitionTime") if old.get("status") == "False" else None
    condition = {
        "type": TEMPLATE_ACCEPTED,
        "status": "False",
        "reason": TEMPLATE_REFUSED_REASON,
        "message": message,
        "lastTransitionTime": since or format_time(now),
    }
    desired = {
        "phase": GangJobPhase.FAILED.value,
        "message": f"template refused (nothing created): {message}",
        "conditions": [condition],
    }
    plan = _finish(status, b, desired)
    return dataclasses.replace(plan, refused=exc.refusals) if plan.status is not None else plan


def _final(at: _Attempt, phase: GangJobPhase, b: _Builder) -> Plan:
    """A final job: only clean up (a failed job's members still running are deleted)."""
    b.delete_all(at.stale_pods, "Pod", f"attempt {at.attempt} is final")
    b.delete_all(at.stale_groups, "PodGroup", f"attempt {at.attempt} is final")
    if phase is GangJobPhase.FAILED:
        b.delete_all([p for p in at.mine if pod_phase(p) not in ("Succeeded", "Failed")], "Pod", "GangJob failed")
    return _finish(at.status, b, {**at.desired, "phase": phase.value})


def _requeued(at: _Attempt, b: _Builder, now: float) -> Plan | None:
    """A requeued job: tear the evicted gang down; once the backoff passed and its members are
    gone, move on to the next attempt (None), else wait (the plan)."""
    b.delete_all(at.pods, "Pod", f"gang {at.current_pg} was evicted")
    b.delete_all(at.podgroups, "PodGroup", f"gang {at.current_pg} was evicted")
    due = parse_time(at.status.get("nextAttemptTime")) or now
    if now < due or any(True for _ in at.pods):
        # wait for the backoff, and for the old members to be gone, before the next attempt
        wait = max(due - now, 1.0 if at.pods else 0.0)
        return _finish(at.status, b, {**at.desired, "phase": GangJobPhase.REQUEUED.value}, requeue_after=wait)
    at.start_next()
    return None


def _evicted_members(
    wanted: Iterable[str],
    by_name: Mapping[str, Mapping[str, Any]],
    *,
    created: bool,
    expected: frozenset[str],
    gone: Mapping[str, str],
) -> tuple[list[str], str]:
    """The members evicted: marked ``DisruptionTarget``, or gone although this controller recorded
    creating them (and not merely unseen yet); with the first one's reason."""
    evicted: list[str] = []
    reason = ""
    for name in wanted:
        pod = by_name.get(name)
        if pod is None:
            if created and name not in expected:
                evicted.append(name)
                reason = reason or gone.get(name) or "deleted"
            continue
        cond = disruption(pod)
        if cond is not None:
            evicted.append(name)
            reason = reason or str(cond.get("reason") or EvictionReason.RESERVED_PREEMPT.value)
    return evicted, reason


def _on_eviction(at: _Attempt, b: _Builder, evicted: list[str], reason: str, now: float) -> Plan:
    """Tear the gang down; requeue it with backoff, or fail it past ``retryLimit``."""
    view = at.view
    evictions = at.evictions + 1
    b.delete_all(at.mine, "Pod", f"gang {at.current_pg} was evicted ({reason})")
    b.delete_all(
        [g for g in at.podgroups if name_of(g) == at.current_pg], "PodGroup", f"gang {at.current_pg} was evicted"
    )
    eviction = {
        **at.desired,
        "evictions": evictions,
        "lastEvictionTime": format_time(now),
        "lastEvictionReason": reason,
        "running": 0,
    }
    if evictions > view.retry_limit:
        msg = f"evicted {evictions} time(s), more than retryLimit {view.retry_limit}; last: {', '.join(evicted)}"
        return _finish(at.status, b, {**eviction, "phase": GangJobPhase.FAILED.value, "message": msg}, evicted, reason)
    delay = requeue_delay(view, evictions)
    msg = f"evicted ({reason}: {', '.join(evicted)}); requeued, next attempt in {delay:.0f}s"
    return _finish(
        at.status,
        b,
        {
            **eviction,
            "phase": GangJobPhase.REQUEUED.value,
            "nextAttemptTime": format_time(math.ceil(now + delay)),  # never earlier than the backoff
            "message": msg,
        },
        evicted,
        reason,
        requeue_after=max(delay, 0.001),
    )


def _progress(
    at: _Attempt, b: _Builder, wanted: list[str], by_name: Mapping[str, Mapping[str, Any]], *, created: bool
) -> Plan:
    """Create what is missing of the current attempt and report its phase from its members'."""
    view = at.view
    if not any(name_of(g) == at.current_pg for g in at.podgroups):
        b.actions.append(CreateObject("PodGroup", build_podgroup(at.job, view, at.attempt)))
    for index, name in enumerate(wanted):
        if name not in by_name and not created:
            b.actions.append(CreateObject("Pod", build_pod(at.job, view, at.attempt, index)))
    phases = [pod_phase(by_name[n]) for n in wanted if n in by_name]
    failed = [n for n in wanted if n in by_name and pod_phase(by_name[n]) == "Failed"]
    if failed:
        b.delete_all(at.mine, "Pod", f"member {failed[0]} failed")
        return _finish(
            at.status,
            b,
            {**at.desired, "phase": GangJobPhase.FAILED.value, "message": f"member(s) failed: {', '.join(failed)}"},
        )
    if len(phases) == view.replicas and all(p == "Succeeded" for p in phases):
        return _finish(at.status, b, {**at.desired, "phase": GangJobPhase.SUCCEEDED.value, "running": 0})
    running = sum(1 for p in phases if p == "Running")
    new_phase = GangJobPhase.RUNNING if running >= view.min_available else GangJobPhase.PENDING
    return _finish(at.status, b, {**at.desired, "phase": new_phase.value, "running": running})


def _finish(
    status: Mapping[str, Any],
    b: _Builder,
    desired: JSON,
    evicted: Iterable[str] = (),
    reason: str = "",
    *,
    requeue_after: float | None = None,
) -> Plan:
    patch = {k: v for k, v in desired.items() if status.get(k) != v}
    if patch:
        b.actions.append(PatchStatus(patch))
    return Plan(tuple(b.actions), requeue_after, tuple(evicted), reason)


__all__ = [
    "FINAL_PHASES",
    "TEMPLATE_ACCEPTED",
    "TEMPLATE_REFUSED_REASON",
    "Action",
    "CreateObject",
    "DeleteObject",
    "PatchStatus",
    "Plan",
    "build_pod",
    "build_podgroup",
    "podgroup_name",
    "reconcile",
    "requeue_delay",
]
