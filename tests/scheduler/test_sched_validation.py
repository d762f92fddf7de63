"""A snapshot that contradicts itself is refused before any decision, with an error naming the object."""

from __future__ import annotations

import dataclasses

import pytest

from spotgpu.core.ids import DeviceID, NodeName
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import SpotPriority
from spotgpu.scheduler import (
    GPU,
    Node,
    Queue,
    SchedulerConfig,
    ShadowPod,
    Snapshot,
    SnapshotError,
    VictimScale,
    run_cycle,
    select_victims,
)
from spotgpu.scheduler.testing import MakeNode, MakePod, MakePodGroup, MakeQueue, gpu_id

from .helpers import QUEUES, gang, ref, snapshot

SHADOW = ContainerRef("default", "sh", "main")


def _spot_group(name: str = "s") -> object:
    return MakePodGroup(name).queue("spot").spot(SpotPriority.SPOTMID).obj()


CASES = {
    "device-twice-one-node": (
        lambda: Snapshot.of([Node(NodeName("n1"), (GPU(DeviceID("GPU-x")), GPU(DeviceID("GPU-x"))))], QUEUES),
        "device GPU-x of node n1 is listed twice on that node",
    ),
    "device-on-two-nodes": (
        lambda: Snapshot.of(
            [Node(NodeName("n1"), (GPU(DeviceID("GPU-x")),)), Node(NodeName("n2"), (GPU(DeviceID("GPU-x")),))],
            QUEUES,
        ),
        "device GPU-x of node n2 is listed on node n1 too",
    ),
    "node-twice": (
        lambda: Snapshot.of([MakeNode("n1", 1).obj(), MakeNode("n1", 1).obj()], QUEUES),
        "node n1 is listed twice",
    ),
    "queue-twice": (
        lambda: Snapshot.of([], [Queue("q"), Queue("q")]),
        "queue q is listed twice",
    ),
    "group-twice": (
        lambda: Snapshot.of([], QUEUES, [MakePodGroup("g").obj(), MakePodGroup("g").obj()]),
        "PodGroup default/g is listed twice",
    ),
    "unknown-queue": (
        lambda: Snapshot.of([], QUEUES, [MakePodGroup("g").queue("nope").obj()]),
        "PodGroup default/g: queue 'nope' is not in the snapshot",
    ),
    "pod-twice": (
        lambda: Snapshot.of([], QUEUES, [MakePodGroup("g").obj()], [MakePod("p").group("g").obj()] * 2),
        "pod default/p is listed twice",
    ),
    "pod-without-group": (
        lambda: Snapshot.of([], QUEUES, [], [MakePod("p").group("g").obj()]),
        "pod default/p: its PodGroup default/g is not in the snapshot",
    ),
    "pod-on-unknown-node": (
        lambda: Snapshot.of(
            [MakeNode("n1", 2).obj()],
            QUEUES,
            [MakePodGroup("g").obj()],
            [MakePod("p").group("g").node("n9", ["GPU-n9-0"]).obj()],
        ),
        "pod default/p is on unknown node n9",
    ),
    "pod-on-device-of-other-node": (
        lambda: Snapshot.of(
            [MakeNode("n1", 2).obj(), MakeNode("n2", 2).obj()],
            QUEUES,
            [MakePodGroup("g").obj()],
            [MakePod("p").group("g").node("n1", [gpu_id("n2", 0)]).obj()],
        ),
        "pod default/p holds device GPU-n2-0, which its node n1 does not have",
    ),
    "reserved-pod-on-foreign-gpu": (
        lambda: Snapshot.of(
            [MakeNode("n1", 2).owner([0], "dev/alice/main").obj()],
            QUEUES,
            [MakePodGroup("g").obj()],
            [MakePod("p").group("g").node("n1", [0]).obj()],
        ),
        "pod default/p is placed on device GPU-n1-0 of n1, but the GPU's owner is dev/alice/main, not default/p/main",
    ),
    "reserved-pod-on-unallocated-gpu": (
        lambda: Snapshot.of(
            [MakeNode("n1", 2).obj()],
            QUEUES,
            [MakePodGroup("g").obj()],
            [MakePod("p").group("g").node("n1", [0]).obj()],
        ),
        "but the GPU's owner is nobody",
    ),
    "two-exclusive-spot-pods-on-one-twin": (
        lambda: Snapshot.of(
            [MakeNode("n1", 2).obj()],
            QUEUES,
            [_spot_group()],
            [
                MakePod("a").group("s").spot_gpus(1).node("n1", [0]).obj(),
                MakePod("b").group("s").spot_gpus(1).node("n1", [0]).obj(),
            ],
        ),
        "spot pod default/b uses device GPU-n1-0 of n1 exclusively, but default/a use it too",
    ),
    "shared-on-exclusive": (
        lambda: Snapshot.of(
            [MakeNode("n1", 2).obj()],
            QUEUES,
            [_spot_group()],
            [
                MakePod("a").group("s").spot_gpus(1).node("n1", [0]).obj(),
                MakePod("b").group("s").shared(100).node("n1", [0]).obj(),
            ],
        ),
        "spot pod default/b shares device GPU-n1-0 of n1, which default/a uses exclusively",
    ),
    "shared-beyond-one-gpu": (
        lambda: Snapshot.of(
            [MakeNode("n1", 2).obj()],
            QUEUES,
            [_spot_group()],
            [
                MakePod("a").group("s").shared(600).node("n1", [0]).obj(),
                MakePod("b").group("s").shared(500).node("n1", [0]).obj(),
            ],
        ),
        "device GPU-n1-0 of n1 is shared beyond one GPU: 600 milli of default/a plus 500 of default/b",
    ),
    "spot-gang-asks-for-real-gpus": (
        lambda: Snapshot.of([], QUEUES, [_spot_group()], [MakePod("a").group("s").gpus(1).obj()]),
        "pod default/a requests nvidia.com/gpu but its PodGroup default/s is in spot queue 'spot'",
    ),
    "reserved-gang-asks-for-twins": (
        lambda: Snapshot.of([], QUEUES, [MakePodGroup("g").obj()], [MakePod("a").group("g").spot_gpus(1).obj()]),
        "pod default/a requests platform/spot-gpu but its PodGroup default/g is in reserved queue 'default'",
    ),
    "shadow-does-not-own-its-devices": (
        lambda: Snapshot.of(
            [MakeNode("n1", 2).obj()],
            QUEUES,
            shadows=[ShadowPod(PodRef("default", "sh"), NodeName("n1"), (gpu_id("n1", 0),))],
        ),
        "ShadowPod default/sh lists device GPU-n1-0 on n1, but the GPU's owner is nobody",
    ),
    "shadow-on-unknown-node": (
        lambda: Snapshot.of(
            [MakeNode("n1", 2).obj()],
            QUEUES,
            shadows=[ShadowPod(PodRef("default", "sh"), NodeName("n7"), (gpu_id("n1", 0),))],
        ),
        "ShadowPod default/sh is on unknown node n7",
    ),
    "shadow-twice": (
        lambda: Snapshot.of(
            [MakeNode("n1", 2).owner([0], SHADOW).obj()],
            QUEUES,
            shadows=[ShadowPod(PodRef("default", "sh"), NodeName("n1"), (gpu_id("n1", 0),))] * 2,
        ),
        "ShadowPod default/sh is listed twice",
    ),
    "reserved-pod-on-shadow-gpu": (
        lambda: Snapshot.of(
            [MakeNode("n1", 2).owner([0], "default/p/main").obj()],
            QUEUES,
            [MakePodGroup("g").obj()],
            [MakePod("p").group("g").node("n1", [0]).obj()],
            [ShadowPod(PodRef("default", "p"), NodeName("n1"), (gpu_id("n1", 0),))],
        ),
        "pod default/p holds device GPU-n1-0, which ShadowPod default/p holds",
    ),
    "lists-not-tuples": (
        lambda: Snapshot([MakeNode("n1", 1).obj()], QUEUES, (), ()),  # type: ignore[arg-type]
        "snapshot nodes must be a tuple (use Snapshot.of), got list",
    ),
    "wrong-object-type": (
        lambda: Snapshot((MakeNode("n1", 1).obj(),), QUEUES, (MakeQueue("x").obj(),), ()),  # type: ignore[arg-type]
        "snapshot groups must hold PodGroup objects, got Queue",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_contradictions_are_refused_naming_the_object(case: str) -> None:
    build, message = CASES[case]
    snap = build()
    with pytest.raises(SnapshotError) as err:
        run_cycle(snap, SchedulerConfig(), now=10.0)  # type: ignore[arg-type]
    assert message in str(err.value)


def test_a_refused_snapshot_yields_no_decisions_at_all() -> None:
    """A pending gang that could be placed is not placed when anything else in the snapshot is wrong."""
    good = snapshot([MakeNode("n1", 4).obj()], [gang("ok", 2, gpus=1)])
    assert len(run_cycle(good, now=1.0).binds) == 2
    bad_node = Node(NodeName("n2"), (GPU(gpu_id("n1", 0)),))
    bad = dataclasses.replace(good, nodes=(*good.nodes, bad_node))
    with pytest.raises(SnapshotError, match="device GPU-n1-0 of node n2 is listed on node n1 too"):
        run_cycle(bad, now=1.0)


def test_now_must_be_a_finite_number() -> None:
    with pytest.raises(SnapshotError, match="now must be a finite number"):
        run_cycle(snapshot([]), now=float("nan"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tasks": -1}, "victim scale: tasks must be a non-negative integer, got -1"),
        ({"milli": 1.5}, "victim scale: milli must be a non-negative integer, got 1.5"),
        ({"tasks": True}, "victim scale: tasks must be a non-negative integer, got True"),
        ({"earliest_start": float("inf")}, "victim scale: earliest_start must be a finite time or None, got inf"),
    ],
)
def test_bad_victim_scale_is_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SnapshotError, match=message):
        VictimScale(**kwargs)  # type: ignore[arg-type]


def test_a_victim_scale_of_the_wrong_type_is_refused() -> None:
    snap = dataclasses.replace(snapshot([MakeNode("n1", 1).obj()]), victim_scale=(1, 2, 3.0))
    with pytest.raises(SnapshotError, match="snapshot victim_scale must be a VictimScale or None, got tuple"):
        run_cycle(snap, now=1.0)


def test_select_victims_refuses_unknown_or_spot_groups() -> None:
    snap = snapshot([MakeNode("n1", 2).obj()], [gang("s", 1, spot_gpus=1)])
    with pytest.raises(SnapshotError, match="PodGroup default/zzz is not in the snapshot"):
        select_victims(snap, ref("zzz"))
    with pytest.raises(SnapshotError, match="PodGroup default/s is a spot gang; only reserved gangs preempt"):
        select_victims(snap, ref("s"))


def test_stale_nominations_are_dropped_not_fatal() -> None:
    """A nomination that no longer fits is cleared with a reason; the rest of the cycle goes on."""
    pods = [
        MakePod("a").group("a").gpus(1).nominated("gone", ["GPU-gone-0"]).obj(),
        MakePod("b").group("b").gpus(1).nominated("n1", [gpu_id("n1", 0)]).obj(),
        MakePod("c").group("c").gpus(1).nominated("n1", [gpu_id("n1", 0)]).obj(),
        MakePod("d").group("d").gpus(1).nominated("n1", [gpu_id("n1", 1)]).obj(),
    ]
    snap = Snapshot.of(
        [MakeNode("n1", 4).owner([1], "dev/x/main").obj()],
        QUEUES,
        [MakePodGroup(n).obj() for n in "abcd"],
        pods,
    )
    result = run_cycle(snap, now=1.0)
    cleared = {c.pod.name: c.reason for c in result.cleared_nominations}
    assert "node gone is gone" in cleared["a"]
    assert "nominated for default/b as well" in cleared["c"]
    assert "now belongs to dev/x/main" in cleared["d"]
    assert "bound to n1" in cleared["b"]
    assert len(result.binds) == 3  # n1 has 3 GPUs free: b on its nomination, two of a/c/d elsewhere
