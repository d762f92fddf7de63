"""Allocation: gangs all or nothing, queues and priorities, binpack/spread, fragmentation, backfill."""

from __future__ import annotations

import pytest

from spotgpu.core.types import QueueType
from spotgpu.scheduler import NodeOrder, PodGroupPhase, Queue, SchedulerConfig, Snapshot, run_cycle
from spotgpu.scheduler.testing import MakeNode, MakePod, MakePodGroup, MakeQueue

from .helpers import QUEUES, bound, gang, ref, snapshot


def test_gang_that_does_not_fit_gets_nothing_and_a_reason() -> None:
    """3 pods x 4 GPUs on two 4-GPU nodes: no bind at all, and the reason names the shortfall."""
    snap = snapshot([MakeNode("n1", 4).obj(), MakeNode("n2", 4).obj()], [gang("big", 3, gpus=4)])
    result = run_cycle(snap, now=1.0)
    assert result.binds == ()
    reason = result.reasons()[ref("big")]
    assert reason.startswith("2 of 3 pods needed for min_member 3 fit: ")
    assert "0/2 nodes fit 4 x nvidia.com/gpu: 2 have fewer than 4 free nvidia.com/gpu" in reason
    status = next(s for s in result.statuses if s.group == ref("big"))
    assert (status.phase, status.reason) == (PodGroupPhase.INQUEUE, "Unschedulable")


def test_a_failed_gang_leaves_room_for_the_next() -> None:
    """The discarded statement gives back what the gang had tentatively taken."""
    snap = snapshot(
        [MakeNode("n1", 4).obj(), MakeNode("n2", 4).obj()],
        [gang("big", 3, gpus=4, priority=10), gang("small", 2, gpus=4, priority=1)],
    )
    result = run_cycle(snap, now=1.0)
    assert set(bound(result)) == {"small-0", "small-1"}
    assert {b.node for b in result.binds} == {"n1", "n2"}
    assert result.stats.gangs_placed == 1 and result.stats.pods_placed == 2


def test_binds_name_exact_devices_and_gpus_are_never_given_twice() -> None:
    snap = snapshot([MakeNode("n1", 8).obj()], [gang("a", 2, gpus=3), gang("b", 1, gpus=2)])
    result = run_cycle(snap, now=1.0)
    devices = [d for b in result.binds for d in b.devices]
    assert len(devices) == 8 and len(set(devices)) == 8
    assert all(b.resource == "nvidia.com/gpu" and b.owners == () for b in result.binds)


def test_priority_decides_who_gets_scarce_gpus() -> None:
    snap = snapshot(
        [MakeNode("n1", 4).obj()],
        [gang("low", 1, gpus=4, priority=1, created=0.0), gang("high", 1, gpus=4, priority=100, created=5.0)],
    )
    assert set(bound(run_cycle(snap, now=1.0))) == {"high-0"}


def test_age_breaks_priority_ties() -> None:
    snap = snapshot(
        [MakeNode("n1", 4).obj()], [gang("young", 1, gpus=4, created=9.0), gang("old", 1, gpus=4, created=1.0)]
    )
    assert set(bound(run_cycle(snap, now=10.0))) == {"old-0"}


def test_reserved_queues_are_served_before_spot_queues() -> None:
    snap = snapshot(
        [MakeNode("n1", 4).obj()],
        [gang("spotty", 1, spot_gpus=4, created=0.0), gang("res", 1, gpus=4, created=100.0)],
    )
    assert set(bound(run_cycle(snap, now=200.0))) == {"res-0"}


def test_fair_share_between_queues_by_weight() -> None:
    """Queue b (weight 3) gets about three times the GPUs of queue a (weight 1) when both want more."""
    queues = (Queue("a", QueueType.RESERVED, 1), Queue("b", QueueType.RESERVED, 3))
    gangs = [gang(f"a{i}", 1, gpus=1, queue="a") for i in range(8)]
    gangs += [gang(f"b{i}", 1, gpus=1, queue="b") for i in range(8)]
    snap = snapshot([MakeNode("n1", 8).obj()], gangs, queues=queues)
    placed = bound(run_cycle(snap, now=1.0))
    assert len(placed) == 8
    assert sum(1 for p in placed if p.startswith("b")) == 6
    assert sum(1 for p in placed if p.startswith("a")) == 2


def test_queue_capacity_holds_back_admission_and_placement() -> None:
    queues = (MakeQueue("capped").capacity(2000).obj(),)
    gangs = [
        (
            MakePodGroup("fits").queue("capped").phase(PodGroupPhase.PENDING).obj(),
            [MakePod("fits-0").group("fits").gpus(2).obj()],
        ),
        (
            MakePodGroup("over").queue("capped").phase(PodGroupPhase.PENDING).obj(),
            [MakePod("over-0").group("over").gpus(1).obj()],
        ),
    ]
    result = run_cycle(snapshot([MakeNode("n1", 8).obj()], gangs, queues=queues), now=1.0)
    assert set(bound(result)) == {"fits-0"}
    assert "queue 'capped' capacity 2000 milli reached (2000 in use)" in result.reasons()[ref("over")]


def test_enqueue_waits_for_min_member_pods() -> None:
    group = MakePodGroup("g").min_member(3).phase(PodGroupPhase.PENDING).obj()
    pods = [MakePod(f"g-{i}").group("g").obj() for i in range(2)]
    result = run_cycle(Snapshot.of([MakeNode("n1", 8).obj()], QUEUES, [group], pods), now=1.0)
    assert result.binds == ()
    assert result.reasons()[ref("g")] == (
        "not admitted: gang has 2 of min_member 3 pods; waiting for the rest to be created"
    )
    three = Snapshot.of([MakeNode("n1", 8).obj()], QUEUES, [group], [*pods, MakePod("g-2").group("g").obj()])
    result = run_cycle(three, now=2.0)
    assert len(result.binds) == 3
    assert [s.phase for s in result.statuses] == [PodGroupPhase.RUNNING]


def test_members_beyond_min_member_are_backfilled_one_by_one() -> None:
    """min_member 2 of 4 pods x 2 GPUs on 6 GPUs: the gang runs with 3, the fourth waits."""
    snap = snapshot([MakeNode("n1", 6).obj()], [gang("elastic", 4, gpus=2, min_member=2)])
    result = run_cycle(snap, now=1.0)
    assert set(bound(result)) == {"elastic-0", "elastic-1", "elastic-2"}
    assert ref("elastic") not in result.reasons()


def test_binpack_fills_the_fullest_node_and_spread_the_emptiest() -> None:
    nodes = [MakeNode("busy", 4).owner([0, 1], "dev/a/main").obj(), MakeNode("empty", 4).obj()]
    snap = snapshot(nodes, [gang("one", 1, gpus=1)])
    assert bound(run_cycle(snap, SchedulerConfig(fragmentation_weight=0), now=1.0))["one-0"][0] == "busy"
    spread = SchedulerConfig(node_order=NodeOrder.SPREAD, fragmentation_weight=0)
    assert bound(run_cycle(snap, spread, now=1.0))["one-0"][0] == "empty"


def test_fragmentation_keeps_whole_nodes_for_large_pending_work() -> None:
    """With 4-GPU work waiting, a 2-GPU pod goes where it completes a fragment, not into a whole node.

    Node "two" has 2 free GPUs (useless for the 4-GPU pods), node "four" has 4. Plain binpack
    already prefers "two"; this checks the combined score keeps doing so and that the 4-GPU gang
    then still fits on "four" in the same cycle.
    """
    nodes = [MakeNode("four", 4).obj(), MakeNode("two", 4).owner([0, 1], "dev/a/main").obj()]
    snap = snapshot(nodes, [gang("small", 1, gpus=2, priority=5), gang("large", 1, gpus=4, priority=1)])
    placed = bound(run_cycle(snap, now=1.0))
    assert placed["small-0"][0] == "two"
    assert placed["large-0"][0] == "four"


def test_fragmentation_score_overrides_spread_to_keep_a_whole_node() -> None:
    """Spread alone puts a 1-GPU pod on the emptiest node ("whole", 8 free). With 8-GPU pods pending,
    that would turn "whole" into a 7-GPU fragment none of them can use, while the single free GPU
    of "frag" is useless to them anyway: the fragmentation score sends the pod to "frag"."""
    nodes = [MakeNode("frag", 8).owner(range(7), "dev/a/main").obj(), MakeNode("whole", 8).obj()]
    snap = snapshot(nodes, [gang("one", 1, gpus=1, priority=9), *[gang(f"q{i}", 1, gpus=8) for i in range(3)]])
    spread_only = SchedulerConfig(node_order=NodeOrder.SPREAD, fragmentation_weight=0)
    frag_aware = SchedulerConfig(node_order=NodeOrder.SPREAD, fragmentation_weight=4)
    assert bound(run_cycle(snap, spread_only, now=1.0))["one-0"][0] == "whole"
    assert bound(run_cycle(snap, frag_aware, now=1.0))["one-0"][0] == "frag"


@pytest.mark.parametrize(
    ("node", "why"),
    [
        (MakeNode("n1", 2).unschedulable().obj(), "1 node unschedulable"),
        (MakeNode("n1", 2).resource("amd.com/gpu").obj(), "1 have amd.com/gpu, not nvidia.com/gpu"),
        (MakeNode("n1", 2).pool("h100").obj(), "1 not in pool 'a100'"),
        (MakeNode("n1", 2).broken(0).obj(), "1 have fewer than 2 free nvidia.com/gpu"),
    ],
    ids=["unschedulable", "other-resource", "other-pool", "broken-gpu"],
)
def test_nodes_that_cannot_take_a_task(node: object, why: str) -> None:
    group = MakePodGroup("g").pool("a100" if "pool" in why else None).obj()
    snap = Snapshot.of([node], QUEUES, [group], [MakePod("g-0").group("g").gpus(2).obj()])  # type: ignore[list-item]
    result = run_cycle(snap, now=1.0)
    assert result.binds == ()
    assert why in result.reasons()[ref("g")]


def test_pool_and_resource_match() -> None:
    nodes = [MakeNode("a", 2).pool("a100").obj(), MakeNode("h", 2).pool("h100").resource("example.com/gpu").obj()]
    groups = [MakePodGroup("g").pool("h100").obj()]
    pods = [MakePod("g-0").group("g").gpus(2, "example.com/gpu").obj()]
    result = run_cycle(Snapshot.of(nodes, QUEUES, groups, pods), now=1.0)
    assert bound(result) == {"g-0": ("h", ("GPU-h-0", "GPU-h-1"))}
    assert result.binds[0].resource == "example.com/gpu"


def test_running_gang_is_reported_running_and_left_alone() -> None:
    group = MakePodGroup("g").phase(PodGroupPhase.INQUEUE).obj()
    pod = MakePod("g-0").group("g").gpus(1).node("n1", [0]).started(0.0).obj()
    snap = Snapshot.of([MakeNode("n1", 2).owner([0], "default/g-0/main").obj()], QUEUES, [group], [pod])
    result = run_cycle(snap, now=1.0)
    assert result.binds == () and result.evictions == ()
    assert [(s.group, s.phase) for s in result.statuses] == [(ref("g"), PodGroupPhase.RUNNING)]


def test_same_snapshot_same_decisions() -> None:
    gangs = [gang(f"g{i}", 1 + i % 3, gpus=1 + i % 2, priority=i % 4) for i in range(12)]
    gangs += [gang(f"s{i}", 1 + i % 2, spot_gpus=1) for i in range(6)]
    snap = snapshot([MakeNode(f"n{i}", 4).obj() for i in range(5)], gangs)
    assert run_cycle(snap, now=3.0) == run_cycle(snap, now=3.0)
