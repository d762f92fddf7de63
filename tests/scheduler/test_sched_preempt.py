"""Preemption: reserved gangs evict whole spot gangs by the weighted policy, without storms."""

from __future__ import annotations

import dataclasses

from spotgpu.core.ids import NodeName
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import DurationPolicy, EvictionReason, SpotPriority, VictimWeights
from spotgpu.scheduler import (
    Nomination,
    PodGroupPhase,
    SchedulerConfig,
    ShadowPod,
    Snapshot,
    VictimScale,
    run_cycle,
    select_victims,
)
from spotgpu.scheduler.apply import apply_result
from spotgpu.scheduler.testing import gpu_id

from .helpers import Cluster, bound, evicted_groups, gang, ref

NOW = 10_000.0


def test_spotlow_is_evicted_before_spotmid_before_spothigh() -> None:
    c = Cluster()
    c.node("n1", 3)
    c.spot_running("hi", [("n1", [0])], priority=SpotPriority.SPOTHIGH)
    c.spot_running("mid", [("n1", [1])], priority=SpotPriority.SPOTMID)
    c.spot_running("lo", [("n1", [2])], priority=SpotPriority.SPOTLOW)
    for need, expected in ((1, {"lo"}), (2, {"lo", "mid"}), (3, {"lo", "mid", "hi"})):
        c2 = Cluster()
        c2.nodes, c2.groups, c2.pods, c2.shadows = c.nodes, list(c.groups), list(c.pods), c.shadows
        c2.add(gang("res", 1, gpus=need, priority=5))
        result = run_cycle(c2.snapshot(), now=NOW)
        assert evicted_groups(result) == expected, need
        (nom,) = result.nominations
        assert nom.pod == ref("res-0") and len(nom.devices) == need


def test_only_as_many_gangs_as_needed_and_never_reserved_work() -> None:
    c = Cluster()
    c.node("n1", 4).owner([0], "default/keep-0/main")
    c.groups.append(dataclasses.replace(gang("keep", 1, gpus=1)[0], phase=PodGroupPhase.RUNNING))
    c.pods.append(dataclasses.replace(gang("keep", 1, gpus=1)[1][0], node="n1", devices=(gpu_id("n1", 0),)))
    c.spot_running("a", [("n1", [1])])
    c.spot_running("b", [("n1", [2])])
    c.spot_running("c", [("n1", [3])])
    c.add(gang("res", 1, gpus=2, priority=5))
    result = run_cycle(c.snapshot(), now=NOW)
    assert len(evicted_groups(result)) == 2
    assert "keep" not in evicted_groups(result)
    assert all(e.reason is EvictionReason.RESERVED_PREEMPT and e.preemptor == ref("res") for e in result.evictions)


def test_a_reserved_gang_that_cannot_be_helped_evicts_nothing() -> None:
    c = Cluster()
    c.node("n1", 4).owner([0, 1], ContainerRef("dev", "alice", "main"))
    c.spot_running("a", [("n1", [2, 3])])
    c.add(gang("res", 1, gpus=3))
    result = run_cycle(c.snapshot(), now=NOW)
    assert result.evictions == () and result.nominations == ()
    assert (
        "preemption: no node has 3 x nvidia.com/gpu that evicting spot gangs could free" in result.reasons()[ref("res")]
    )


def test_spot_gangs_never_preempt() -> None:
    c = Cluster()
    c.node("n1", 2)
    c.spot_running("lo", [("n1", [0, 1])], priority=SpotPriority.SPOTLOW)
    c.add(gang("hi", 1, spot_gpus=2, spot=SpotPriority.SPOTHIGH))
    result = run_cycle(c.snapshot(), now=NOW)
    assert result.evictions == () and result.binds == ()


def test_whole_gang_is_evicted_on_every_node() -> None:
    c = Cluster()
    c.node("n1", 2)
    c.node("n2", 2)
    c.spot_running("wide", [("n1", [0, 1]), ("n2", [0])])
    c.add(gang("res", 1, gpus=2))
    result = run_cycle(c.snapshot(), now=NOW)
    assert {e.pod.name for e in result.evictions} == {"wide-0", "wide-1"}
    assert {e.node for e in result.evictions} == {"n1", "n2"}
    status = next(s for s in result.statuses if s.group == ref("wide"))
    assert (status.phase, status.reason) == (PodGroupPhase.PENDING, "Preempted")


def test_one_big_victim_beats_several_small_ones_when_it_costs_less() -> None:
    """Freeing 2 GPUs: one spotlow gang holding 2 GPUs, rather than two spotlow gangs of 1 each."""
    c = Cluster()
    c.node("n1", 4)
    c.spot_running("small1", [("n1", [0])], started=NOW - 10)
    c.spot_running("small2", [("n1", [1])], started=NOW - 10)
    c.spot_running("big", [("n1", [2, 3])], started=NOW - 10)
    c.add(gang("res", 1, gpus=2))
    assert evicted_groups(run_cycle(c.snapshot(), now=NOW)) == {"big"}


def test_shortest_running_goes_first_by_default_and_longest_when_configured() -> None:
    c = Cluster()
    c.node("n1", 2)
    c.spot_running("old", [("n1", [0])], started=NOW - 86_400)
    c.spot_running("new", [("n1", [1])], started=NOW - 60)
    c.add(gang("res", 1, gpus=1))
    assert evicted_groups(run_cycle(c.snapshot(), now=NOW)) == {"new"}
    longest = SchedulerConfig(victim=VictimWeights(duration_policy=DurationPolicy.LONGEST))
    assert evicted_groups(run_cycle(c.snapshot(), longest, now=NOW)) == {"old"}


def test_priority_outweighs_duration_with_default_weights() -> None:
    c = Cluster()
    c.node("n1", 2)
    c.spot_running("hi-new", [("n1", [0])], priority=SpotPriority.SPOTHIGH, started=NOW - 1)
    c.spot_running("lo-old", [("n1", [1])], priority=SpotPriority.SPOTLOW, started=0.0)
    c.add(gang("res", 1, gpus=1))
    assert evicted_groups(run_cycle(c.snapshot(), now=NOW)) == {"lo-old"}


def test_the_cheapest_node_wins() -> None:
    c = Cluster()
    c.node("n1", 2)
    c.node("n2", 2)
    c.spot_running("hi", [("n1", [0, 1])], priority=SpotPriority.SPOTHIGH)
    c.spot_running("lo", [("n2", [0, 1])], priority=SpotPriority.SPOTLOW)
    c.add(gang("res", 1, gpus=2))
    result = run_cycle(c.snapshot(), now=NOW)
    assert evicted_groups(result) == {"lo"}
    assert result.nominations[0].node == "n2"


def test_shared_gpu_is_freed_only_when_all_its_gangs_go() -> None:
    c = Cluster()
    c.node("n1", 1)
    c.spot_running("s1", [("n1", [0])], milli=500, via_shadow=False)
    c.spot_running("s2", [("n1", [0])], milli=500, via_shadow=False)
    c.add(gang("res", 1, gpus=1))
    assert evicted_groups(run_cycle(c.snapshot(), now=NOW)) == {"s1", "s2"}


def test_gang_preemptor_all_or_nothing() -> None:
    """Two pods of 2 GPUs: one node can be cleared, the other is a reserved owner's: nothing is evicted."""
    c = Cluster()
    c.node("n1", 2)
    c.node("n2", 2).owner([0], ContainerRef("dev", "bob", "main"))
    c.spot_running("lo", [("n1", [0, 1])])
    c.add(gang("res", 2, gpus=2))
    result = run_cycle(c.snapshot(), now=NOW)
    assert result.evictions == () and result.nominations == ()


def test_no_eviction_storm_while_victims_terminate_then_bind() -> None:
    """Cycle 1 evicts and nominates; while the victims terminate nothing new is evicted; then the
    ShadowPod is collected at once (its GPUs are nominated) and the preemptor binds to them."""
    c = Cluster()
    c.node("n1", 2)
    c.node("n2", 2)
    c.spot_running("lo1", [("n1", [0, 1])], priority=SpotPriority.SPOTLOW)
    c.spot_running("lo2", [("n2", [0, 1])], priority=SpotPriority.SPOTLOW, started=5.0)
    c.add(gang("res", 1, gpus=2, priority=1))
    snap = c.snapshot()
    first = run_cycle(snap, now=NOW)
    assert len(evicted_groups(first)) == 1
    (nom,) = first.nominations
    terminating = apply_result(snap, first, NOW, evicted="evicting")
    what_if = select_victims(terminating, ref("res"), now=NOW + 1)
    assert what_if.possible and what_if.victims == () and what_if.evictions == ()
    assert what_if.waiting_on == tuple(e.pod for e in first.evictions)
    for t in (1, 2, 3):
        again = run_cycle(terminating, now=NOW + t)
        assert again.evictions == () and again.nominations == () and again.binds == ()
        assert "waiting for 1 pods already being evicted" in again.reasons()[ref("res")]
    gone = apply_result(snap, first, NOW)
    collect = run_cycle(gone, now=NOW + 5)
    (deletion,) = collect.shadow_deletions
    assert set(deletion.devices) == set(nom.devices)
    assert "nominated for a preempting reserved pod" in deletion.reason
    assert collect.binds == () and collect.evictions == ()
    freed = apply_result(gone, collect, NOW + 5)
    final = run_cycle(freed, now=NOW + 6)
    assert bound(final) == {"res-0": (nom.node, nom.devices)}
    assert [c.pod for c in final.cleared_nominations] == [ref("res-0")]


def test_nominated_gpus_are_kept_from_spot_work() -> None:
    """GPU 0 was freed for res-0 (its ShadowPod has no user left): a spot gang may not take it."""
    c = Cluster()
    c.node("n1", 2).owner([1], ContainerRef("dev", "x", "main"), active=True)
    shadow = PodRef("default", "old-shadow")
    c.nodes["n1"].owner([0], shadow.container("main"), active=False)
    c.shadows.append(ShadowPod(shadow, NodeName("n1"), (gpu_id("n1", 0),), created_at=NOW))
    group, (pod,) = gang("res", 1, gpus=1)
    c.add((group, [dataclasses.replace(pod, nominated=Nomination(NodeName("n1"), (gpu_id("n1", 0),)))]))
    c.add(gang("greedy", 1, spot_gpus=1, spot=SpotPriority.SPOTHIGH))
    result = run_cycle(c.snapshot(), now=NOW)
    assert result.binds == ()
    assert "fewer than 1 lendable spot GPUs" in result.reasons()[ref("greedy")]
    (deletion,) = result.shadow_deletions
    assert deletion.pod == shadow
    assert result.nominations == () and result.cleared_nominations == ()  # unchanged nomination


def test_a_partial_snapshot_with_the_cluster_victim_scale_chooses_like_the_full_one() -> None:
    """Scores are normalised over the running spot gangs. Gang "big" (8 pods, 8 GPUs, on n2) is
    left out of the partial snapshot: without the scale, tasks and GPUs weigh more and "wide"
    (2 pods) looks costlier than the long-running "long"; with the scale, as in the full one,
    "wide" is evicted."""
    c = Cluster()
    c.node("n1", 3)
    c.node("n2", 8)
    c.spot_running("wide", [("n1", [0]), ("n1", [1])], started=NOW - 100)
    c.spot_running("long", [("n1", [2])], started=NOW - 1000)
    c.spot_running("big", [("n2", [i]) for i in range(8)], started=NOW - 500)
    c.add(gang("res", 1, gpus=1))
    full = c.snapshot()
    assert evicted_groups(run_cycle(full, now=NOW)) == {"wide"}
    partial = Snapshot(
        tuple(n for n in full.nodes if n.name == "n1"),
        full.queues,
        tuple(g for g in full.groups if g.ref != ref("big")),
        tuple(p for p in full.pods if p.group != "big"),
        tuple(s for s in full.shadows if s.node == "n1"),
    )
    assert evicted_groups(run_cycle(partial, now=NOW)) == {"long"}  # normalised over fewer gangs
    scale = VictimScale(tasks=8, milli=8000, earliest_start=NOW - 1000)
    scaled = dataclasses.replace(partial, victim_scale=scale)
    assert evicted_groups(run_cycle(scaled, now=NOW)) == {"wide"}
    assert select_victims(scaled, ref("res"), now=NOW).victims == (ref("wide"),)


def test_select_victims_is_a_what_if() -> None:
    c = Cluster()
    c.node("n1", 2)
    c.spot_running("lo", [("n1", [0, 1])])
    c.add(gang("res", 1, gpus=2))
    snap = c.snapshot()
    plan = select_victims(snap, ref("res"), now=NOW)
    assert plan.possible and plan.victims == (ref("lo"),)
    assert [e.pod for e in plan.evictions] == [ref("lo-0")]
    assert plan.nominations[0].devices == (gpu_id("n1", 0), gpu_id("n1", 1))
    assert run_cycle(snap, now=NOW).evictions == plan.evictions  # the cycle decides the same
    impossible = select_victims(_without_spot(snap), ref("res"), now=NOW)
    assert not impossible.possible
    assert impossible.reason == "no node has 2 x nvidia.com/gpu that evicting spot gangs could free"


def _without_spot(snap: Snapshot) -> Snapshot:
    owned = tuple(
        dataclasses.replace(
            n, gpus=tuple(dataclasses.replace(g, owner=ContainerRef("dev", "x", "main")) for g in n.gpus)
        )
        for n in snap.nodes
    )
    groups = tuple(g for g in snap.groups if g.ref == ref("res"))
    pods = tuple(p for p in snap.pods if p.group == "res")
    return Snapshot(owned, snap.queues, groups, pods, ())


def test_spot_gangs_of_the_same_cycle_do_not_take_what_a_preemptor_needs() -> None:
    """Reserved gangs preempt before spot queues are served: the 2 free GPUs go to the preemptor's
    nomination (with the 2 freed by evicting "lo"), not to the pending spot gang."""
    c = Cluster()
    c.node("n1", 4)
    c.spot_running("lo", [("n1", [2, 3])])
    c.add(gang("res", 1, gpus=4))
    c.add(gang("newspot", 1, spot_gpus=2, spot=SpotPriority.SPOTHIGH))
    result = run_cycle(c.snapshot(), now=NOW)
    assert evicted_groups(result) == {"lo"}
    (nom,) = result.nominations
    assert sorted(nom.devices) == [gpu_id("n1", i) for i in range(4)]
    assert result.binds == ()
    assert "fewer than 2 lendable spot GPUs" in result.reasons()[ref("newspot")]
