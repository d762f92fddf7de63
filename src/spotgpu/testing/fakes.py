"""In-memory implementations of the agent's ports, for tests and the agent benchmark.

Each fake implements one Protocol (:class:`~spotgpu.ports.kube.KubePort`,
:class:`~spotgpu.ports.kube.GuardPort`, and the node ports of
:mod:`spotgpu.ports.node`) with plain dictionaries and records what it was asked, so a
test can assert on the calls. Side effects: none beyond the objects themselves (and the
guard fake calling the handler it was given). Failure injection: ``fail_next`` counters raise
:class:`~spotgpu.core.errors.TemporaryError` as the real adapters do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.errors import TemporaryError
from spotgpu.core.ids import DeviceID, NodeName
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import EvictionReason
from spotgpu.ports.guard import OwnerBackHandler
from spotgpu.ports.kube import PodEvent, PodEventType, PodInfo
from spotgpu.ports.node import (
    GpuDevice,
    GpuProcess,
    LearnedOwner,
    LentOwner,
    RuntimeContainer,
    TaskState,
    TaskStopResult,
)


@dataclass(frozen=True, slots=True)
class DeleteCall:
    pod: PodRef
    reason: EvictionReason
    message: str
    grace_seconds: int


class FakeKube:
    """A :class:`~spotgpu.ports.kube.KubePort` over a dict of pods and node annotations."""

    def __init__(self, pods: Sequence[PodInfo] = ()) -> None:
        self._lock = threading.Condition()
        self.pods: dict[PodRef, PodInfo] = {p.ref: p for p in pods}
        self.node_annotations: dict[NodeName, dict[str, str]] = {}
        self.deletes: list[DeleteCall] = []
        self.patches: list[tuple[NodeName, dict[str, str | None]]] = []
        self.fail_deletes = 0
        """The next N delete calls raise TemporaryError."""
        self.fail_patches = 0
        self.node_events: list[tuple[NodeName, str, str]] = []
        """``(node, reason, message)`` of every node event recorded."""
        self._events: list[PodEvent] = []

    def add_pod(self, pod: PodInfo) -> None:
        with self._lock:
            kind = PodEventType.MODIFIED if pod.ref in self.pods else PodEventType.ADDED
            self.pods[pod.ref] = pod
            self._events.append(PodEvent(kind, pod))
            self._lock.notify_all()

    def patch_node_annotations(self, node: NodeName, annotations: Mapping[str, str | None]) -> None:
        with self._lock:
            if self.fail_patches > 0:
                self.fail_patches -= 1
                raise TemporaryError(f"patch node {node}: 503 Service Unavailable (injected)")
            self.patches.append((node, dict(annotations)))
            current = self.node_annotations.setdefault(node, {})
            for key, value in annotations.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value

    def record_node_event(self, node: NodeName, *, reason: str, message: str) -> None:
        with self._lock:
            self.node_events.append((node, reason, message))

    def delete_pod(self, pod: PodRef, *, reason: EvictionReason, message: str, grace_seconds: int = 0) -> None:
        with self._lock:
            if self.fail_deletes > 0:
                self.fail_deletes -= 1
                raise TemporaryError(f"delete pod {pod}: 503 Service Unavailable (injected)")
            self.deletes.append(DeleteCall(pod, reason, message, grace_seconds))
            info = self.pods.pop(pod, None)
            if info is not None:
                self._events.append(PodEvent(PodEventType.DELETED, replace(info, deleting=True)))
            self._lock.notify_all()

    def list_node_pods(self, node: NodeName) -> list[PodInfo]:
        with self._lock:
            return [p for p in self.pods.values() if p.node == node]

    def watch_node_pods(self, node: NodeName, handler: Callable[[PodEvent], None], stop: Callable[[], bool]) -> None:
        seen = 0
        while not stop():
            with self._lock:
                self._lock.wait_for(partial(self._has_events_after, seen), timeout=0.05)
                new, seen = self._events[seen:], len(self._events)
            for event in new:
                if event.pod.node == node:
                    handler(event)

    def _has_events_after(self, seen: int) -> bool:
        return len(self._events) > seen

    def deleted(self) -> list[PodRef]:
        with self._lock:
            return [d.pod for d in self.deletes]


class FakeGuard:
    """A :class:`~spotgpu.ports.kube.GuardPort` that records arm/disarm and can signal "owner back"."""

    def __init__(self, available: bool = True) -> None:
        self._available = available
        self._lock = threading.Lock()
        self.armed: set[ContainerRef] = set()
        self.calls: list[tuple[str, ContainerRef]] = []
        self.handler: OwnerBackHandler | None = None
        self.fail_arm = False
        self.uncovered: set[ContainerRef] = set()
        """Owners whose notify fd this guard does not hold (every other owner is covered)."""

    @property
    def available(self) -> bool:
        return self._available

    @property
    def attached(self) -> bool:
        return True

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def wait_attached(self, timeout: float) -> bool:
        return True

    def arm(self, owner: ContainerRef) -> None:
        with self._lock:
            if self.fail_arm:
                raise TemporaryError(f"guard: cannot arm {owner} (injected)")
            self.armed.add(owner)
            self.calls.append(("arm", owner))

    def disarm(self, owner: ContainerRef) -> None:
        with self._lock:
            self.armed.discard(owner)
            self.calls.append(("disarm", owner))

    def is_armed(self, owner: ContainerRef) -> bool:
        with self._lock:
            return owner in self.armed

    def covers(self, owner: ContainerRef) -> bool:
        with self._lock:
            return self._available and owner not in self.uncovered

    def owner_back(self, owner: ContainerRef) -> None:
        """What the real guard does when it holds an armed owner's call: call the handler."""
        if self.handler is None:
            raise RuntimeError("FakeGuard has no OwnerBackHandler")
        self.handler(owner)


class FakeTasks:
    """A :class:`~spotgpu.ports.node.TaskPort` over a dict of containers (running or not)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.containers: dict[str, RuntimeContainer] = {}
        self.pids: dict[str, int] = {}
        self.stop_calls: list[tuple[str, ...]] = []
        self.unstoppable: set[str] = set()

    def add(self, container_id: str, labels: Mapping[str, str], *, pid: int | None = None) -> None:
        with self._lock:
            self.containers[container_id] = RuntimeContainer(container_id, dict(labels), True)
            if pid is not None:
                self.pids[container_id] = pid

    def running(self) -> set[str]:
        with self._lock:
            return {c.id for c in self.containers.values() if c.running}

    def stop_tasks(self, container_ids: Sequence[str], *, grace: float, timeout: float) -> list[TaskStopResult]:
        results = []
        with self._lock:
            self.stop_calls.append(tuple(container_ids))
            for cid in container_ids:
                container = self.containers.get(cid)
                if container is None:
                    results.append(TaskStopResult(cid, TaskState.GONE, None, "no such task"))
                elif cid in self.unstoppable:
                    results.append(TaskStopResult(cid, TaskState.FAILED, None, "task did not exit in time", 9))
                else:
                    self.containers[cid] = replace(container, running=False)
                    self.pids.pop(cid, None)
                    results.append(TaskStopResult(cid, TaskState.STOPPED, 137, "", 9))
        return results

    def init_pid(self, container_id: str) -> int | None:
        with self._lock:
            return self.pids.get(container_id)

    def list_containers(self) -> list[RuntimeContainer]:
        with self._lock:
            return list(self.containers.values())


class FakePodResources:
    """A :class:`~spotgpu.ports.node.PodResourcesPort` over a list the test sets."""

    def __init__(self, allocations: Sequence[AllocatedDevices] = ()) -> None:
        self._lock = threading.Lock()
        self.allocations = list(allocations)
        self.calls = 0
        self.fail_next = 0

    def set(self, allocations: Sequence[AllocatedDevices]) -> None:
        with self._lock:
            self.allocations = list(allocations)

    def list(self, timeout: float | None = None) -> list[AllocatedDevices]:
        with self._lock:
            self.calls += 1
            if self.fail_next > 0:
                self.fail_next -= 1
                raise TemporaryError("pod-resources List: UNAVAILABLE (injected)")
            return list(self.allocations)


class FakeLendStore:
    """A :class:`~spotgpu.ports.node.LendStore` in memory; ``saves`` records every write."""

    def __init__(
        self, lent: Sequence[LentOwner] = (), learned: Mapping[ContainerRef, LearnedOwner] | None = None
    ) -> None:
        self._lock = threading.Lock()
        self.lent = list(lent)
        self.learned = dict(learned or {})
        self.saves: list[list[LentOwner]] = []
        self.fail_saves = 0

    def load(self) -> list[LentOwner]:
        with self._lock:
            return list(self.lent)

    def load_learned(self) -> dict[ContainerRef, LearnedOwner]:
        with self._lock:
            return dict(self.learned)

    def save(self, lent: Sequence[LentOwner], learned: Mapping[ContainerRef, LearnedOwner] | None = None) -> None:
        with self._lock:
            if self.fail_saves > 0:
                self.fail_saves -= 1
                raise TemporaryError("lending record: read-only file system (injected)")
            self.lent = list(lent)
            self.learned = dict(learned or {})
            self.saves.append(list(lent))


class FakeGpuBackend:
    """A :class:`~spotgpu.ports.node.GpuBackend` whose processes and utilization the test sets."""

    name = "fake"

    def __init__(self, devices: Sequence[GpuDevice]) -> None:
        self._lock = threading.Lock()
        self._devices = tuple(devices)
        self.procs: dict[DeviceID, list[GpuProcess]] = {d.id: [] for d in devices}
        self.util: dict[DeviceID, float | None] = {d.id: 0.0 for d in devices}
        self.fail_processes = False

    def devices(self) -> tuple[GpuDevice, ...]:
        with self._lock:
            return self._devices

    def set_healthy(self, device: DeviceID, healthy: bool) -> None:
        with self._lock:
            self._devices = tuple(replace(d, healthy=healthy) if d.id == device else d for d in self._devices)

    def run(self, device: DeviceID, pid: int) -> None:
        with self._lock:
            self.procs[device].append(GpuProcess(pid, device))

    def clear(self, device: DeviceID | None = None) -> None:
        with self._lock:
            for key in [device] if device is not None else list(self.procs):
                self.procs[key] = []

    def processes(self) -> dict[DeviceID, tuple[GpuProcess, ...]]:
        with self._lock:
            if self.fail_processes:
                raise TemporaryError("fake GPU backend: process list unavailable (injected)")
            return {d: tuple(p) for d, p in self.procs.items()}

    def utilization(self) -> dict[DeviceID, float | None]:
        with self._lock:
            return dict(self.util)

    def close(self) -> None:
        return None


class FakeAttributor:
    """A :class:`~spotgpu.ports.node.PidAttributor` over a ``{pid: container_id}`` table."""

    def __init__(self) -> None:
        self.owner_of: dict[int, str] = {}

    def reference(self, container_id: str, init_pid: int | None) -> str:
        return container_id

    def attribute(self, pids: Iterable[int], containers: Mapping[str, Any]) -> dict[int, str]:
        return {p: self.owner_of[p] for p in pids if self.owner_of.get(p) in containers}


def fake_devices(count: int, *, numa_nodes: int = 2) -> list[GpuDevice]:
    """``count`` NVIDIA-like devices ``GPU-<uuid-like>`` spread over ``numa_nodes``."""
    return [
        GpuDevice(
            DeviceID(f"GPU-{i:08x}-0000-4000-8000-{i:012x}"),
            i,
            f"GPU-{i:08x}-0000-4000-8000-{i:012x}",
            i,
            i % numa_nodes,
        )
        for i in range(count)
    ]


__all__ = [
    "DeleteCall",
    "FakeAttributor",
    "FakeGpuBackend",
    "FakeGuard",
    "FakeKube",
    "FakeLendStore",
    "FakePodResources",
    "FakeTasks",
    "fake_devices",
]
