"""Kubernetes Events (``core/v1``) for what operators look for in ``kubectl describe``.

Decides nothing. Side effects: best-effort POSTs of Event objects; a failure is logged, never
raised (an Event must not stop an eviction or a bind). Identical events (same object, reason and
message) within ``dedupe_window`` seconds are sent once, so a gang that stays unschedulable does
not write an Event every cycle.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Final

from spotgpu.core.clock import Clock, SystemClock
from spotgpu.kube.client import Connection, KubeApiError
from spotgpu.kube.informer import collection_path
from spotgpu.kube.resources import format_time

log = logging.getLogger(__name__)

NORMAL: Final = "Normal"
WARNING: Final = "Warning"


class EventRecorder:
    def __init__(
        self,
        connection: Connection,
        *,
        component: str,
        instance: str = "",
        clock: Clock | None = None,
        dedupe_window: float = 300.0,
    ) -> None:
        self._connection = connection
        self.component = component
        self.instance = instance or component
        self._clock = clock or SystemClock()
        self._window = dedupe_window
        self._sent: dict[tuple[str, str, str, str, str], float] = {}
        self._lock = threading.Lock()

    def record(
        self,
        obj: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type: str = NORMAL,
    ) -> bool:
        """Record an Event about ``obj`` (its apiVersion, kind and metadata); True if one was sent."""
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "")
        key = (str(obj.get("kind")), namespace, name, reason, message)
        now = self._clock.monotonic()
        with self._lock:
            last = self._sent.get(key)
            if last is not None and now - last < self._window:
                return False
            self._sent[key] = now
            if len(self._sent) > 10_000:
                self._sent = {k: t for k, t in self._sent.items() if now - t < self._window}
        stamp = format_time(self._clock.time())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "v1"),
                "kind": obj.get("kind", ""),
                "name": name,
                "namespace": namespace,
                "uid": meta.get("uid", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type,
            "source": {"component": self.component},
            "reportingComponent": f"spotgpu.io/{self.component}",
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self._connection.post(collection_path("", "v1", "events", namespace), event, f"record event {reason}")
        except KubeApiError as exc:
            log.info("event %s on %s %s/%s not recorded: %s", reason, obj.get("kind"), namespace, name, exc)
            return False
        return True


def pod_reference(namespace: str, name: str, uid: str = "") -> dict[str, Any]:
    """A minimal pod object for :meth:`EventRecorder.record` when only the reference is known."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": namespace, "name": name, "uid": uid}}


def node_reference(name: str, uid: str = "") -> dict[str, Any]:
    """A minimal node object for :meth:`EventRecorder.record` (a node's events live in ``default``)."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": uid}}


__all__ = ["NORMAL", "WARNING", "EventRecorder", "node_reference", "pod_reference"]
