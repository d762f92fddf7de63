"""The demand-aware ``auto`` strategy (``spotgpu.scheduler.demand``): while a cycle's pending
demand fits the unallocated room, spot work takes unallocated GPUs first; when it does not, lent
GPUs whose forecast covers a task's want go first and keep unallocated GPUs whole. Examples, a
partial snapshot's outside figures, then properties over random clusters."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spotgpu.core.types import GPU_MILLI, Health, NodeStrategy, SpotPriority
from spotgpu.scheduler import Node, Pod, PodGroup, Snapshot, SnapshotError, SpotOutside, run_cycle
from spotgpu.scheduler.apply import apply_result
from spotgpu.scheduler.testing import MakeNode, MakePod, MakePodGroup

from .helpers import bound, gang, snapshot
from .test_sched_lease import _covers, _free_covering, _nodes, _non_lent_room, lent, node_draw
from .test_sched_properties import check_invariants

NOW = 50_000.0
HOUR = 3600
CKPT = 1800  # every spot gang below checkpoints every 30 min unless it says otherwise: it wants 1800 s


def auto_lent(name: str, gpus: int, p20: int) -> MakeNode:
    """An ``auto`` node whose GPUs one idle owner holds, forecast to stay idle ``p20`` s."""
    return lent(name, gpus, strategy=NodeStrategy.AUTO).forecast(range(gpus), p20=p20)


def ck(
    name: str,
    pods: int = 1,
    *,
    gpus: int = 1,
    created: float = 0.0,
    checkpoint: float = CKPT,
    min_lease: float = 0.0,
    pool: str | None = None,
    tier: SpotPriority = SpotPriority.SPOTMID,
) -> tuple[PodGroup, list[Pod]]:
    """A pending spot gang that checkpoints every 30 min unless told otherwise (it wants 1800 s)."""
    group = MakePodGroup(name).queue("spot").spot(tier).min_member(pods).created(created).pool(pool)
    group = group.min_lease(min_lease).checkpoint_interval(checkpoint)
    members = [MakePod(f"{name}-{i}").group(name).spot_gpus(gpus).created(float(i)).obj() for i in range(pods)]
    return group.obj(), members


# --- examples --------------------------------------------------------------------------------------


def test_while_the_demand_fits_unallocated_gpus_go_first_even_when_a_lent_gpu_covers() -> None:
    free = MakeNode("free", 2).auto().obj()
    dev = auto_lent("dev", 2, p20=8 * HOUR).obj()
    result = run_cycle(snapshot([dev, free], [ck("a"), ck("b", created=1)]), now=NOW)
    assert {node for node, _ in bound(result).values()} == {"free"}


def test_when_it_does_not_covering_lent_gpus_go_first_and_keep_a_node_whole_for_a_gang() -> None:
    """Demand 1 + 8 GPUs, room 8: the one-GPU job (older, so placed first) takes the covering lent
    GPU instead of breaking the empty node, and the 8-GPU pod gets the whole node."""
    free = MakeNode("free", 8).auto().obj()
    dev = auto_lent("dev", 2, p20=8 * HOUR).obj()
    gangs = [ck("small"), ck("big", gpus=8, created=1)]
    placed = bound(run_cycle(snapshot([dev, free], gangs), now=NOW))
    assert placed["small-0"][0] == "dev" and placed["big-0"][0] == "free"
    idle = [MakeNode("free", 8).strategy(NodeStrategy.IDLE).obj(), lent("dev", 2, strategy=NodeStrategy.IDLE).obj()]
    before = bound(run_cycle(snapshot(idle, gangs), now=NOW))  # as auto did before: the gang waits
    assert before["small-0"][0] == "free" and "big-0" not in before


def test_lent_gpus_whose_forecast_does_not_cover_serve_only_work_that_would_otherwise_wait() -> None:
    free = MakeNode("free", 2).auto().obj()
    flappy = auto_lent("flappy", 1, p20=600).obj()
    result = run_cycle(snapshot([flappy, free], [ck(f"j{i}", created=i) for i in range(3)]), now=NOW)
    placed = bound(result)
    assert placed["j0-0"][0] == placed["j1-0"][0] == "free" and placed["j2-0"][0] == "flappy"


def test_under_pressure_jobs_go_to_the_tightest_covering_forecast() -> None:
    free = MakeNode("free", 1).auto().obj()
    short = auto_lent("short", 1, p20=2400).obj()
    long = auto_lent("long", 1, p20=20 * HOUR).obj()
    gangs = [ck("late", checkpoint=4 * HOUR), ck("soon", created=1), ck("x", created=2)]
    placed = bound(run_cycle(snapshot([long, short, free], gangs), now=NOW))
    assert placed["late-0"][0] == "long" and placed["soon-0"][0] == "short" and placed["x-0"][0] == "free"


def test_a_min_lease_job_no_lent_gpu_covers_goes_to_unallocated_gpus_under_pressure() -> None:
    free = MakeNode("free", 1).auto().obj()
    dev = auto_lent("dev", 1, p20=2400).obj()
    for order in (0, 2):  # whichever is older
        gangs = [ck("lease", min_lease=HOUR, created=1), ck("plain", created=order)]
        placed = bound(run_cycle(snapshot([dev, free], gangs), now=NOW))
        assert placed["lease-0"][0] == "free" and placed["plain-0"][0] == "dev", order


def test_the_demand_is_judged_per_pool() -> None:
    """Pool a: demand 2, room 1 (covering lent first there); pool-less gangs compare the whole
    demand with the whole room (3 <= 5: unallocated first)."""
    nodes = [
        auto_lent("a-dev", 1, p20=8 * HOUR).pool("a").obj(),
        MakeNode("a-free", 1).auto().pool("a").obj(),
        MakeNode("b-free", 4).auto().pool("b").obj(),
    ]
    pooled = [ck("p0", pool="a"), ck("p1", created=1, pool="a")]
    placed = bound(run_cycle(snapshot(nodes, pooled), now=NOW))
    assert placed["p0-0"][0] == "a-dev" and placed["p1-0"][0] == "a-free"
    loose = bound(run_cycle(snapshot(nodes, [ck("q0"), ck("q1", created=1), ck("q2", created=2)]), now=NOW))
    assert "a-dev" not in {node for node, _ in loose.values()}


def test_pending_reserved_pods_count_they_take_unallocated_gpus_first() -> None:
    """Room 8: a reserved 6-GPU pod and three spot jobs (demand 9) do not fit, so the spot jobs
    take the covering lent GPUs first and the last one the unallocated GPUs left."""
    free = MakeNode("free", 8).auto().obj()
    dev = auto_lent("dev", 2, p20=8 * HOUR).obj()
    gangs = [gang("res", 1, gpus=6), *(ck(f"s{i}", created=i) for i in range(3))]
    placed = bound(run_cycle(snapshot([dev, free], gangs), now=NOW))
    assert placed["res-0"][0] == "free"
    assert (placed["s0-0"][0], placed["s1-0"][0], placed["s2-0"][0]) == ("dev", "dev", "free")


def test_jobs_that_want_no_lease_keep_unallocated_gpus_first_under_pressure() -> None:
    free = MakeNode("free", 1).auto().obj()
    dev = auto_lent("dev", 1, p20=8 * HOUR).obj()
    gangs = [ck("a", checkpoint=0), ck("b", checkpoint=0, created=1)]
    placed = bound(run_cycle(snapshot([dev, free], gangs), now=NOW))
    assert placed["a-0"][0] == "free" and placed["b-0"][0] == "dev"


# --- a partial snapshot's outside figures ---------------------------------------------------------


def test_a_partial_snapshot_adds_the_demand_and_room_it_left_out() -> None:
    free = MakeNode("free", 2).auto().obj()
    dev = auto_lent("dev", 2, p20=8 * HOUR).obj()
    full = snapshot([dev, free], [ck("a")])
    assert bound(run_cycle(full, now=NOW))["a-0"][0] == "free"
    crowded = Snapshot.of(full.nodes, full.queues, full.groups, full.pods, spot_outside=SpotOutside({None: 4000}))
    assert bound(run_cycle(crowded, now=NOW))["a-0"][0] == "dev"  # 4 more GPUs wanted elsewhere
    busy = snapshot([dev, free], [ck("a"), ck("b", created=1), ck("c", created=2)])
    assert bound(run_cycle(busy, now=NOW))["a-0"][0] == "dev"
    roomy = Snapshot.of(busy.nodes, busy.queues, busy.groups, busy.pods, spot_outside=SpotOutside(room={"": 8000}))
    assert bound(run_cycle(roomy, now=NOW))["a-0"][0] == "free"  # 8 more unallocated GPUs elsewhere


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pending": {None: -1}}, r"pending\[None\] must be a non-negative integer"),
        ({"pending": {"a": 1.5}}, r"pending\['a'\] must be a non-negative integer"),
        ({"room": {None: 5}}, r"room has a pool key None"),
        ({"room": [("a", 1)]}, r"room must be a mapping"),
        ({"pending": {3: 1}}, r"pending has a pool key 3"),
    ],
)
def test_outside_figures_are_checked(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SnapshotError, match=message):
        SpotOutside(**kwargs)  # type: ignore[arg-type]


def test_a_snapshot_refuses_outside_figures_of_another_type() -> None:
    snap = Snapshot.of([MakeNode("n", 1).obj()], (), spot_outside={"pending": {}})  # type: ignore[arg-type]
    with pytest.raises(SnapshotError, match="spot_outside must be a SpotOutside or None, got dict"):
        run_cycle(snap, now=NOW)


# --- properties ------------------------------------------------------------------------------------

Drawn = list[tuple[list[tuple[str, int | None, bool]], bool, NodeStrategy, bool]]
demands = st.lists(
    st.tuples(st.integers(1, 3), st.integers(1, 2), st.booleans(), st.sampled_from([0, 600, CKPT, 4 * HOUR])),
    min_size=1,
    max_size=5,
)  # (pods, GPUs per pod or quarters of a shared GPU, shared, checkpoint interval)


def _auto(drawn: Drawn) -> list[Node]:
    return _nodes([(gpus, True, NodeStrategy.AUTO, sched) for gpus, _, _, sched in drawn])


def _gangs(demand: list[tuple[int, int, bool, int]]) -> list[tuple[PodGroup, list[Pod]]]:
    out = []
    for i, (pods, size, shared, checkpoint) in enumerate(demand):
        group = MakePodGroup(f"g{i}").queue("spot").spot().min_member(pods).checkpoint_interval(checkpoint)
        group = group.created(float(i))
        members = []
        for j in range(pods):
            pod = MakePod(f"g{i}-{j}").group(f"g{i}").created(float(j))
            members.append((pod.shared(250 * size) if shared else pod.spot_gpus(size)).obj())
        out.append((group.obj(), members))
    return out


def _fits(nodes: list[Node], snap: Snapshot) -> bool:
    """The demand rule, counted from the snapshot's objects (no pods placed, no ShadowPods)."""
    room = GPU_MILLI * sum(
        1
        for n in nodes
        if n.schedulable
        for g in n.gpus
        if g.owner is None and g.health is Health.HEALTHY and g.twin is Health.HEALTHY
    )
    return sum(p.request.gpus * GPU_MILLI + p.request.milli for p in snap.pods) <= room


@settings(max_examples=300)
@given(drawn=st.lists(node_draw, min_size=1, max_size=4), demand=demands)
@example(  # demand 2 fits room 2: the covering lent GPU stays unused
    drawn=[
        ([("idle", 8 * HOUR, False)], True, NodeStrategy.AUTO, True),
        ([("free", None, False)] * 2, True, NodeStrategy.AUTO, True),
    ],
    demand=[(2, 1, False, CKPT)],
)
def test_auto_never_lends_while_the_demand_fits_and_an_unallocated_gpu_that_fits_is_free(
    drawn: Drawn, demand: list[tuple[int, int, bool, int]]
) -> None:
    """While the cycle's pending demand fits the unallocated room, a spot pod bound to a lent GPU
    leaves no unallocated room that fits it; when it does not, one bound to a lent GPU whose
    forecast does not cover its want leaves no such room either."""
    nodes = _auto(drawn)
    snap = snapshot(nodes, _gangs(demand))
    result = run_cycle(snap, now=NOW)
    check_invariants(snap, result)
    fits = _fits(nodes, snap)
    room = _non_lent_room(apply_result(snap, result, NOW))
    by_name = {n.name: n for n in nodes}
    groups = {g.ref: g for g in snap.groups}
    sizes = {p.ref: p.request for p in snap.pods}
    for bind in result.binds:
        node = by_name[bind.node]
        lent_devices = [d for d in bind.devices if next(g for g in node.gpus if g.id == d).owner is not None]
        if not lent_devices:
            continue
        want = groups[bind.group].checkpoint_interval
        if not fits and want and all(_covers(node, d, want) for d in lent_devices):
            continue  # under pressure, covering lent GPUs may go first
        request = sizes[bind.pod]
        for name, (fresh, partial) in room.items():
            if request.is_shared:
                assert fresh == 0 and partial < request.milli, (bind, name, fresh, partial, fits)
            else:
                assert fresh < request.gpus, (bind, name, fresh, fits)


@settings(max_examples=150)
@given(drawn=st.lists(node_draw, min_size=1, max_size=4), demand=demands)
def test_auto_never_binds_on_a_twin_that_is_not_healthy(drawn: Drawn, demand: list[tuple[int, int, bool, int]]) -> None:
    nodes = _auto(drawn)
    snap = snapshot(nodes, _gangs(demand))
    result = run_cycle(snap, now=NOW)
    twins = {g.id: (g.twin, g.health) for n in nodes for g in n.gpus}
    for bind in result.binds:
        assert all(twins[d] == (Health.HEALTHY, Health.HEALTHY) for d in bind.devices), bind
    check_invariants(snap, result)


@settings(max_examples=200)
@given(
    drawn=st.lists(node_draw, min_size=1, max_size=4),
    lease=st.sampled_from([600, HOUR, 5000]),
    crowd=st.integers(0, 12),
)
def test_under_any_demand_a_min_lease_job_lands_on_a_covering_gpu_whenever_one_is_free(
    drawn: Drawn, lease: int, crowd: int
) -> None:
    """The first gang in the order (spothigh) declares a minimum lease; ``crowd`` later one-GPU
    gangs add demand, so the cycle may judge it under pressure."""
    nodes = _nodes(drawn)
    first = ck("j", min_lease=lease, tier=SpotPriority.SPOTHIGH)
    snap = snapshot(nodes, [first, *(ck(f"c{i}", created=i + 1) for i in range(crowd))])
    result = run_cycle(snap, now=NOW)
    check_invariants(snap, result)
    by_name = {n.name: n for n in nodes}
    mine = [b for b in result.binds if b.pod.name == "j-0"]
    for bind in mine:
        assert all(_covers(by_name[bind.node], d, lease) for d in bind.devices), bind
    free_covering = _free_covering(nodes, lease)
    assert bool(mine) == bool(free_covering), (free_covering, result.reasons())
