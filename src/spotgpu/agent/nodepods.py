"""This node's pods as the agent's pod watch reports them, kept in binding order.

Decides nothing. Side effects: :meth:`NodePods.watch` calls the Kubernetes port's pod watch (on
the agent's ``pod-watch`` thread) until told to stop. The pods are kept in the order they were
first seen (a dict keeps insertion order), which is the order the scheduler bound them: steering
(:mod:`spotgpu.agent.steer`) infers from it the pod the kubelet is admitting. Every event
notifies waiters, so GetPreferredAllocation can wait for a freshly bound pod.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence

from spotgpu.core.ids import NodeName
from spotgpu.core.refs import PodRef
from spotgpu.ports.kube import KubePort, PodEvent, PodEventType, PodInfo

log = logging.getLogger(__name__)

WATCH_RESTART_DELAY = 1.0
"""Seconds before a pod watch that ended is started again."""


class NodePods:
    """This node's pods by reference, first seen first; safe to use from any thread."""

    def __init__(self) -> None:
        self._pods: dict[PodRef, PodInfo] = {}
        self._changed = threading.Condition()
        """Guards ``_pods``; notified on every pod event."""

    def load(self, pods: Iterable[PodInfo]) -> None:
        """Add or replace ``pods`` (the initial listing), in their order."""
        with self._changed:
            for pod in pods:
                self._pods[pod.ref] = pod

    def on_event(self, event: PodEvent) -> None:
        """Apply one watch event and wake every waiter."""
        with self._changed:
            if event.type is PodEventType.DELETED:
                self._pods.pop(event.pod.ref, None)
            else:
                self._pods[event.pod.ref] = event.pod
            self._changed.notify_all()

    def live(self) -> list[PodInfo]:
        """Every pod, in binding order."""
        with self._changed:
            return list(self._pods.values())

    def wait_for(self, ready: Callable[[Sequence[PodInfo]], bool], timeout: float) -> list[PodInfo]:
        """Every pod once ``ready`` holds for them, or after ``timeout`` seconds."""
        with self._changed:
            self._changed.wait_for(lambda: ready(list(self._pods.values())), timeout)
            return list(self._pods.values())

    def by_ref(self) -> dict[PodRef, PodInfo]:
        """A copy of the pods by reference."""
        with self._changed:
            return dict(self._pods)

    def known(self, refs: Iterable[PodRef]) -> list[PodInfo]:
        """The pods of ``refs`` that are known, in the order of ``refs``."""
        with self._changed:
            return [self._pods[p] for p in refs if p in self._pods]

    def deleting(self) -> list[PodInfo]:
        """The pods being deleted."""
        with self._changed:
            return [p for p in self._pods.values() if p.deleting]

    def watch(self, kube: KubePort, node: NodeName, stop: threading.Event) -> None:
        """Feed :meth:`on_event` from ``kube``'s pod watch until ``stop`` is set; a watch that ends
        is started again after :data:`WATCH_RESTART_DELAY`."""
        while not stop.is_set():
            try:
                kube.watch_node_pods(node, self.on_event, stop.is_set)
            except Exception as exc:
                log.warning("pod watch ended (%s); restarting", exc)
                stop.wait(WATCH_RESTART_DELAY)


__all__ = ["WATCH_RESTART_DELAY", "NodePods"]
