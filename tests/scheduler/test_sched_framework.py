"""The framework: configuration, registries, custom plugins, statements that undo exactly, failures."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from spotgpu.core.configfile import ConfigError, from_mapping
from spotgpu.core.ids import NodeName
from spotgpu.core.refs import PodRef
from spotgpu.core.registry import RegistryError
from spotgpu.core.types import DurationPolicy, SpotPriority
from spotgpu.scheduler import NodeOrder, PodGroupPhase, SchedulerBug, SchedulerConfig, open_session, run_cycle
from spotgpu.scheduler.framework import PLUGINS, Placement
from spotgpu.scheduler.mirrors import NodeClass, TaskShape
from spotgpu.scheduler.plugins.spot import shadow_name
from spotgpu.scheduler.session import Session
from spotgpu.scheduler.state import ClusterState
from spotgpu.scheduler.statement import Statement
from spotgpu.scheduler.testing import MakeNode, MakePod, MakePodGroup

from .helpers import Cluster, bound, gang, ref, snapshot


def test_config_loads_from_camel_case_yaml_keys() -> None:
    config = from_mapping(
        SchedulerConfig,
        {
            "nodeOrder": "spread",
            "fragmentationWeight": 2,
            "victim": {"priorityClass": 50, "durationPolicy": "longest"},
            "preemptCandidateNodes": 10,
            "shadowGcGrace": "2m",
            "actions": ["enqueue", "allocate"],
        },
        "scheduler",
    )
    assert config.node_order is NodeOrder.SPREAD
    assert config.victim.priority_class == 50 and config.victim.duration_policy is DurationPolicy.LONGEST
    assert config.shadow_gc_grace == 120.0
    assert config.actions == ("enqueue", "allocate")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"nodeOrdr": "spread"}, "scheduler.nodeOrdr: unknown key; did you mean 'nodeOrder'?"),
        ({"nodeOrder": "random"}, "scheduler.nodeOrder: 'random' is not one of 'binpack', 'spread'"),
        ({"preemptCandidateNodes": 0}, "preemptCandidateNodes: must be at least 1, got 0"),
        ({"actions": ["allocate", "allocate"]}, "lists an action twice"),
        ({"shadowContainer": "Main"}, "shadowContainer: 'Main' is not a valid container name"),
        ({"shadowGcGrace": "soon"}, "scheduler.shadowGcGrace: 'soon' is not a duration"),
    ],
)
def test_bad_config_names_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping(SchedulerConfig, data, "scheduler")
    assert message in str(err.value)


def test_unknown_plugin_or_action_is_refused_before_deciding() -> None:
    snap = snapshot([MakeNode("n1", 2).obj()], [gang("g", 1)])
    with pytest.raises(RegistryError, match=r"unknown scheduler plugin 'nope'; known: .*gang.*spot"):
        run_cycle(snap, SchedulerConfig(plugins=("gang", "nope")), now=1.0)
    with pytest.raises(RegistryError, match="unknown scheduler action 'shuffle'"):
        run_cycle(snap, SchedulerConfig(actions=("shuffle",)), now=1.0)


def test_registering_a_plugin_name_twice_is_refused() -> None:
    with pytest.raises(RegistryError, match="scheduler plugin 'gang' is already registered"):
        PLUGINS.register("gang", lambda session: object())


class PreferPoolB:
    """A test plugin: a class score that outweighs binpack for nodes of pool "b"."""

    def __init__(self, session: Session) -> None:
        del session

    def class_score(self, shape: TaskShape, cls: NodeClass) -> float:
        return 1000.0 if cls.pool == "b" else 0.0


PLUGINS.register("test-prefer-pool-b", PreferPoolB)


def test_a_plugin_is_one_registered_class() -> None:
    nodes = [MakeNode("a1", 4).pool("a").owner([0, 1], "dev/x/main").obj(), MakeNode("b1", 4).pool("b").obj()]
    snap = snapshot(nodes, [gang("g", 1, gpus=1)])
    assert bound(run_cycle(snap, now=1.0))["g-0"][0] == "a1"  # binpack: the fuller node
    config = SchedulerConfig(plugins=(*SchedulerConfig().plugins, "test-prefer-pool-b"))
    assert bound(run_cycle(snap, config, now=1.0))["g-0"][0] == "b1"


def test_without_the_spot_plugin_spot_tasks_are_not_placed() -> None:
    snap = snapshot([MakeNode("n1", 2).obj()], [gang("s", 1, spot_gpus=1)])
    result = run_cycle(snap, SchedulerConfig(plugins=("priority", "gang", "queue", "gpufit")), now=1.0)
    assert result.binds == ()
    assert "no enabled plugin places exclusive tasks" in result.reasons()[ref("s")]


def test_without_the_preempt_action_nothing_is_evicted() -> None:
    c = Cluster()
    c.node("n1", 2)
    c.spot_running("lo", [("n1", [0, 1])])
    c.add(gang("res", 1, gpus=2))
    assert run_cycle(c.snapshot(), now=10.0).evictions != ()
    no_preempt = SchedulerConfig(actions=("enqueue", "allocate", "backfill"))
    assert run_cycle(c.snapshot(), no_preempt, now=10.0).evictions == ()


def test_without_the_enqueue_action_pending_gangs_are_placed_directly() -> None:
    group = MakePodGroup("g").phase(PodGroupPhase.PENDING).obj()
    snap = snapshot([MakeNode("n1", 2).obj()], [(group, [MakePod("g-0").group("g").obj()])])
    assert run_cycle(snap, now=1.0).binds != ()  # enqueue admits it, allocate places it
    assert run_cycle(snap, SchedulerConfig(actions=("allocate",)), now=1.0).binds != ()
    only_enqueue = run_cycle(snap, SchedulerConfig(actions=("enqueue",)), now=1.0)
    assert only_enqueue.binds == () and only_enqueue.statuses[0].phase is PodGroupPhase.INQUEUE


def _fingerprint(state: ClusterState) -> object:
    gpus = [
        (
            g.id,
            g.owner,
            g.shadow is not None,
            g.twin_ok,
            tuple(u.ref for u in g.users),
            g.used_milli,
            g.live,
            g.nominee.ref if g.nominee else None,
        )
        for n in state.nodes.values()
        for g in n.gpus
    ]
    classes = sorted((n.name, n.cls, n.pkey) for n in state.nodes.values())
    jobs = sorted((j.ref, j.ready) for j in state.jobs.values())
    tasks = sorted((t.ref, t.node.name if t.node else None, t.evicting) for t in state.tasks.values())
    queues = sorted((q.queue.name, q.allocated_milli) for q in state.queues.values())
    return gpus, classes, jobs, tasks, queues, sorted(map(str, state.shadows))


def test_a_discarded_statement_restores_the_state_exactly() -> None:
    c = Cluster()
    c.node("n1", 4)
    c.node("n2", 4).owner(range(4), "dev/x/main", active=False).lending()
    c.spot_running("lo", [("n1", [0, 1])], priority=SpotPriority.SPOTLOW)
    c.add(gang("res", 1, gpus=2))
    c.add(gang("sp", 2, spot_gpus=1))
    session = open_session(c.snapshot(), now=10.0)
    state = session.state
    before = _fingerprint(state)
    stmt = Statement(session)
    sp = [t for t in state.tasks.values() if t.job.ref == ref("sp")]
    for task in sp:
        found = session.find_node(task)
        assert isinstance(found, Placement)
        stmt.place(task, found)
    res = state.tasks[ref("res-0")]
    stmt.evict_job(state.jobs[ref("lo")], res.job, "test")
    n1 = state.nodes["n1"]
    stmt.nominate(res, n1, n1.gpus[:2])
    assert _fingerprint(state) != before
    stmt.discard()
    assert _fingerprint(state) == before


class Exploding:
    def __init__(self, session: Session) -> None:
        del session

    def job_key(self, job: object) -> tuple[float, ...]:
        raise RuntimeError("boom")


PLUGINS.register("test-exploding", Exploding)


def test_an_internal_failure_returns_no_decisions() -> None:
    snap = snapshot([MakeNode("n1", 2).obj()], [gang("g", 1)])
    with pytest.raises(SchedulerBug, match="scheduling cycle failed, no decisions returned: RuntimeError: boom"):
        run_cycle(snap, SchedulerConfig(plugins=("test-exploding", "gpufit")), now=1.0)


def test_the_garbage_collector_setting_is_restored() -> None:
    import gc

    snap = snapshot([MakeNode("n1", 2).obj()], [gang("g", 1)])
    assert gc.isenabled()
    run_cycle(snap, now=1.0)
    assert gc.isenabled()
    gc.disable()
    try:
        run_cycle(snap, now=1.0)
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(SchedulerBug):
        run_cycle(snap, SchedulerConfig(plugins=("test-exploding",)), now=1.0)
    assert gc.isenabled()


_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)


@given(
    labels=st.lists(_label, min_size=1, max_size=6),
    node=st.text(min_size=1, max_size=40),
    device=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,20}", fullmatch=True),
    now=st.floats(allow_nan=False, allow_infinity=False),
)
def test_shadow_names_are_valid_pod_names(labels: list[str], node: str, device: str, now: float) -> None:
    group = ".".join(labels)[:253].rstrip(".-")
    assume(bool(group) and group[-1].isalnum())
    name = shadow_name(PodRef("team", group), NodeName(node), device, now)
    assert PodRef("team", name).name == name  # validates as a DNS-1123 subdomain
    assert len(name) <= 253
    assert name == shadow_name(PodRef("team", group), NodeName(node), device, now)
