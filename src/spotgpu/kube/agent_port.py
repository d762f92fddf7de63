"""The node agent's :class:`~spotgpu.ports.kube.KubePort` over the real Kubernetes API.

Decides nothing: it carries out what the agent decided. Side effects: HTTP requests to the API
server (node merge-patches, pod status patches and deletes, list and watch of the node's pods).

* :meth:`KubeAgentPort.patch_node_annotations`: one JSON merge patch of ``metadata.annotations``
  (``None`` removes a key); idempotent.
* :meth:`KubeAgentPort.delete_pod`: first a strategic-merge patch of the ``status`` subresource
  adding the ``DisruptionTarget`` condition (reason = the :class:`EvictionReason`), so the spot
  job's controller and users can see why the pod went, then a delete with the given grace
  period, then a Warning Event on the pod. A pod already gone is success. The agent kills the
  containers through containerd before calling this (deletion's grace period would be far too
  slow for an owner's return).
* :meth:`KubeAgentPort.list_node_pods` / :meth:`watch_node_pods`: a field selector on
  ``spec.nodeName``; the watch is an :class:`~spotgpu.kube.informer.Informer` (resumes, relists
  on 410 Gone, resyncs).

Temporary failures (409, 429, 5xx, timeouts) are retried with backoff, then raised as
:class:`~spotgpu.core.errors.TemporaryError`, as the port's contract says.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Mapping

from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from spotgpu.core import keys
from spotgpu.core.clock import Clock, SystemClock
from spotgpu.core.ids import NodeName
from spotgpu.core.refs import PodRef
from spotgpu.core.types import EvictionReason
from spotgpu.kube.client import Backoff, Connection, NotFound, Retrier
from spotgpu.kube.events import WARNING, EventRecorder, node_reference, pod_reference
from spotgpu.kube.informer import EventType, Informer, WatchTarget, collection_path
from spotgpu.kube.objects import pod_info
from spotgpu.ports.kube import PodEvent, PodEventType, PodInfo

log = logging.getLogger(__name__)


def disruption_condition(reason: EvictionReason, message: str, now: float) -> dict[str, str]:
    """The ``DisruptionTarget`` pod condition spotgpu sets before it deletes a pod."""
    return {
        "type": keys.DISRUPTION_CONDITION,
        "status": "True",
        "reason": reason.value,
        "message": message,
        "lastTransitionTime": dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


class KubeAgentPort:
    """``KubePort`` for the agent on one node."""

    def __init__(
        self,
        connection: Connection,
        *,
        retrier: Retrier | None = None,
        clock: Clock | None = None,
        watch_idle_timeout: float = 30.0,
        resync: float = 300.0,
    ) -> None:
        self._connection = connection
        self._client = connection.client
        self._retry = retrier or Retrier(Backoff(base=0.1, cap=2.0, attempts=5))
        self._clock = clock or SystemClock()
        self._idle = watch_idle_timeout
        self._resync = resync
        self._events = EventRecorder(connection, component="spotgpu-agent", clock=self._clock)

    def patch_node_annotations(self, node: NodeName, annotations: Mapping[str, str | None]) -> None:
        body = {"metadata": {"annotations": dict(annotations)}}
        self._retry(
            f"patch annotations of node {node}",
            lambda: self._client.patch(Node, node, body, patch_type=PatchType.MERGE),
        )

    def record_node_event(self, node: NodeName, *, reason: str, message: str) -> None:
        self._events.record(node_reference(node), reason=reason, message=message, type=WARNING)

    def delete_pod(self, pod: PodRef, *, reason: EvictionReason, message: str, grace_seconds: int = 0) -> None:
        if pod.namespace is None:
            raise ValueError(f"delete_pod needs a namespaced reference, got {pod}")
        ns = pod.namespace
        status = {"status": {"conditions": [disruption_condition(reason, message, self._clock.time())]}}
        try:
            self._retry(
                f"mark pod {pod} {keys.DISRUPTION_CONDITION}",
                lambda: self._client.patch(Pod.Status, pod.name, status, namespace=ns, patch_type=PatchType.STRATEGIC),
            )
        except NotFound:
            return
        try:
            self._retry(
                f"delete pod {pod}",
                lambda: self._client.delete(Pod, pod.name, namespace=ns, grace_period=grace_seconds),
            )
        except NotFound:
            return
        log.info("deleted pod %s (%s: %s)", pod, reason.value, message)
        self._events.record(pod_reference(ns, pod.name), reason=reason.value, message=message, type=WARNING)

    def list_node_pods(self, node: NodeName) -> list[PodInfo]:
        what = f"list pods of node {node}"
        path = collection_path("", "v1", "pods")
        answer = self._retry(what, lambda: self._connection.get(path, {"fieldSelector": f"spec.nodeName={node}"}, what))
        return [pod_info(p) for p in answer.get("items") or ()]

    def watch_node_pods(self, node: NodeName, handler: Callable[[PodEvent], None], stop: Callable[[], bool]) -> None:
        done = threading.Event()

        def on_event(kind: EventType, obj: dict[str, object]) -> None:
            event_type = PodEventType.MODIFIED if kind is EventType.SYNC else PodEventType(kind.value)
            handler(PodEvent(event_type, pod_info(obj)))

        informer = Informer(
            self._connection,
            WatchTarget(f"pods@{node}", collection_path("", "v1", "pods"), field_selector=f"spec.nodeName={node}"),
            handlers=[on_event],
            idle_timeout=self._idle,
            resync=self._resync,
        ).start()
        try:
            while not stop():
                done.wait(0.1)
        finally:
            informer.stop()


__all__ = ["KubeAgentPort", "disruption_condition"]
