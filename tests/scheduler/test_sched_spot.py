"""The spot plugin: Healthy twins only, lending rules, strategies, ShadowPods and device owners."""

from __future__ import annotations

import json

from spotgpu.core import keys
from spotgpu.core.ids import NodeName
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import Health, NodeStrategy, SpotPriority
from spotgpu.scheduler import SchedulerConfig, ShadowPod, Snapshot, run_cycle
from spotgpu.scheduler.apply import apply_result
from spotgpu.scheduler.testing import MakeNode, MakePod, MakePodGroup, gpu_id

from .helpers import QUEUES, bound, gang, ref, snapshot

ALICE = ContainerRef("dev", "alice", "main")


def test_spot_only_on_healthy_twins() -> None:
    """An active owner's GPUs (twins Unhealthy) are never lent, even on a lending node."""
    node = MakeNode("n1", 2).owner([0, 1], ALICE, active=True).lending().obj()
    result = run_cycle(snapshot([node], [gang("s", 1, spot_gpus=1)]), now=1.0)
    assert result.binds == ()
    assert "fewer than 1 lendable spot GPUs (Healthy twins)" in result.reasons()[ref("s")]


def test_unhealthy_twin_of_an_unallocated_gpu_is_not_used() -> None:
    node = MakeNode("n1", 2).twin(0, Health.UNHEALTHY).obj()
    result = run_cycle(snapshot([node], [gang("s", 1, spot_gpus=1)]), now=1.0)
    assert bound(result)["s-0"] == ("n1", (gpu_id("n1", 1),))


def test_idle_allocated_gpus_are_lent_only_where_the_node_allows_it() -> None:
    closed = MakeNode("n1", 2).owner([0, 1], ALICE, active=False).obj()
    result = run_cycle(snapshot([closed], [gang("s", 1, spot_gpus=1)]), now=1.0)
    assert result.binds == ()
    opened = MakeNode("n1", 2).owner([0, 1], ALICE, active=False).lending().obj()
    result = run_cycle(snapshot([opened], [gang("s", 1, spot_gpus=1)]), now=1.0)
    (bind,) = result.binds
    assert bind.owners[0].owner == ALICE
    assert result.shadow_creations == ()


def test_unallocated_gpus_get_a_shadow_pod_that_owns_them() -> None:
    snap = snapshot([MakeNode("n1", 4).obj()], [gang("s", 2, spot_gpus=1, spot=SpotPriority.SPOTMID)])
    result = run_cycle(snap, now=5.0)
    (shadow,) = result.shadow_creations
    assert (
        shadow.node == "n1" and shadow.group == ref("s") and shadow.pod.namespace == "spotgpu-system"
    )  # never the gang's: scheduler-only
    assert shadow.resource == "nvidia.com/gpu"
    assert sorted(shadow.devices) == sorted(d for b in result.binds for d in b.devices)
    for bind in result.binds:
        assert bind.spot and bind.resource == "platform/spot-gpu"
        assert bind.owner_map() == dict.fromkeys(bind.devices, shadow.container_ref)
        owner_json = json.loads(bind.annotations()[keys.DEVICE_OWNER])
        assert owner_json == dict.fromkeys(bind.devices, f"spotgpu-system/{shadow.pod.name}/main")
    decisions = list(result.decisions())
    assert decisions.index(shadow) < min(decisions.index(b) for b in result.binds)


def test_existing_shadow_pod_is_reused_by_later_spot_pods() -> None:
    shadow_owner = ContainerRef("default", "old-shadow", "main")
    node = MakeNode("n1", 2).owner([0], shadow_owner, active=False).obj()
    shadow = ShadowPod(PodRef("default", "old-shadow"), NodeName("n1"), (gpu_id("n1", 0),), created_at=0.0)
    snap = snapshot([node], [gang("s", 1, spot_gpus=1)], shadows=[shadow])
    result = run_cycle(snap, now=1.0)
    (bind,) = result.binds
    assert bind.devices == (gpu_id("n1", 0),)
    assert bind.owners[0].owner == shadow_owner
    assert result.shadow_creations == ()


def test_idle_strategy_uses_unallocated_gpus_first_lowpower_uses_lent_gpus_first() -> None:
    for strategy, expected in ((NodeStrategy.IDLE, 2), (NodeStrategy.LOWPOWER, 0)):
        node = MakeNode("n1", 4).owner([0, 1], ALICE, active=False).lending().strategy(strategy).obj()
        result = run_cycle(snapshot([node], [gang("s", 1, spot_gpus=1)]), now=1.0)
        assert bound(result)["s-0"][1] == (gpu_id("n1", expected),), strategy


def test_exclusive_spot_prefers_idle_nodes_and_shared_spot_prefers_lowpower_nodes() -> None:
    nodes = [
        MakeNode("lp", 4).owner(range(4), ALICE, active=False).lending().lowpower().obj(),
        MakeNode("id", 4).obj(),
    ]
    result = run_cycle(snapshot(nodes, [gang("ex", 1, spot_gpus=1), gang("sh", 1, milli=500)]), now=1.0)
    placed = bound(result)
    assert placed["ex-0"][0] == "id"
    assert placed["sh-0"][0] == "lp"


def test_shared_spot_packs_into_partly_used_gpus() -> None:
    """Shared pods fill one twin (best fit) before starting another; never beyond 1000 milli."""
    snap = snapshot(
        [MakeNode("n1", 2).owner([0, 1], ALICE, active=False).lending().lowpower().obj()],
        [gang(f"s{i}", 1, milli=m) for i, m in enumerate((500, 250, 250, 600))],
    )
    result = run_cycle(snap, now=1.0)
    per_gpu: dict[str, int] = {}
    for b in result.binds:
        assert len(b.devices) == 1 and b.milli > 0
        per_gpu[b.devices[0]] = per_gpu.get(b.devices[0], 0) + b.milli
    assert sorted(per_gpu.values()) == [600, 1000]
    assert len(result.binds) == 4


def test_shared_and_exclusive_never_mix_on_a_twin() -> None:
    node = MakeNode("n1", 1).owner([0], ALICE, active=False).lending().obj()
    group = MakePodGroup("sh").queue("spot").spot().obj()
    running = MakePod("sh-0").group("sh").shared(300).node("n1", [0]).started(0.0).obj()
    ex_group, ex_pods = gang("ex", 1, spot_gpus=1)
    snap = Snapshot.of([node], QUEUES, [group, ex_group], [running, *ex_pods])
    result = run_cycle(snap, now=1.0)
    assert result.binds == ()


def test_shadow_pods_without_users_are_collected_after_the_grace() -> None:
    owner = ContainerRef("default", "idle-shadow", "main")
    node = MakeNode("n1", 2).owner([0], owner, active=False).obj()
    shadow = ShadowPod(PodRef("default", "idle-shadow"), NodeName("n1"), (gpu_id("n1", 0),), created_at=100.0)
    snap = snapshot([node], shadows=[shadow])
    config = SchedulerConfig()
    assert run_cycle(snap, config, now=100.0 + config.shadow_gc_grace - 1).shadow_deletions == ()
    (deletion,) = run_cycle(snap, config, now=100.0 + config.shadow_gc_grace).shadow_deletions
    assert deletion.pod == PodRef("default", "idle-shadow") and deletion.devices == (gpu_id("n1", 0),)
    assert "no spot pod has used its GPUs" in deletion.reason


def test_shadow_pod_with_users_is_kept() -> None:
    owner = ContainerRef("default", "busy-shadow", "main")
    node = MakeNode("n1", 1).owner([0], owner, active=False).obj()
    shadow = ShadowPod(PodRef("default", "busy-shadow"), NodeName("n1"), (gpu_id("n1", 0),), created_at=0.0)
    group = MakePodGroup("s").queue("spot").spot().obj()
    pod = MakePod("s-0").group("s").spot_gpus(1).node("n1", [0]).started(0.0).obj()
    snap = Snapshot.of([node], QUEUES, [group], [pod], [shadow])
    assert run_cycle(snap, now=1e6).shadow_deletions == ()


def test_multi_cycle_spot_lifecycle_keeps_owners_consistent() -> None:
    """Place, let the cluster apply it, place more: new pods reuse the shadow's GPUs' owner."""
    snap = snapshot([MakeNode("n1", 4).obj()], [gang("a", 1, milli=500)])
    first = run_cycle(snap, now=1.0)
    after = apply_result(snap, first, now=1.0)
    (shadow,) = after.shadows
    b_group, b_pods = gang("b", 1, milli=500)
    snap2 = Snapshot.of(after.nodes, after.queues, (*after.groups, b_group), (*after.pods, *b_pods), after.shadows)
    second = run_cycle(snap2, now=2.0)
    (bind,) = second.binds
    assert bind.devices == first.binds[0].devices  # best fit: the half-used twin
    assert bind.owners[0].owner == shadow.container_ref
    assert second.shadow_creations == ()
