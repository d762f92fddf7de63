"""Applying the scheduler core's decisions to the cluster.

Decides nothing: each :mod:`spotgpu.scheduler.model` decision becomes API calls. Side effects:
HTTP requests (Bindings, Evictions, pod and PodGroup patches, ShadowPod creates and deletes).

* ``Evict``: the ``DisruptionTarget`` condition with the reason on ``pods/status``, then the
  Eviction API (``mode=evict``: PodDisruptionBudgets are honoured, a 429 leaves the pod to the
  next cycle) or a delete (``mode=delete``).
* ``DeleteShadowPod``: delete, grace 0.
* ``ClearNomination`` / ``Nominate``: the ``spotgpu.io/nominated-devices`` annotation and
  ``status.nominatedNodeName``.
* ``CreateShadowPod``: a pause pod with ``spec.nodeName`` set, requesting exactly
  ``len(devices)`` of the real resource.
* ``Bind``: one ``pods/binding`` POST whose ``metadata.annotations`` (device owner, assigned
  devices) the API server copies onto the pod in the same write, so no pod is ever bound
  without its device owner.
* ``PodGroupStatus``: merge patch of the PodGroup ``status`` (phase, ``Scheduled`` condition).

Each call is retried on temporary errors (409, 429, 5xx, timeouts). Outcomes that mean "already
done" are success (a pod already bound to the same node, an object already gone). A failed
``CreateShadowPod`` skips the binds of its gang that name it as device owner. Other failures are
recorded in the :class:`ApplyReport` and leave the rest of the cycle's decisions to be applied;
the next cycle starts from the cluster as it then is.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from lightkube.models.meta_v1 import DeleteOptions, ObjectMeta
from lightkube.resources.core_v1 import Pod, PodEviction
from lightkube.types import PatchType

from spotgpu.core import keys
from spotgpu.core.clock import Clock, SystemClock
from spotgpu.core.refs import PodRef
from spotgpu.kube.agent_port import disruption_condition
from spotgpu.kube.client import (
    AlreadyExists,
    Conflict,
    Connection,
    KubeApiError,
    NotFound,
    Rejected,
    Retrier,
    TooManyRequests,
    api_errors,
)
from spotgpu.kube.events import WARNING, EventRecorder, pod_reference
from spotgpu.kube.metrics import ControllerMetrics
from spotgpu.kube.resources import PodGroupResource, format_time
from spotgpu.scheduler.decisions import (
    Bind,
    ClearNomination,
    CreateShadowPod,
    Decision,
    DeleteShadowPod,
    Evict,
    Nominate,
    PodGroupStatus,
)

log = logging.getLogger(__name__)

JSON = dict[str, Any]


class EvictionMode(StrEnum):
    EVICT = "evict"
    """The Eviction API (PodDisruptionBudgets are honoured)."""
    DELETE = "delete"
    """A plain delete after the DisruptionTarget condition (budgets are not consulted)."""


@dataclass(frozen=True, slots=True)
class ApplyConfig:
    eviction_mode: EvictionMode = EvictionMode.EVICT
    eviction_grace_seconds: int = 0
    pause_image: str = "registry.k8s.io/pause:3.10"
    shadow_priority_class: str = "spotlow"
    """PriorityClass of ShadowPods: low, so a reserved pod of any scheduler may preempt one."""


@dataclass(slots=True)
class ApplyReport:
    applied: list[Decision] = field(default_factory=list)
    failed: list[tuple[Decision, str]] = field(default_factory=list)
    skipped: list[tuple[Decision, str]] = field(default_factory=list)


def _ns(ref: PodRef) -> str:
    if ref.namespace is None:
        raise ValueError(f"decision names a relative pod reference {ref}")
    return ref.namespace


def nomination_annotation(d: Nominate) -> str:
    """The value of ``spotgpu.io/nominated-devices`` for a nomination."""
    return json.dumps({"node": d.node, "devices": list(d.devices)}, separators=(",", ":"))


def shadow_pod_manifest(d: CreateShadowPod, cfg: ApplyConfig) -> JSON:
    """The ShadowPod: pinned to the node, holding the real GPUs, doing nothing (pause)."""
    count = str(len(d.devices))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": d.pod.name,
            "namespace": _ns(d.pod),
            "labels": {**d.labels(), "app.kubernetes.io/managed-by": "spotgpu"},
            "annotations": d.annotations(),
        },
        "spec": {
            "nodeName": d.node,
            "schedulerName": keys.SCHEDULER_NAME,
            "priorityClassName": cfg.shadow_priority_class,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": d.container,
                    "image": cfg.pause_image,
                    "resources": {"limits": {d.resource: count}, "requests": {d.resource: count}},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "runAsNonRoot": True,
                        "runAsUser": 65535,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


class Applier:
    """Applies one cycle's decisions, in the order :meth:`CycleResult.decisions` gives them."""

    def __init__(
        self,
        connection: Connection,
        *,
        config: ApplyConfig | None = None,
        retrier: Retrier | None = None,
        metrics: ControllerMetrics | None = None,
        clock: Clock | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self._events = events
        self._connection = connection
        self._client = connection.client
        self.config = config or ApplyConfig()
        self._retry = retrier or Retrier()
        self.retry = self._retry
        self._metrics = metrics
        self._clock = clock or SystemClock()

    def apply(self, decisions: Iterable[Decision]) -> ApplyReport:
        report = ApplyReport()
        failed_shadows: set[PodRef] = set()
        for decision in decisions:
            if isinstance(decision, Bind):
                owners = {o.owner.pod_ref for o in decision.owners}
                blocked = owners & failed_shadows
                if blocked:
                    report.skipped.append((decision, f"its device owner {min(blocked)} could not be created"))
                    continue
            try:
                self._apply_one(decision)
                report.applied.append(decision)
            except KubeApiError as exc:
                log.warning("apply %s failed: %s", type(decision).__name__, exc)
                report.failed.append((decision, str(exc)))
                if isinstance(decision, CreateShadowPod):
                    failed_shadows.add(decision.pod)
                if self._metrics is not None:
                    self._metrics.errors.labels("apply").inc()
        return report

    def _apply_one(self, d: Decision) -> None:
        if isinstance(d, Evict):
            self.evict(d)
        elif isinstance(d, DeleteShadowPod):
            self._delete_pod(d.pod, f"delete ShadowPod {d.pod} ({d.reason})")
            self._count(self._metrics.shadow_pods.labels("delete") if self._metrics else None)
        elif isinstance(d, ClearNomination):
            self._nominate(d.pod, None, None)
            self._count(self._metrics.nominations.labels("clear") if self._metrics else None)
        elif isinstance(d, Nominate):
            self._nominate(d.pod, d.node, nomination_annotation(d))
            self._count(self._metrics.nominations.labels("set") if self._metrics else None)
        elif isinstance(d, CreateShadowPod):
            self.create_shadow(d)
        elif isinstance(d, Bind):
            self.bind(d)
        elif isinstance(d, PodGroupStatus):
            self.podgroup_status(d)
        else:  # pragma: no cover - the Decision union is closed
            raise TypeError(f"unknown decision {d!r}")

    @staticmethod
    def _count(counter: Any) -> None:
        if counter is not None:
            counter.inc()

    # ----------------------------------------------------------------- decisions

    def evict(self, d: Evict) -> None:
        ns = _ns(d.pod)
        status = {"status": {"conditions": [disruption_condition(d.reason, d.message, self._clock.time())]}}
        try:
            self._retry(
                f"mark pod {d.pod} {keys.DISRUPTION_CONDITION}",
                lambda: self._client.patch(
                    Pod.Status, d.pod.name, status, namespace=ns, patch_type=PatchType.STRATEGIC
                ),
            )
            if self.config.eviction_mode is EvictionMode.EVICT:
                eviction = PodEviction(
                    metadata=ObjectMeta(name=d.pod.name, namespace=ns),
                    deleteOptions=DeleteOptions(gracePeriodSeconds=self.config.eviction_grace_seconds),
                )
                self._retry(
                    f"evict pod {d.pod}",
                    lambda: self._client.create(eviction, name=d.pod.name, namespace=ns),
                )
            else:
                self._retry(
                    f"delete pod {d.pod}",
                    lambda: self._client.delete(
                        Pod, d.pod.name, namespace=ns, grace_period=self.config.eviction_grace_seconds
                    ),
                )
        except NotFound:
            return
        except TooManyRequests as exc:
            # the budget holds: take the mark back, or the pod would count as "being evicted" forever
            log.info("eviction of %s refused by a disruption budget; the next cycle tries again", d.pod)
            blocked = {
                "type": keys.DISRUPTION_CONDITION,
                "status": "False",
                "reason": "EvictionBlocked",
                "message": f"{d.reason.value}: {exc}",
                "lastTransitionTime": format_time(self._clock.time()),
            }
            with contextlib.suppress(KubeApiError):
                self._retry(
                    f"unmark pod {d.pod}",
                    lambda: self._client.patch(
                        Pod.Status,
                        d.pod.name,
                        {"status": {"conditions": [blocked]}},
                        namespace=ns,
                        patch_type=PatchType.STRATEGIC,
                    ),
                )
            raise
        self._count(
            self._metrics.evictions.labels(d.reason.value, self.config.eviction_mode.value) if self._metrics else None
        )
        log.info("evicted %s of gang %s: %s", d.pod, d.group, d.message)
        if self._events is not None:
            self._events.record(pod_reference(ns, d.pod.name), reason="Preempted", message=d.message, type=WARNING)

    def create_shadow(self, d: CreateShadowPod) -> None:
        manifest = shadow_pod_manifest(d, self.config)
        what = f"create ShadowPod {d.pod}"
        path = f"/api/v1/namespaces/{_ns(d.pod)}/pods"
        with contextlib.suppress(AlreadyExists):
            self._retry(what, lambda: self._connection.post(path, manifest, what))
        self._count(self._metrics.shadow_pods.labels("create") if self._metrics else None)

    def bind(self, d: Bind) -> None:
        ns = _ns(d.pod)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": d.pod.name, "namespace": ns, "annotations": d.annotations()},
            "target": {"apiVersion": "v1", "kind": "Node", "name": d.node},
        }
        what = f"bind pod {d.pod} to {d.node}"
        path = f"/api/v1/namespaces/{ns}/pods/{d.pod.name}/binding"

        def op() -> None:
            try:
                self._connection.post(path, binding, what)
            except Conflict as exc:
                # Usually "already assigned": success when to our node (an earlier try went through
                # and its answer was lost), final when to another; still unbound: try again.
                current = self._node_of(d.pod)
                if current == d.node:
                    return
                if current:
                    raise Rejected(f"{what}: the pod is bound to {current!r} already", code=409) from exc
                raise

        self._retry(what, op)
        self._count(self._metrics.binds.labels("spot" if d.spot else "reserved") if self._metrics else None)
        if self._events is not None:
            self._events.record(
                pod_reference(ns, d.pod.name),
                reason="Scheduled",
                message=f"bound to {d.node} with {d.resource} {','.join(d.devices)}",
            )

    def podgroup_status(self, d: PodGroupStatus) -> None:
        ns = _ns(d.group)
        scheduled = d.phase.value == "Running"
        status = {
            "status": {
                "phase": d.phase.value,
                "conditions": [
                    {
                        "type": "Scheduled",
                        "status": "True" if scheduled else "False",
                        "reason": d.reason or ("Scheduled" if scheduled else "Unschedulable"),
                        "message": d.message,
                        "lastTransitionTime": format_time(self._clock.time()),
                    }
                ],
            }
        }
        with contextlib.suppress(NotFound):
            self._retry(
                f"update status of PodGroup {d.group}",
                lambda: self._client.patch(
                    PodGroupResource.Status, d.group.name, status, namespace=ns, patch_type=PatchType.MERGE
                ),
            )

    # ----------------------------------------------------------------- helpers

    def _node_of(self, pod: PodRef) -> str | None:
        with api_errors(f"get pod {pod}"):
            obj = self._client.get(Pod, pod.name, namespace=_ns(pod))
        return obj.spec.nodeName if obj.spec else None

    def _delete_pod(self, pod: PodRef, what: str) -> None:
        with contextlib.suppress(NotFound):
            self._retry(what, lambda: self._client.delete(Pod, pod.name, namespace=_ns(pod), grace_period=0))

    def _nominate(self, pod: PodRef, node: str | None, value: str | None) -> None:
        ns = _ns(pod)
        meta = {"metadata": {"annotations": {keys.NOMINATED_DEVICES: value}}}
        status = {"status": {"nominatedNodeName": node}}
        with contextlib.suppress(NotFound):
            self._retry(
                f"annotate nomination of {pod}",
                lambda: self._client.patch(Pod, pod.name, meta, namespace=ns, patch_type=PatchType.MERGE),
            )
            self._retry(
                f"set nominatedNodeName of {pod}",
                lambda: self._client.patch(Pod.Status, pod.name, status, namespace=ns, patch_type=PatchType.MERGE),
            )


__all__ = ["ApplyConfig", "ApplyReport", "Applier", "EvictionMode", "nomination_annotation", "shadow_pod_manifest"]
