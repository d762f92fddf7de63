"""Property tests: the scheduler's invariants over random clusters and random multi-cycle histories.

Each example builds a random cluster (reserved owners active or idle, lending on or off, broken
GPUs), then runs several cycles; between cycles the decisions are applied (victims gone or still
terminating), owners come and go (an owner coming back removes the spot pods on its GPUs, as
the agent would), pods finish and new gangs arrive. Every cycle's decisions are checked against
the snapshot they were made from:

* no real GPU is allocated twice (reserved binds and new ShadowPods only take unallocated GPUs,
  each at most once; exclusive spot never shares a twin; shared spot stays within one GPU);
* no spot pod is placed on an Unhealthy twin or a broken GPU, or on an idle owner's GPU where the
  node does not allow lending;
* a gang is placed fully (to min_member) or not at all;
* reserved work is never evicted, and only reserved gangs evict;
* every nomination standing after the cycle can be honoured: the GPU's spot users, and for a
  GPU held by a ShadowPod the users of every GPU of that ShadowPod (it is released whole), are
  being evicted or gone; no spot pod is bound onto a ShadowPod with a nominated GPU;
* victims follow the weights (separate test: on one node, the evicted gangs are those with the
  lowest policy scores, computed here independently).
"""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from spotgpu.core.ids import DeviceID
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import GPU_MILLI, Health, NodeStrategy, QueueType, SpotPriority
from spotgpu.scheduler import (
    CycleResult,
    Nomination,
    PodGroupPhase,
    SchedulerConfig,
    Snapshot,
    open_session,
    run_cycle,
)
from spotgpu.scheduler.apply import apply_result
from spotgpu.scheduler.rules import Lend
from spotgpu.scheduler.testing import MakeNode

from .helpers import QUEUES, Cluster, evicted_groups, gang


def check_invariants(snap: Snapshot, result: CycleResult) -> None:
    gpus = {g.id: (n, g) for n in snap.nodes for g in n.gpus}
    users: dict[DeviceID, list[tuple[int, bool]]] = {}
    for p in snap.pods:
        if p.node is not None and p.request.is_spot:
            for d in p.devices:
                users.setdefault(d, []).append((p.request.milli or GPU_MILLI, not p.request.is_shared))
    queue_type = {q.name: q.type for q in snap.queues}
    group_queue = {g.ref: queue_type[g.queue] for g in snap.groups}
    shadow_owned = {d for s in snap.shadows for d in s.devices}
    taken: set[DeviceID] = set()
    new_shadow_devices: set[DeviceID] = set()
    for create in result.shadow_creations:
        for d in create.devices:
            node, gpu = gpus[d]
            assert node.name == create.node
            assert gpu.owner is None, f"ShadowPod {create.pod} takes allocated {d}"
            assert d not in taken, f"{d} allocated twice in one cycle"
            taken.add(d)
            new_shadow_devices.add(d)
    milli: dict[DeviceID, int] = {}
    exclusive: set[DeviceID] = set()
    for bind in result.binds:
        assert group_queue[bind.group] is (QueueType.SPOT if bind.spot else QueueType.RESERVED)
        for d in bind.devices:
            node, gpu = gpus[d]
            assert node.name == bind.node and node.schedulable
            assert gpu.health is Health.HEALTHY, f"{bind.pod} on broken {d}"
            if not bind.spot:
                assert gpu.owner is None and not users.get(d), f"reserved {bind.pod} on used {d}"
                assert d not in taken, f"{d} allocated twice in one cycle"
                taken.add(d)
                continue
            assert gpu.twin is Health.HEALTHY, f"spot {bind.pod} on Unhealthy twin {d}"
            if gpu.owner is None:
                assert d in new_shadow_devices, f"spot {bind.pod} on unallocated {d} without a ShadowPod"
            elif d not in shadow_owned:
                assert node.lending, f"spot {bind.pod} on lent {d} of non-lending node {node.name}"
            assert dict(bind.owner_map())[d] is not None
            existing = users.get(d, [])
            if bind.milli:
                assert not any(ex for _, ex in existing) and d not in exclusive
                milli[d] = milli.get(d, sum(m for m, _ in existing)) + bind.milli
                assert milli[d] <= GPU_MILLI, f"{d} shared beyond one GPU"
            else:
                assert not existing and d not in exclusive and d not in milli, f"exclusive {bind.pod} on used {d}"
                exclusive.add(d)
    placed = {g.ref: 0 for g in snap.groups}
    for p in snap.pods:
        if p.node is not None and not p.evicting:
            placed[p.group_ref] += 1
    for bind in result.binds:
        placed[bind.group] += 1
    min_member = {g.ref: g.min_member for g in snap.groups}
    for ref in {b.group for b in result.binds}:
        assert placed[ref] >= min_member[ref], f"gang {ref} placed partially"
    for ev in result.evictions:
        assert group_queue[ev.group] is QueueType.SPOT, f"reserved {ev.pod} evicted"
        assert ev.preemptor is not None and group_queue[ev.preemptor] is QueueType.RESERVED
    evicted_gangs = {ev.group for ev in result.evictions}
    for ref in evicted_gangs:  # whole gangs
        live = {p.ref for p in snap.pods if p.group_ref == ref and p.node is not None and not p.evicting}
        assert live == {ev.pod for ev in result.evictions if ev.group == ref}
    check_nominations(snap, result)


def check_nominations(snap: Snapshot, result: CycleResult) -> None:
    """Standing nominations only on GPUs that will be released; nothing new on a draining ShadowPod."""
    evicted = {ev.pod for ev in result.evictions}
    dropped = {c.pod for c in result.cleared_nominations} | {b.pod for b in result.binds}
    standing = {p.ref: p.nominated for p in snap.pods if p.nominated is not None and p.ref not in dropped}
    standing.update({n.pod: Nomination(n.node, n.devices) for n in result.nominations})
    live: dict[DeviceID, list[PodRef]] = {}
    for p in snap.pods:
        if p.node is not None and p.request.is_spot and not p.evicting and p.ref not in evicted:
            for d in p.devices:
                live.setdefault(d, []).append(p.ref)
    shadow_of = {d: s for s in snap.shadows for d in s.devices}
    nominated = {d for nom in standing.values() if nom is not None for d in nom.devices}
    for bind in result.binds:
        if bind.spot:
            for d in bind.devices:
                live.setdefault(d, []).append(bind.pod)
                sh = shadow_of.get(d)
                if sh is not None:
                    assert not nominated.intersection(sh.devices), f"spot {bind.pod} on draining {sh.ref}"
    for pod, nom in standing.items():
        assert nom is not None
        for d in nom.devices:
            sh = shadow_of.get(d)
            unit = sh.devices if sh is not None and not sh.deleting else (d,)
            blockers = [u for x in unit for u in live.get(x, ())]
            assert not blockers, f"{pod} nominated to {d}, which {blockers} keep"


def check_index(snap: Snapshot, config: SchedulerConfig, now: float) -> None:
    """The node-class index agrees with the per-GPU rules it inlines."""
    state = open_session(snap, config, now).state
    for ns in state.nodes.values():
        if not ns.node.schedulable:
            assert ns.cls is None and ns.pkey is None
            continue
        assert ns.cls is not None and ns in state.classes[ns.cls]
        assert ns.cls.free == sum(g.bindable() for g in ns.gpus)
        lendable = [g for g in ns.gpus if g.lend() and not g.users]
        assert ns.cls.spot_lent == sum(g.lend() is Lend.LENT for g in lendable)
        assert ns.cls.spot_unallocated == len(lendable) - ns.cls.spot_lent
        reclaim = [g for g in ns.gpus if g.nominee is None and g.reclaimable()]
        assert (ns.pkey is None) == (not reclaim)
        if ns.pkey is not None:
            assert -ns.pkey.neg_available == len(reclaim)
            zero = [
                g
                for g in reclaim
                if g.live == 0 and (g.shadow is None or g.shadow.deleting or not any(d.live for d in g.shadow.devices))
            ]
            assert -ns.pkey.neg_zero_cost == len(zero)


node_spec = st.tuples(
    st.integers(1, 4),  # GPUs
    st.sampled_from(["free", "idle", "active", "half"]),
    st.booleans(),  # lending
    st.sampled_from(list(NodeStrategy)),
    st.booleans(),  # one broken GPU
)
gang_spec = st.tuples(
    st.sampled_from(["reserved", "reserved", "exclusive", "shared"]),
    st.integers(1, 3),  # pods
    st.integers(1, 3),  # GPUs per pod (or quarter-GPUs for shared)
    st.integers(0, 2),  # priority / tier index
    st.booleans(),  # min_member = pods (else 1)
)


def _cluster(nodes: list[tuple[int, str, bool, NodeStrategy, bool]]) -> list[MakeNode]:
    out = []
    for i, (n, owners, lending, strategy, broken) in enumerate(nodes):
        b = MakeNode(f"n{i}", n).lending(lending).strategy(strategy)
        owner = ContainerRef("dev", f"dev-{i}", "main")
        if owners == "idle":
            b.owner(range(n), owner, active=False)
        elif owners == "active":
            b.owner(range(n), owner, active=True)
        elif owners == "half":
            b.owner(range(n // 2), owner, active=False)
        if broken:
            b.broken(n - 1)
        out.append(b)
    return out


def _gang(spec: tuple[str, int, int, int, bool], name: str, created: float) -> tuple[object, list[object]]:
    kind, pods, size, prio, full = spec
    tiers = list(SpotPriority)
    mm = pods if full else 1
    if kind == "reserved":
        return gang(name, pods, gpus=size, priority=prio * 100, min_member=mm, created=created)
    if kind == "exclusive":
        return gang(name, pods, spot_gpus=size, spot=tiers[prio], min_member=mm, created=created)
    return gang(name, pods, milli=250 * size, spot=tiers[prio], min_member=mm, created=created)


def _next_snapshot(snap: Snapshot, result: CycleResult, now: float, rng: random.Random) -> Snapshot:
    after = apply_result(snap, result, now, evicted=rng.choice(["gone", "evicting"]))
    # terminating pods and shadows from the previous step are gone now; some running pods finish
    pods = [p for p in after.pods if not (p.evicting and p.ref not in {e.pod for e in result.evictions})]
    pods = [p for p in pods if p.node is None or rng.random() > 0.15]
    shadows = [s for s in after.shadows if not (s.deleting and s.ref not in {d.pod for d in result.shadow_deletions})]
    # owners come and go; a returning owner's spot users are evicted by the agent (removed here)
    nodes = []
    back: set[DeviceID] = set()
    for node in after.nodes:
        gpus = []
        for g in node.gpus:
            if g.owner is not None and g.owner.namespace == "dev" and rng.random() < 0.3:
                twin = Health.HEALTHY if g.twin is Health.UNHEALTHY else Health.UNHEALTHY
                if twin is Health.UNHEALTHY:
                    back.add(g.id)
                gpus.append(dataclasses.replace(g, twin=twin))
            else:
                gpus.append(g)
        nodes.append(dataclasses.replace(node, gpus=tuple(gpus)))
    pods = [p for p in pods if not (p.request.is_spot and back.intersection(p.devices))]
    # a reserved pod that finished gives its GPUs back (twins follow)
    held = {d: p.container_ref for p in pods if p.node is not None and not p.request.is_spot for d in p.devices}
    shadow_held = {d: s.container_ref for s in shadows for d in s.devices}
    fixed = []
    for node in nodes:
        gpus = []
        for g in node.gpus:
            if g.owner is not None and g.owner.namespace != "dev" and g.id not in held and g.id not in shadow_held:
                gpus.append(dataclasses.replace(g, owner=None, twin=Health.HEALTHY))
            else:
                gpus.append(g)
        fixed.append(dataclasses.replace(node, gpus=tuple(gpus)))
    live_groups = {p.group_ref for p in pods}
    groups = [g for g in after.groups if g.ref in live_groups]
    return Snapshot(tuple(fixed), after.queues, tuple(groups), tuple(pods), tuple(shadows))


@settings(max_examples=150)
@given(
    nodes=st.lists(node_spec, min_size=1, max_size=5),
    arrivals=st.lists(st.lists(gang_spec, max_size=4), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_invariants_hold_over_random_histories(
    nodes: list[tuple[int, str, bool, NodeStrategy, bool]],
    arrivals: list[list[tuple[str, int, int, int, bool]]],
    seed: int,
) -> None:
    rng = random.Random(seed)
    snap = Snapshot.of([b.obj() for b in _cluster(nodes)], QUEUES)
    now = 1_000.0
    config = SchedulerConfig(shadow_gc_grace=30.0)  # type: ignore[arg-type]
    for step, batch in enumerate(arrivals):
        groups, pods = list(snap.groups), list(snap.pods)
        for j, spec in enumerate(batch):
            g, members = _gang(spec, f"g{step}-{j}", now)
            groups.append(g)  # type: ignore[arg-type]
            pods.extend(members)  # type: ignore[arg-type]
        snap = Snapshot(snap.nodes, snap.queues, tuple(groups), tuple(pods), snap.shadows)
        check_index(snap, config, now)
        result = run_cycle(snap, config, now)
        check_invariants(snap, result)
        assert run_cycle(snap, config, now) == result  # deterministic
        now += 20.0
        snap = _next_snapshot(snap, result, now, rng)


def _score(tier: SpotPriority, duration: float, max_duration: float) -> float:
    """The policy with default weights for one-pod one-GPU gangs (tasks and resources all equal)."""
    return 100 * tier.value_int / 3000 + 10 + 10 + 10 * (duration / max_duration if max_duration else 0.0)


@settings(max_examples=80)
@given(
    gangs=st.lists(st.tuples(st.sampled_from(list(SpotPriority)), st.integers(0, 100_000)), min_size=1, max_size=8),
    data=st.data(),
)
def test_victims_are_the_lowest_scoring_gangs(gangs: list[tuple[SpotPriority, int]], data: st.DataObject) -> None:
    now = 200_000.0
    need = data.draw(st.integers(1, len(gangs)))
    c = Cluster()
    c.node("n1", len(gangs))
    for i, (tier, age) in enumerate(gangs):
        c.spot_running(f"s{i}", [("n1", [i])], priority=tier, started=now - age)
    c.add(gang("res", 1, gpus=need, priority=1))
    result = run_cycle(c.snapshot(), now=now)
    victims = evicted_groups(result)
    assert len(victims) == need
    max_age = max(age for _, age in gangs)
    scores = {f"s{i}": _score(t, age, max_age) for i, (t, age) in enumerate(gangs)}
    worst_victim = max(scores[v] for v in victims)
    spared = [scores[s] for s in scores if s not in victims]
    assert all(worst_victim <= s + 1e-9 for s in spared)
    tiers = {f"s{i}": t.value_int for i, (t, _) in enumerate(gangs)}
    if len({age for _, age in gangs}) == 1:  # all else equal: strictly by tier
        assert max(tiers[v] for v in victims) <= min((tiers[s] for s in tiers if s not in victims), default=10**9)


def test_running_gang_phase_is_kept() -> None:
    """A sanity anchor for the history test: a placed reserved gang stays put across cycles."""
    g, members = gang("r", 1, gpus=1)
    snap = Snapshot.of([MakeNode("n1", 2).obj()], QUEUES, [g], members)
    first = run_cycle(snap, now=1.0)
    after = apply_result(snap, first, 1.0)
    second = run_cycle(after, now=2.0)
    assert second.binds == () and second.evictions == ()
    assert next(x for x in after.groups if x.ref == PodRef("default", "r")).phase is PodGroupPhase.RUNNING
