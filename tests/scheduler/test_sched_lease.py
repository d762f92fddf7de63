"""Placement by expected idle time (minLease, checkpointInterval, the agent's idle forecast) and
the demand-aware ``auto`` strategy: examples, then properties over random clusters."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import example, given, settings
from hypothesis import strategies as st

from spotgpu.core.ids import DeviceID
from spotgpu.core.refs import ContainerRef
from spotgpu.core.types import GPU_MILLI, Health, NodeStrategy, SpotPriority
from spotgpu.scheduler import CycleResult, Node, Snapshot, run_cycle
from spotgpu.scheduler.apply import apply_result
from spotgpu.scheduler.rules import Lend
from spotgpu.scheduler.state import ClusterState
from spotgpu.scheduler.status import Code
from spotgpu.scheduler.testing import MakeNode, MakePod, MakePodGroup

from .helpers import bound, gang, snapshot
from .test_sched_properties import check_invariants

NOW = 50_000.0
HOUR = 3600


def owner(i: int) -> ContainerRef:
    return ContainerRef("dev", f"dev-{i}", "main")


def lent(name: str, gpus: int, *, strategy: NodeStrategy = NodeStrategy.LOWPOWER) -> MakeNode:
    """A node whose GPUs are all allocated to one idle owner, lending allowed."""
    return MakeNode(name, gpus).owner(range(gpus), owner(hash(name) % 1000), active=False).lending().strategy(strategy)


def spot_gang(name: str, pods: int = 1, *, gpus: int = 1, min_lease: float = 0.0, checkpoint: float = 0.0) -> tuple:
    group = MakePodGroup(name).queue("spot").spot(SpotPriority.SPOTMID).min_member(pods)
    group = group.min_lease(min_lease).checkpoint_interval(checkpoint)
    members = [MakePod(f"{name}-{i}").group(name).spot_gpus(gpus).created(float(i)).obj() for i in range(pods)]
    return group.obj(), members


# --- minLease and best fit -------------------------------------------------------------------------


def test_a_min_lease_job_takes_only_a_lent_gpu_whose_forecast_covers_it() -> None:
    node = lent("n1", 2).forecast([0], p20=600).forecast([1], p20=2 * HOUR).obj()
    result = run_cycle(snapshot([node], [spot_gang("long", min_lease=HOUR)]), now=NOW)
    assert bound(result)["long-0"] == ("n1", (node.gpus[1].id,))


def test_long_jobs_go_to_long_idle_owners_and_short_ones_to_flappy_owners() -> None:
    flappy = lent("flappy", 1).forecast([0], p20=2000).obj()
    steady = lent("steady", 1).forecast([0], p20=20 * HOUR).obj()
    short = run_cycle(snapshot([steady, flappy], [spot_gang("short", min_lease=1800)]), now=NOW)
    assert bound(short)["short-0"][0] == "flappy"  # best fit: both cover, the tighter one wins
    both = run_cycle(snapshot([steady, flappy], [spot_gang("a", min_lease=1800), spot_gang("b", min_lease=HOUR)]))
    assert bound(both)["a-0"][0] == "flappy" and bound(both)["b-0"][0] == "steady"


def test_the_checkpoint_interval_alone_prefers_the_fitting_forecast_but_needs_none() -> None:
    flappy = lent("flappy", 1).forecast([0], p20=300).obj()
    steady = lent("steady", 1).forecast([0], p20=4 * HOUR).obj()
    unknown = lent("unknown", 1).obj()
    result = run_cycle(snapshot([unknown, flappy, steady], [spot_gang("ck", checkpoint=2 * HOUR)]), now=NOW)
    assert bound(result)["ck-0"][0] == "steady"
    alone = run_cycle(snapshot([unknown], [spot_gang("ck", checkpoint=2 * HOUR)]), now=NOW)
    assert bound(alone)["ck-0"][0] == "unknown"  # no minLease: an unknown forecast is acceptable


def test_a_min_lease_job_no_lent_gpu_covers_runs_on_unallocated_gpus() -> None:
    short = lent("short", 2).forecast([0, 1], p20=600).obj()
    free = MakeNode("free", 2).obj()
    result = run_cycle(snapshot([short, free], [spot_gang("long", min_lease=HOUR)]), now=NOW)
    assert bound(result)["long-0"][0] == "free"
    assert len(result.shadow_creations) == 1  # unallocated GPUs: infinite remainder, held by a ShadowPod


def test_a_min_lease_job_is_not_placed_on_lent_gpus_that_do_not_cover_it() -> None:
    nodes = [lent("short", 2).forecast([0], p20=600).obj(), lent("unknown", 2).obj()]
    result = run_cycle(snapshot(nodes, [spot_gang("long", min_lease=HOUR)]), now=NOW)
    assert result.binds == ()
    (entry,) = result.unschedulable
    assert entry.code is Code.UNSCHEDULABLE  # a longer forecast, or a free GPU, may come
    assert "whose owner's idle forecast (p20) covers minLease 3600s" in entry.reason
    assert "2 x spot GPU" not in entry.reason and "1 x spot GPU with minLease 3600s" in entry.reason


def test_jobs_without_a_lease_ignore_forecasts() -> None:
    plain = [lent("a", 2).obj(), lent("b", 2).obj()]
    forecast = [lent("a", 2).forecast([0, 1], p20=60).obj(), lent("b", 2).forecast([0, 1], p20=20 * HOUR).obj()]
    gangs = [spot_gang("x"), spot_gang("y", 2)]
    assert run_cycle(snapshot(plain, gangs), now=NOW).binds == run_cycle(snapshot(forecast, gangs), now=NOW).binds


# --- auto ------------------------------------------------------------------------------------------


def test_auto_takes_unallocated_gpus_before_lent_ones_lowpower_does_not() -> None:
    """A cluster of one strategy (as the simulator's policies set it): lowpower lends first."""
    for strategy, where in ((NodeStrategy.AUTO, "free"), (NodeStrategy.LOWPOWER, "dev")):
        free = MakeNode("free", 2).strategy(strategy).obj()
        dev = lent("dev", 4, strategy=strategy).obj()
        result = run_cycle(snapshot([dev, free], [spot_gang("s")]), now=NOW)
        assert bound(result)["s-0"][0] == where, strategy


def test_auto_lends_when_unallocated_gpus_cannot_serve_the_demand() -> None:
    dev = lent("dev", 4, strategy=NodeStrategy.AUTO).obj()
    free = MakeNode("free", 1).auto().obj()
    result = run_cycle(snapshot([dev, free], [spot_gang("s", 2)]), now=NOW)
    placed = bound(result)
    assert sorted(node for node, _ in placed.values()) == ["dev", "free"]
    alone = run_cycle(snapshot([dev], [spot_gang("s")]), now=NOW)
    assert bound(alone)["s-0"][0] == "dev"


def test_auto_does_not_lend_where_idle_would_for_a_tighter_fit() -> None:
    """Two GPUs on a small node (one unallocated, one lent) pack a 2-GPU pod better than a big
    empty node: idle takes them, lending the owner's GPU while eight sit free; auto does not."""
    for strategy, where in ((NodeStrategy.IDLE, "small"), (NodeStrategy.AUTO, "big")):
        small = MakeNode("small", 2).owner([1], owner(1), active=False).lending().strategy(strategy).obj()
        big = MakeNode("big", 8).strategy(strategy).obj()
        result = run_cycle(snapshot([small, big], [gang("s", 1, spot_gpus=2)]), now=NOW)
        assert bound(result)["s-0"][0] == where, strategy


def test_auto_is_the_default_of_a_node_without_the_annotation() -> None:
    assert Node("n", ()).strategy is NodeStrategy.AUTO


def test_shared_spot_on_auto_nodes_prefers_unallocated_twins() -> None:
    dev = lent("dev", 2, strategy=NodeStrategy.AUTO).obj()
    free = MakeNode("free", 1).auto().obj()
    result = run_cycle(snapshot([dev, free], [gang("sh", 1, milli=500)]), now=NOW)
    assert bound(result)["sh-0"][0] == "free"


# --- properties ------------------------------------------------------------------------------------

gpu_state = st.sampled_from(["free", "free", "idle", "idle", "active"])
forecast = st.none() | st.integers(0, 48 * HOUR)
rarely = st.sampled_from([False] * 7 + [True])
node_draw = st.tuples(
    st.lists(st.tuples(gpu_state, forecast, rarely), min_size=1, max_size=8),  # (state, p20, broken)
    st.booleans(),  # lending
    st.sampled_from(list(NodeStrategy)),
    st.sampled_from([True] * 7 + [False]),  # schedulable
)


def _nodes(drawn: list[tuple[list[tuple[str, int | None, bool]], bool, NodeStrategy, bool]]) -> list[Node]:
    out = []
    for i, (gpus, lending, strategy, schedulable) in enumerate(drawn):
        b = MakeNode(f"n{i}", len(gpus)).lending(lending).strategy(strategy)
        for j, (state, p20, broken) in enumerate(gpus):
            if state != "free":
                b.owner([j], owner(i * 10 + j), active=state == "active")
            if p20 is not None:
                b.forecast([j], p20=p20)
            if broken:
                b.broken(j)
        if not schedulable:
            b.unschedulable()
        out.append(b.obj())
    return out


def _covers(node: Node, device: DeviceID, lease: float) -> bool:
    gpu = next(g for g in node.gpus if g.id == device)
    if gpu.owner is None or not lease:
        return True
    f = node.idle_forecast.get(device)
    return f is not None and f.p20 >= lease


def _free_covering(nodes: Sequence[Node], lease: float) -> list[tuple[str, DeviceID]]:
    """The healthy GPUs a spot pod wanting ``lease`` may take: unallocated, or lent and covering it."""
    return [
        (n.name, g.id)
        for n in nodes
        if n.schedulable
        for g in n.gpus
        if g.health is Health.HEALTHY
        and g.twin is Health.HEALTHY
        and (g.owner is None or n.lending)
        and _covers(n, g.id, lease)
    ]


@settings(max_examples=200)
@given(
    drawn=st.lists(node_draw, min_size=1, max_size=4),
    lease=st.sampled_from([0, 600, HOUR, 5000, 6 * HOUR]),
    checkpoint=st.sampled_from([0, 1800]),
)
@example(  # the class's forecast bucket (3600-7200 s) may cover 5000 s; the exact p20 does not
    drawn=[([("idle", 4000, False)], True, NodeStrategy.LOWPOWER, True)], lease=5000, checkpoint=0
)
def test_a_min_lease_job_lands_on_a_covering_gpu_whenever_one_is_free(
    drawn: list[tuple[list[tuple[str, int | None, bool]], bool, NodeStrategy, bool]], lease: int, checkpoint: int
) -> None:
    nodes = _nodes(drawn)
    snap = snapshot(nodes, [spot_gang("j", min_lease=lease, checkpoint=checkpoint)])
    result = run_cycle(snap, now=NOW)
    check_invariants(snap, result)
    by_name = {n.name: n for n in nodes}
    for bind in result.binds:
        assert all(_covers(by_name[bind.node], d, lease) for d in bind.devices), bind
    free_covering = _free_covering(nodes, lease)
    assert bool(result.binds) == bool(free_covering), (free_covering, result.reasons())


def _non_lent_room(after: Snapshot) -> dict[str, tuple[int, int]]:
    """Per node: (unused lendable non-lent twins, max milli left on a shared non-lent twin)."""
    state = ClusterState.build(after, NOW)
    out = {}
    for ns in state.nodes.values():
        if not ns.node.schedulable:
            continue
        fresh = sum(1 for g in ns.gpus if not g.users and g.lend() in (Lend.NEW_SHADOW, Lend.SHADOW))
        partial = max(
            (
                GPU_MILLI - g.used_milli
                for g in ns.gpus
                if g.users and not g.exclusive and g.lend() in (Lend.NEW_SHADOW, Lend.SHADOW)
            ),
            default=0,
        )
        out[ns.name] = (fresh, partial)
    state.dispose()
    return out


def check_auto_lends_last(
    drawn: list[tuple[list[tuple[str, int | None, bool]], bool, NodeStrategy, bool]],
    demand: list[tuple[int, int, bool]],
) -> None:
    """On ``auto`` nodes, a spot pod that wants no lease and is bound to a lent GPU leaves no
    unallocated room that fits it, whatever the demand (test_sched_auto.py: pods that want one)."""
    auto = [(gpus, True, NodeStrategy.AUTO, sched) for gpus, _, _, sched in drawn]
    nodes = _nodes(auto)
    gangs = []
    for i, (pods, size, shared) in enumerate(demand):
        gangs.append(gang(f"g{i}", pods, milli=250 * size) if shared else gang(f"g{i}", pods, spot_gpus=size))
    snap = snapshot(nodes, gangs)
    result = run_cycle(snap, now=NOW)
    check_invariants(snap, result)
    room = _non_lent_room(apply_result(snap, result, NOW))
    owners = {g.id: g.owner for n in nodes for g in n.gpus}
    sizes = {p.ref: p.request for p in snap.pods}
    for bind in result.binds:
        if all(owners[d] is None for d in bind.devices):  # no ShadowPods before the cycle: None = unallocated
            continue
        request = sizes[bind.pod]
        for name, (fresh, partial) in room.items():
            if request.is_shared:
                assert fresh == 0 and partial < request.milli, (bind, name, fresh, partial)
            else:
                assert fresh < request.gpus, (bind, name, fresh)


demands = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 2), st.booleans()), min_size=1, max_size=4)


_FREE, _IDLE = ("free", None, False), ("idle", None, False)


@settings(max_examples=300)
@given(drawn=st.lists(node_draw, min_size=1, max_size=4), demand=demands)
@example(  # binpack prefers the small node's free+lent pair to the empty big node (idle would lend)
    drawn=[([_FREE, _IDLE], True, NodeStrategy.AUTO, True), ([_FREE] * 8, True, NodeStrategy.AUTO, True)],
    demand=[(1, 2, False)],
)
def test_auto_never_lends_while_an_unallocated_gpu_that_fits_stays_free(
    drawn: list[tuple[list[tuple[str, int | None, bool]], bool, NodeStrategy, bool]],
    demand: list[tuple[int, int, bool]],
) -> None:
    check_auto_lends_last(drawn, demand)


@settings(max_examples=100)
@given(drawn=st.lists(node_draw, min_size=1, max_size=4), lease=st.sampled_from([0, HOUR]))
def test_spot_gangs_never_land_on_unhealthy_twins(
    drawn: list[tuple[list[tuple[str, int | None, bool]], bool, NodeStrategy, bool]], lease: int
) -> None:
    nodes = _nodes(drawn)
    snap = snapshot(nodes, [spot_gang("a", 2, min_lease=lease), gang("b", 1, milli=500), spot_gang("c", gpus=2)])
    result: CycleResult = run_cycle(snap, now=NOW)
    twins = {g.id: (g.twin, g.health) for n in nodes for g in n.gpus}
    for bind in result.binds:
        for d in bind.devices:
            assert twins[d] == (Health.HEALTHY, Health.HEALTHY), (bind, twins[d])
    check_invariants(snap, result)
