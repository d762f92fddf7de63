"""The GPU rules' one home (spotgpu.scheduler.rules): the fast per-node summary equals the
per-GPU rules it inlines, for arbitrary GPU states and for the cycle's own mirrors mid-cycle."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from spotgpu.core.types import GPU_MILLI, NodeStrategy
from spotgpu.scheduler import SchedulerConfig, Snapshot, open_session
from spotgpu.scheduler.framework import Placement
from spotgpu.scheduler.rules import Lend, lend, reference_summary, summarize
from spotgpu.scheduler.statement import Statement

from .helpers import QUEUES
from .test_sched_properties import _cluster, _gang, gang_spec, node_spec


@dataclass
class FakeShadow:
    deleting: bool
    nominated: int
    new: bool
    live: bool

    def live_users(self) -> bool:
        return self.live


@dataclass
class FakeHolder:
    tentative: bool


@dataclass
class FakeUser:
    evicting: bool
    priority: int


@dataclass
class FakeGpu:
    healthy: bool
    twin_ok: bool
    nominee: object | None
    owner: object | None
    shadow: FakeShadow | None
    holder: FakeHolder | None
    users: list[FakeUser] = field(default_factory=list)
    exclusive: int = 0
    used_milli: int = 0
    live: int = 0
    lease: int = -1


shadows = st.builds(FakeShadow, st.booleans(), st.integers(0, 2), st.booleans(), st.booleans())
users = st.lists(st.builds(FakeUser, st.booleans(), st.sampled_from([1000, 2000, 3000])), max_size=3)


@st.composite
def fake_gpus(draw: st.DrawFn) -> FakeGpu:
    kind = draw(st.sampled_from(["free", "shadow", "owner"]))
    us = draw(users)
    shared = draw(st.booleans()) and bool(us)
    return FakeGpu(
        healthy=draw(st.booleans()),
        twin_ok=draw(st.booleans()),
        nominee=draw(st.sampled_from([None, None, "preemptor"])),
        owner=None if kind == "free" else kind,
        shadow=draw(shadows) if kind == "shadow" else None,
        holder=draw(st.builds(FakeHolder, st.booleans()) | st.none()) if kind == "owner" else None,
        users=us,
        exclusive=0 if shared else len(us),
        used_milli=sum(250 for _ in us) if shared else GPU_MILLI * len(us),
        live=sum(1 for u in us if not u.evicting),
        lease=draw(st.integers(-1, 11)),
    )


@settings(max_examples=300)
@given(gpus=st.lists(fake_gpus(), max_size=8), lending=st.booleans(), split=st.booleans())
def test_the_fast_summary_equals_the_per_gpu_rules(gpus: list[FakeGpu], lending: bool, split: bool) -> None:
    assert summarize(gpus, lending, split) == reference_summary(gpus, lending, split)


def test_the_lend_rule_by_case() -> None:
    def gpu(**kw: object) -> FakeGpu:
        base: dict[str, object] = {
            "healthy": True,
            "twin_ok": True,
            "nominee": None,
            "owner": None,
            "shadow": None,
            "holder": None,
        }
        base.update(kw)
        return FakeGpu(**base)  # type: ignore[arg-type]

    shadow = FakeShadow(deleting=False, nominated=0, new=False, live=False)
    cases = [
        (gpu(), True, Lend.NEW_SHADOW),
        (gpu(healthy=False), True, Lend.NO),
        (gpu(twin_ok=False), True, Lend.NO),
        (gpu(nominee="p"), True, Lend.NO),
        (gpu(owner="s", shadow=shadow), False, Lend.SHADOW),
        (gpu(owner="s", shadow=FakeShadow(True, 0, False, False)), True, Lend.NO),  # being deleted
        (gpu(owner="s", shadow=FakeShadow(False, 1, False, False)), True, Lend.NO),  # draining
        (gpu(owner="o"), True, Lend.LENT),
        (gpu(owner="o"), False, Lend.NO),  # the node does not lend allocated GPUs
        (gpu(owner="o", holder=FakeHolder(tentative=True)), True, Lend.NO),  # its owner starts now
    ]
    for g, lending, expected in cases:
        assert lend(g, lending) is expected, g


def test_the_unallocated_room_counts_unused_and_partly_used_unallocated_twins_only() -> None:
    def gpu(owner: object | None = None, milli: int = 0, **kw: object) -> FakeGpu:
        users = [FakeUser(False, 1000)] if milli else []
        base: dict[str, object] = {"healthy": True, "twin_ok": True, "nominee": None, "shadow": None, "holder": None}
        base.update(kw)
        return FakeGpu(owner=owner, users=users, used_milli=milli, live=len(users), **base)  # type: ignore[arg-type]

    shadow = FakeShadow(deleting=False, nominated=0, new=False, live=True)
    gpus = [
        gpu(),  # unused, unallocated: 1000
        gpu(owner="s", shadow=shadow),  # unused, held by a ShadowPod: 1000
        gpu(milli=250),  # shared, unallocated: 750 left
        gpu(owner="o"),  # lent: not unallocated
        gpu(owner="o", milli=500),  # shared on a lent GPU: not counted
        gpu(twin_ok=False),  # its twin is not Healthy
        gpu(nominee="p"),  # nominated for a preemptor
    ]
    for split in (False, True):
        assert summarize(gpus, True, split).unallocated_milli == 2750


@settings(max_examples=60)
@given(
    nodes=st.lists(node_spec, min_size=1, max_size=4),
    gangs=st.lists(gang_spec, max_size=5),
    picks=st.integers(0, 6),
)
def test_the_index_agrees_with_the_rules_mid_cycle(
    nodes: list[tuple[int, str, bool, NodeStrategy, bool]], gangs: list[tuple[str, int, int, int, bool]], picks: int
) -> None:
    """Through the cycle's own mirrors: after tentative placements (new ShadowPods, tentative
    reserved holders) every node's class is the reference summary of its GPUs."""
    groups, pods = [], []
    for j, spec in enumerate(gangs):
        g, members = _gang(spec, f"g{j}", 0.0)
        groups.append(g)
        pods.extend(members)
    snap = Snapshot.of([b.obj() for b in _cluster(nodes)], QUEUES, groups, pods)  # type: ignore[arg-type]
    session = open_session(snap, SchedulerConfig(), 100.0)
    state = session.state
    stmt = Statement(session)
    for task in list(state.tasks.values())[:picks]:
        found = session.find_node(task)
        if isinstance(found, Placement):
            stmt.place(task, found)
    for ns in state.nodes.values():
        ref = reference_summary(ns.gpus, ns.node.lending, ns.node.strategy is NodeStrategy.AUTO)
        assert summarize(ns.gpus, ns.node.lending, ns.node.strategy is NodeStrategy.AUTO) == ref
        if ns.cls is not None:
            assert (ns.cls.free, ns.cls.spot_unallocated, ns.cls.spot_lent, ns.cls.partials) == ref[:4]
            assert ns.room == ref.unallocated_milli  # what the auto strategy's demand rule counts
    stmt.discard()
    state.dispose()
