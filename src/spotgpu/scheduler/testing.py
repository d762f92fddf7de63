"""Fluent builders for scheduler snapshots (and, re-exported, the model-level applier).

No I/O. For tests, the simulator and the Kubernetes loop's tests, in the style of
kube-scheduler's ``MakePod().Name("p").Node("n").Obj()``::

    node = MakeNode("n1").gpus(8).owner([0, 1], "dev/alice/main", active=False).lending().obj()
    group = MakePodGroup("train").queue("spot").spot(SpotPriority.SPOTMID).min_member(2).obj()
    pod = MakePod("train-0").group("train").spot_gpus(1).obj()
    snap = Snapshot.of([node], [MakeQueue("spot").spot().obj()], [group], [pod])

Defaults: namespace ``default``, 8 GPUs per node named ``GPU-<node>-<i>`` (:func:`gpu_id`), PodGroups
in queue ``default`` with phase Inqueue (already admitted), pods requesting one ``nvidia.com/gpu``.

:func:`apply_result` (re-exported from :mod:`spotgpu.scheduler.apply`, the model-level applier)
applies a :class:`CycleResult` to a snapshot the way a cluster would once every decision has
taken effect (binds placed, ShadowPods created, victims gone or evicting, nominations recorded),
so tests can run several cycles in a row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, DeviceID, NodeName, ResourceName
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import Health, NodeStrategy, QueueType, SpotPriority
from spotgpu.scheduler.decisions import DEFAULT_CONTAINER, PodGroupPhase
from spotgpu.scheduler.model import GPU, GPURequest, IdleForecast, Node, Nomination, Pod, PodGroup, Queue

DEFAULT_NAMESPACE = "default"


def gpu_id(node: str, index: int) -> DeviceID:
    """The device ID builders give GPU ``index`` of ``node``."""
    return DeviceID(f"GPU-{node}-{index}")


def _owner(owner: ContainerRef | str) -> ContainerRef:
    return owner if isinstance(owner, ContainerRef) else ContainerRef.parse(owner)


class MakeNode:
    def __init__(self, name: str, gpus: int = 8) -> None:
        self._name = name
        self._gpus = [GPU(gpu_id(name, i)) for i in range(gpus)]
        self._resource: ResourceName = NVIDIA_GPU_RESOURCE
        self._lending = False
        self._strategy = NodeStrategy.IDLE
        self._schedulable = True
        self._pool = ""
        self._forecast: dict[DeviceID, IdleForecast] = {}

    def gpus(self, n: int) -> MakeNode:
        self._gpus = [GPU(gpu_id(self._name, i)) for i in range(n)]
        return self

    def resource(self, resource: str) -> MakeNode:
        self._resource = ResourceName(resource)
        return self

    def lending(self, allowed: bool = True) -> MakeNode:
        self._lending = allowed
        return self

    def strategy(self, strategy: NodeStrategy) -> MakeNode:
        self._strategy = strategy
        return self

    def lowpower(self) -> MakeNode:
        return self.strategy(NodeStrategy.LOWPOWER)

    def unschedulable(self) -> MakeNode:
        self._schedulable = False
        return self

    def pool(self, pool: str) -> MakeNode:
        self._pool = pool
        return self

    def owner(self, indexes: Iterable[int], owner: ContainerRef | str, *, active: bool = True) -> MakeNode:
        """GPUs ``indexes`` are allocated to ``owner``; an active owner makes their twins Unhealthy."""
        ref = _owner(owner)
        twin = Health.UNHEALTHY if active else Health.HEALTHY
        for i in indexes:
            self._gpus[i] = dataclasses.replace(self._gpus[i], owner=ref, twin=twin)
        return self

    def twin(self, index: int, health: Health) -> MakeNode:
        self._gpus[index] = dataclasses.replace(self._gpus[index], twin=health)
        return self

    def forecast(self, indexes: Iterable[int], p20: int, expected: int | None = None) -> MakeNode:
        """The agent forecasts the owner of GPUs ``indexes`` to stay idle ``p20`` s (conservatively)."""
        for i in indexes:
            self._forecast[self._gpus[i].id] = IdleForecast(expected if expected is not None else p20, p20)
        return self

    def auto(self) -> MakeNode:
        return self.strategy(NodeStrategy.AUTO)

    def broken(self, index: int) -> MakeNode:
        """The real GPU ``index`` is unhealthy."""
        self._gpus[index] = dataclasses.replace(self._gpus[index], health=Health.UNHEALTHY)
        return self

    def obj(self) -> Node:
        return Node(
            NodeName(self._name),
            tuple(self._gpus),
            self._resource,
            self._lending,
            self._strategy,
            self._schedulable,
            self._pool,
            dict(self._forecast),
        )


class MakeQueue:
    def __init__(self, name: str) -> None:
        self._name = name
        self._type = QueueType.RESERVED
        self._weight = 1
        self._capacity: int | None = None

    def spot(self) -> MakeQueue:
        self._type = QueueType.SPOT
        return self

    def weight(self, weight: int) -> MakeQueue:
        self._weight = weight
        return self

    def capacity(self, milli: int | None) -> MakeQueue:
        self._capacity = milli
        return self

    def obj(self) -> Queue:
        return Queue(self._name, self._type, self._weight, self._capacity)


class MakePodGroup:
    def __init__(self, name: str, namespace: str = DEFAULT_NAMESPACE) -> None:
        self._ref = PodRef(namespace, name)
        self._queue = "default"
        self._min = 1
        self._priority = 0
        self._spot: SpotPriority | None = None
        self._phase = PodGroupPhase.INQUEUE
        self._created = 0.0
        self._pool: str | None = None
        self._min_lease = 0.0
        self._checkpoint = 0.0

    def queue(self, queue: str) -> MakePodGroup:
        self._queue = queue
        return self

    def min_member(self, n: int) -> MakePodGroup:
        self._min = n
        return self

    def priority(self, value: int) -> MakePodGroup:
        self._priority = value
        return self

    def spot(self, priority: SpotPriority = SpotPriority.SPOTLOW) -> MakePodGroup:
        self._spot = priority
        return self

    def phase(self, phase: PodGroupPhase) -> MakePodGroup:
        self._phase = phase
        return self

    def created(self, at: float) -> MakePodGroup:
        self._created = at
        return self

    def pool(self, pool: str | None) -> MakePodGroup:
        self._pool = pool
        return self

    def min_lease(self, seconds: float) -> MakePodGroup:
        self._min_lease = seconds
        return self

    def checkpoint_interval(self, seconds: float) -> MakePodGroup:
        self._checkpoint = seconds
        return self

    def obj(self) -> PodGroup:
        return PodGroup(
            self._ref,
            self._queue,
            self._min,
            self._priority,
            self._spot,
            self._phase,
            self._created,
            self._pool,
            self._min_lease,
            self._checkpoint,
        )


class MakePod:
    def __init__(self, name: str, namespace: str = DEFAULT_NAMESPACE) -> None:
        self._ref = PodRef(namespace, name)
        self._group = name
        self._request = GPURequest.reserved(1)
        self._container = DEFAULT_CONTAINER
        self._node: NodeName | None = None
        self._devices: tuple[DeviceID, ...] = ()
        self._start: float | None = None
        self._evicting = False
        self._nominated: Nomination | None = None
        self._created = 0.0

    def group(self, name: str) -> MakePod:
        self._group = name
        return self

    def gpus(self, n: int, resource: str = NVIDIA_GPU_RESOURCE) -> MakePod:
        self._request = GPURequest.reserved(n, ResourceName(resource))
        return self

    def spot_gpus(self, n: int) -> MakePod:
        self._request = GPURequest.spot(n)
        return self

    def shared(self, milli: int) -> MakePod:
        self._request = GPURequest.shared(milli)
        return self

    def request(self, request: GPURequest) -> MakePod:
        self._request = request
        return self

    def container(self, name: str) -> MakePod:
        self._container = name
        return self

    def node(self, node: str, devices: Sequence[str | int]) -> MakePod:
        """Placed on ``node`` with these devices (IDs, or GPU indexes of a :class:`MakeNode` node)."""
        self._node = NodeName(node)
        self._devices = tuple(gpu_id(node, d) if isinstance(d, int) else DeviceID(d) for d in devices)
        return self

    def started(self, at: float) -> MakePod:
        self._start = at
        return self

    def evicting(self, flag: bool = True) -> MakePod:
        self._evicting = flag
        return self

    def nominated(self, node: str, devices: Sequence[str | int]) -> MakePod:
        ids = tuple(gpu_id(node, d) if isinstance(d, int) else DeviceID(d) for d in devices)
        self._nominated = Nomination(NodeName(node), ids)
        return self

    def created(self, at: float) -> MakePod:
        self._created = at
        return self

    def obj(self) -> Pod:
        return Pod(
            self._ref,
            self._group,
            self._request,
            self._container,
            self._node,
            self._devices,
            self._start,
            self._evicting,
            self._nominated,
            self._created,
        )


__all__ = [
    "DEFAULT_NAMESPACE",
    "MakeNode",
    "MakePod",
    "MakePodGroup",
    "MakeQueue",
    "gpu_id",
]
