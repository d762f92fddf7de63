"""The framework's statuses and extension points: codes per cause, how the cycle treats them,
plugins that enrol nowhere, and Reserve/Unreserve."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import pytest

from spotgpu.core.refs import ContainerRef
from spotgpu.core.registry import RegistryError
from spotgpu.core.types import SpotPriority
from spotgpu.scheduler import SchedulerConfig, Snapshot, check_config, open_session, run_cycle
from spotgpu.scheduler.decisions import PodGroupPhase
from spotgpu.scheduler.framework import PLUGINS, Placement
from spotgpu.scheduler.mirrors import NodeClass, TaskShape, TaskState
from spotgpu.scheduler.session import Session
from spotgpu.scheduler.statement import Statement
from spotgpu.scheduler.status import OK, Code, Status, combine
from spotgpu.scheduler.testing import MakeNode, MakePod, MakePodGroup, MakeQueue

from .helpers import QUEUES, Cluster, bound, gang, ref, snapshot

NOW = 10_000.0


# --- Status itself ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: Status(Code.SUCCESS, "but why"), "a Success status has no reason"),
        (lambda: Status(Code.UNSCHEDULABLE), "a Unschedulable status needs a reason"),
        (lambda: Status("Unschedulable", "x"), "must be a Code"),  # type: ignore[arg-type]
    ],
)
def test_a_status_is_consistent(make: Callable[[], Status], error: str) -> None:
    with pytest.raises((ValueError, TypeError), match=error):
        make()


@pytest.mark.parametrize(
    ("codes", "combined"),
    [
        ([], Code.SUCCESS),
        ([Code.UNRESOLVABLE, Code.UNRESOLVABLE], Code.UNRESOLVABLE),
        ([Code.UNRESOLVABLE, Code.UNSCHEDULABLE], Code.UNSCHEDULABLE),  # freeing capacity may still help
        ([Code.WAIT, Code.WAIT], Code.WAIT),
        ([Code.WAIT, Code.UNSCHEDULABLE], Code.UNSCHEDULABLE),
        ([Code.UNSCHEDULABLE, Code.ERROR], Code.ERROR),
    ],
)
def test_combined_codes(codes: list[Code], combined: Code) -> None:
    assert combine(codes) is combined


# --- the cycle's codes, per cause ---------------------------------------------------------------


def _pool_mismatch() -> Snapshot:
    c = Cluster()
    c.node("n1", 4).pool("h100")
    c.spot_running("lo", [("n1", [0, 1, 2, 3])])
    g = MakePodGroup("res").pool("a100").obj()
    c.add((g, [MakePod("res-0").group("res").gpus(2).obj()]))
    return c.snapshot()


def _too_big() -> Snapshot:
    c = Cluster()
    c.node("n1", 4)
    c.spot_running("lo", [("n1", [0, 1, 2, 3])])
    c.add(gang("res", 1, gpus=8))
    return c.snapshot()


def _preemptable() -> Snapshot:
    c = Cluster()
    c.node("n1", 4)
    c.spot_running("lo", [("n1", [0, 1, 2, 3])])
    c.add(gang("res", 1, gpus=2))
    return c.snapshot()


def _owner_busy() -> Snapshot:
    node = MakeNode("n1", 2).owner([0, 1], "dev/a/main", active=True).obj()
    return snapshot([node], [gang("res", 1, gpus=1)])


def _members_missing() -> Snapshot:
    group = MakePodGroup("g").min_member(3).phase(PodGroupPhase.PENDING).obj()
    return snapshot([MakeNode("n1", 4).obj()], [(group, [MakePod("g-0").group("g").obj()])])


def _queue_too_small() -> Snapshot:
    queues = [MakeQueue("default").capacity(1000).obj(), QUEUES[1]]
    group = MakePodGroup("g").phase(PodGroupPhase.PENDING).obj()
    return snapshot([MakeNode("n1", 4).obj()], [(group, [MakePod("g-0").group("g").gpus(2).obj()])], queues=queues)


def _queue_in_use() -> Snapshot:
    """The queue's cap would admit the gang once its running pod is done."""
    queues = [MakeQueue("default").capacity(2000).obj(), QUEUES[1]]
    running = MakePodGroup("run").phase(PodGroupPhase.RUNNING).obj()
    node = MakeNode("n1", 4).owner([0], "default/run-0/main").obj()
    group = MakePodGroup("g").phase(PodGroupPhase.PENDING).obj()
    gangs = [(running, [MakePod("run-0").group("run").node("n1", [0]).obj()])]
    gangs.append((group, [MakePod("g-0").group("g").gpus(2).obj()]))
    return snapshot([node], gangs, queues=queues)


def _spot_without_plugin() -> Snapshot:
    return snapshot([MakeNode("n1", 2).obj()], [gang("s", 1, spot_gpus=1)])


CASES = [
    # (snapshot, config plugins or None, expected code, reason text, evictions expected)
    pytest.param(_pool_mismatch, None, Code.UNRESOLVABLE, "1 not in pool 'a100'", False, id="other-pool"),
    pytest.param(_too_big, None, Code.UNRESOLVABLE, "have fewer than 8 free", False, id="larger-than-any-node"),
    pytest.param(_preemptable, None, Code.WAIT, "preempting: evicting 1 spot gangs", True, id="preempting"),
    pytest.param(_owner_busy, None, Code.UNSCHEDULABLE, "preemption: no node has", False, id="owner-busy"),
    pytest.param(_members_missing, None, Code.WAIT, "waiting for the rest to be created", False, id="members"),
    pytest.param(_queue_too_small, None, Code.UNRESOLVABLE, "is over capacity", False, id="queue-cap-too-small"),
    pytest.param(_queue_in_use, None, Code.UNSCHEDULABLE, "is over capacity", False, id="queue-in-use"),
    pytest.param(
        _spot_without_plugin,
        ("priority", "gang", "queue", "gpufit"),
        Code.UNRESOLVABLE,
        "no enabled plugin places exclusive tasks",
        False,
        id="no-picker",
    ),
]


@pytest.mark.parametrize(("build", "plugins", "code", "text", "evicts"), CASES)
def test_each_cause_has_its_code(
    build: Callable[[], Snapshot], plugins: tuple[str, ...] | None, code: Code, text: str, evicts: bool
) -> None:
    config = SchedulerConfig(plugins=plugins) if plugins else SchedulerConfig()
    result = run_cycle(build(), config, now=NOW)
    (entry,) = result.unschedulable
    assert entry.code is code, entry
    assert text in entry.reason
    assert bool(result.evictions) is evicts


def test_an_unresolvable_gang_is_not_preempted_for() -> None:
    """The pool mismatch: without the code, victim search would run (and find nothing either)."""
    result = run_cycle(_pool_mismatch(), now=NOW)
    assert "preemption:" not in result.reasons()[ref("res")]
    assert result.evictions == () and result.nominations == ()


class RefusesEverything:
    """A filter answering Error: the gang is neither placed nor preempted for."""

    def __init__(self, session: Session) -> None:
        del session

    def class_status(self, shape: TaskShape, cls: NodeClass) -> Status:
        return Status.error("the test filter failed")


PLUGINS.register("test-refuses-everything", RefusesEverything)


def test_an_error_status_skips_the_gang() -> None:
    config = SchedulerConfig(plugins=("test-refuses-everything", *SchedulerConfig().plugins))
    result = run_cycle(_preemptable(), config, now=NOW)
    (entry,) = result.unschedulable
    assert entry.code is Code.ERROR and "the test filter failed" in entry.reason
    assert result.evictions == ()


# --- extension points ---------------------------------------------------------------------------


class Misspelt:
    def __init__(self, session: Session) -> None:
        del session

    def class_scroe(self, shape: TaskShape, cls: NodeClass) -> float:
        return 1.0


class Nothing:
    def __init__(self, session: Session) -> None:
        del session

    def helper(self) -> None: ...


class HalfAPicker:
    def __init__(self, session: Session) -> None:
        del session

    def pick_devices(self, shape: TaskShape, task: TaskState, node: object) -> None:
        return None


PLUGINS.register("test-misspelt", Misspelt)
PLUGINS.register("test-nothing", Nothing)
PLUGINS.register("test-half-a-picker", HalfAPicker)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("test-misspelt", "has a method 'class_scroe', which is no extension point; did you mean 'class_score'?"),
        ("test-nothing", "implements no extension point (public methods: helper)"),
        ("test-half-a-picker", "implements pick_devices of extension point DevicePick but not handles"),
    ],
)
def test_a_plugin_that_enrols_nowhere_is_refused_at_start(name: str, message: str) -> None:
    config = SchedulerConfig(plugins=(*SchedulerConfig().plugins, name))
    with pytest.raises(RegistryError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        check_config(config)
    with pytest.raises(RegistryError):
        run_cycle(_preemptable(), config, now=NOW)


def test_the_built_in_plugins_enrol_where_documented() -> None:
    session = open_session(Snapshot.of((), ()), SchedulerConfig())
    names = {
        "queue_orders": {"QueuePlugin"},
        "job_orders": {"PriorityPlugin", "GangPlugin"},
        "enqueue_checks": {"GangPlugin", "QueuePlugin"},
        "task_admits": {"QueuePlugin"},
        "job_readies": {"GangPlugin"},
        "class_filters": {"GPUFitPlugin", "SpotPlugin"},
        "class_scores": {"GPUFitPlugin", "SpotPlugin"},
        "device_pickers": {"GPUFitPlugin", "SpotPlugin"},
        "reserves": {"SpotPlugin"},
        "victim_scores": {"SpotPlugin"},
        "eviction_gates": {"SpotPlugin"},
    }
    for attr, expected in names.items():
        assert {type(p).__name__ for p in getattr(session, attr)} == expected, attr


# --- Reserve / Unreserve ------------------------------------------------------------------------


class Journal:
    """Reserves for every task and refuses pod ``sp-1``; records what it is asked, in order."""

    calls: ClassVar[list[str]] = []

    def __init__(self, session: Session) -> None:
        del session

    def reserve(self, stmt: Statement, task: TaskState, placement: Placement) -> Status:
        Journal.calls.append(f"reserve {task.ref.name}")
        if task.ref.name == "sp-1":
            return Status.unschedulable("the journal refuses sp-1")
        return OK

    def unreserve(self, stmt: Statement, task: TaskState, placement: Placement) -> None:
        Journal.calls.append(f"unreserve {task.ref.name}")


PLUGINS.register("test-journal", Journal)


def test_a_refused_reservation_undoes_the_gang_and_says_why() -> None:
    Journal.calls = []
    snap = snapshot([MakeNode("n1", 4).obj()], [gang("sp", 2, spot_gpus=1)])
    config = SchedulerConfig(plugins=(*SchedulerConfig().plugins, "test-journal"))
    result = run_cycle(snap, config, now=NOW)
    assert result.binds == () and result.shadow_creations == ()
    assert "the journal refuses sp-1" in result.reasons()[ref("sp")]
    # sp-0 reserved (after the spot plugin's ShadowPod), sp-1 refused; then sp-0 undone
    assert Journal.calls == ["reserve sp-0", "reserve sp-1", "unreserve sp-0"]


def test_the_spot_plugin_reserves_one_shadow_pod_per_gang_and_node() -> None:
    snap = snapshot([MakeNode("n1", 4).obj(), MakeNode("n2", 1).obj()], [gang("sp", 3, spot_gpus=1)])
    result = run_cycle(snap, now=NOW)
    assert len(result.binds) == 3
    by_node = {c.node: c for c in result.shadow_creations}
    assert sorted(by_node) == sorted({b.node for b in result.binds})
    for bind in result.binds:
        (owner,) = bind.owners
        assert owner.owner == by_node[bind.node].container_ref
        assert owner.device in by_node[bind.node].devices


def test_lent_gpus_need_no_shadow_pod() -> None:
    node = MakeNode("n1", 2).owner([0, 1], ContainerRef("dev", "a", "main"), active=False).lending().lowpower()
    result = run_cycle(snapshot([node.obj()], [gang("sp", 1, spot_gpus=1, spot=SpotPriority.SPOTMID)]), now=NOW)
    assert result.shadow_creations == () and bound(result)["sp-0"][0] == "n1"
    assert result.binds[0].owners[0].owner == ContainerRef("dev", "a", "main")


def test_the_scheduler_process_refuses_a_plugin_that_enrols_nowhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spotgpu.cli import main

    good = tmp_path / "good.yaml"
    good.write_text("scheduler:\n  plugins: [priority, gang, queue, gpufit, spot]\n")
    assert main(["scheduler", "--config", str(good), "--check"]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("scheduler:\n  plugins: [priority, gang, queue, gpufit, spot, test-misspelt]\n")
    assert main(["scheduler", "--config", str(bad), "--check"]) == 2
    assert "did you mean 'class_score'?" in capsys.readouterr().err
