"""Small helpers shared by the scheduler tests (on top of spotgpu.scheduler.testing)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from spotgpu.core.ids import NodeName
from spotgpu.core.refs import PodRef
from spotgpu.core.types import SpotPriority
from spotgpu.scheduler import CycleResult, Node, Pod, PodGroup, PodGroupPhase, Queue, ShadowPod, Snapshot
from spotgpu.scheduler.testing import MakeNode, MakePod, MakePodGroup, MakeQueue, gpu_id

NS = "default"
QUEUES = (MakeQueue("default").obj(), MakeQueue("spot").spot().obj())


def ref(name: str) -> PodRef:
    return PodRef(NS, name)


def gang(
    name: str,
    pods: int,
    *,
    gpus: int = 0,
    spot_gpus: int = 0,
    milli: int = 0,
    priority: int = 0,
    spot: SpotPriority | None = None,
    min_member: int | None = None,
    queue: str | None = None,
    created: float = 0.0,
) -> tuple[PodGroup, list[Pod]]:
    """A pending gang of ``pods`` identical pods (reserved unless spot_gpus/milli/spot is given)."""
    is_spot = bool(spot_gpus or milli or spot)
    b = MakePodGroup(name).min_member(min_member or pods).priority(priority).created(created)
    b = b.queue(queue or ("spot" if is_spot else "default"))
    if is_spot:
        b = b.spot(spot or SpotPriority.SPOTLOW)
    members = []
    for i in range(pods):
        p = MakePod(f"{name}-{i}").group(name).created(float(i))
        if milli:
            p = p.shared(milli)
        elif spot_gpus:
            p = p.spot_gpus(spot_gpus)
        else:
            p = p.gpus(gpus or 1)
        members.append(p.obj())
    return b.obj(), members


def snapshot(
    nodes: Iterable[Node],
    gangs: Iterable[tuple[PodGroup, list[Pod]]] = (),
    *,
    queues: Iterable[Queue] = QUEUES,
    shadows: Iterable[ShadowPod] = (),
) -> Snapshot:
    groups: list[PodGroup] = []
    pods: list[Pod] = []
    for g, members in gangs:
        groups.append(g)
        pods.extend(members)
    return Snapshot.of(nodes, queues, groups, pods, shadows)


def bound(result: CycleResult) -> dict[str, tuple[str, tuple[str, ...]]]:
    """pod name -> (node, devices) of every bind."""
    return {b.pod.name: (b.node, b.devices) for b in result.binds}


def evicted_groups(result: CycleResult) -> set[str]:
    return {e.group.name for e in result.evictions}


class Cluster:
    """A tiny scenario builder: nodes, running spot gangs (through ShadowPods or lent GPUs), pending gangs."""

    def __init__(self) -> None:
        self.nodes: dict[str, MakeNode] = {}
        self.groups: list[PodGroup] = []
        self.pods: list[Pod] = []
        self.shadows: list[ShadowPod] = []

    def node(self, name: str, gpus: int = 4) -> MakeNode:
        self.nodes[name] = MakeNode(name, gpus)
        return self.nodes[name]

    def spot_running(
        self,
        name: str,
        placements: Iterable[tuple[str, Sequence[int]]],
        *,
        priority: SpotPriority = SpotPriority.SPOTLOW,
        started: float = 0.0,
        milli: int = 0,
        evicting: bool = False,
        via_shadow: bool = True,
    ) -> None:
        """A running spot gang: one pod per (node, GPU indexes); unallocated GPUs get a ShadowPod."""
        placements = list(placements)
        self.groups.append(
            MakePodGroup(name)
            .queue("spot")
            .spot(priority)
            .min_member(len(placements))
            .phase(PodGroupPhase.RUNNING)
            .obj()
        )
        for i, (node, indexes) in enumerate(placements):
            p = MakePod(f"{name}-{i}").group(name).node(node, list(indexes)).started(started).evicting(evicting)
            p = p.shared(milli) if milli else p.spot_gpus(len(indexes))
            self.pods.append(p.obj())
            if via_shadow:
                shadow = PodRef(NS, f"{name}-shadow-{node}-{i}")
                self.nodes[node].owner(indexes, shadow.container("main"), active=False)
                self.shadows.append(
                    ShadowPod(shadow, NodeName(node), tuple(gpu_id(node, j) for j in indexes), group=ref(name))
                )

    def add(self, g: tuple[PodGroup, list[Pod]]) -> None:
        self.groups.append(g[0])
        self.pods.extend(g[1])

    def snapshot(self) -> Snapshot:
        return Snapshot.of([n.obj() for n in self.nodes.values()], QUEUES, self.groups, self.pods, self.shadows)

    def shadow(self, name: str, node: str, indexes: Sequence[int], *, group: str | None = None) -> PodRef:
        """A ShadowPod from an earlier cycle holding GPUs ``indexes`` of ``node`` (Healthy twins).

        Spot gangs placed with ``via_shadow=False`` on these GPUs then share it, as after the
        scheduler reused the idle GPUs of a ShadowPod whose own gang had finished.
        """
        ref_ = PodRef(NS, name)
        self.nodes[node].owner(indexes, ref_.container("main"), active=False)
        self.shadows.append(
            ShadowPod(ref_, NodeName(node), tuple(gpu_id(node, j) for j in indexes), group=ref(group or name))
        )
        return ref_
