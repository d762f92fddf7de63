"""The return path on a busy node (issue 15), on the agent's in-memory fakes: the eviction runs
on the raised-priority executor, the owner's release takes no solver lock, detection waits
while a return is in flight, the spot containers on lent GPUs are handed to the task port for
pinning, and the runtime's bookkeeping comes after the release. Each behaviour is behind an
``agent.eviction`` switch; each switch is tested both ways where it changes what happens."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Sequence
from pathlib import Path

import pytest

from spotgpu.agent.evictor import EvictionExecutor, ReturnsInFlight
from spotgpu.agent.solver import STALE_VIEW
from spotgpu.core.config import AgentConfig, EvictionConfig
from spotgpu.core.configfile import ConfigError, from_mapping
from spotgpu.core.ids import SPOT_GPU_RESOURCE
from spotgpu.core.lending import LendState
from spotgpu.core.refs import PodRef
from spotgpu.ports.kube import ContainerInfo, PodEvent, PodEventType, PodInfo
from spotgpu.ports.node import PinningTaskPort, RuntimeContainer, TaskStopResult
from spotgpu.testing.fakes import FakeTasks
from spotgpu.util.priority import raise_thread, thread_policy

from .helpers import NODE, OWNER, Rig, make_rig

WAIT = 10.0


class PinningTasks(FakeTasks):
    """FakeTasks that can pin (records every call) and can hold a stop until told to go on."""

    def __init__(self) -> None:
        super().__init__()
        self.pins: list[set[str]] = []
        self.events: list[str] = []
        self.stop_threads: list[tuple[str, str]] = []
        self.stopping = threading.Event()
        self.proceed = threading.Event()
        self.proceed.set()

    def pin(self, container_ids: Collection[str]) -> None:
        self.pins.append(set(container_ids))

    def after_release(self) -> None:
        self.events.append("after_release")

    def stop_tasks(self, container_ids: Sequence[str], *, grace: float, timeout: float) -> list[TaskStopResult]:
        thread = threading.current_thread()
        self.stop_threads.append((thread.name, thread_policy(threading.get_native_id())))
        self.stopping.set()
        assert self.proceed.wait(WAIT), "the test never let the stop go on"
        self.events.append("stop")
        return super().stop_tasks(container_ids, grace=grace, timeout=timeout)


def lent_rig(tmp_path: Path, eviction: EvictionConfig | None = None) -> tuple[Rig, PinningTasks]:
    tasks = PinningTasks()
    rig = make_rig(tmp_path, eviction=eviction, tasks=tasks)
    rig.cycle(0)
    rig.cycle(61)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.LENT
    rig.add_spot("job-a", [rig.d[0]], "cid-a")
    rig.add_spot("job-b", [rig.d[1]], "cid-b")
    rig.add_spot("job-c", [rig.d[2]], "cid-c")  # an unallocated GPU: not the owner's, not pinned for it
    rig.cycle(1)
    return rig, tasks


def test_the_switches_are_agent_eviction_keys_and_default_on() -> None:
    config = from_mapping(AgentConfig, {"eviction": {"realtime": False, "pinPidfds": False}})
    assert config.eviction == EvictionConfig(realtime=False, pin_pidfds=False)
    assert AgentConfig().eviction == EvictionConfig(True, True, True, True)
    with pytest.raises(ConfigError):
        from_mapping(AgentConfig, {"eviction": {"realTime": True}})


@pytest.mark.root
@pytest.mark.parametrize(("realtime", "policy"), [(True, "SCHED_RR 10"), (False, "normal")])
def test_the_eviction_runs_on_the_executor_at_the_configured_priority(
    tmp_path: Path, realtime: bool, policy: str
) -> None:
    rig, tasks = lent_rig(tmp_path, EvictionConfig(realtime=realtime))
    rig.guard.owner_back(OWNER)
    [(name, seen)] = tasks.stop_threads
    assert name.startswith(EvictionExecutor.PREFIX) and seen == policy
    assert thread_policy(threading.get_native_id()) == "normal"  # the caller's thread is left alone
    rig.agent.stop()


def test_the_owners_release_waits_on_no_solver_lock(tmp_path: Path) -> None:
    """While the spot tasks stop, another thread takes the solver's lock and keeps it until the
    owner is released: the release (guard disarm) still happens; the owner becomes ``active``
    in the state once the lock is free again."""
    rig, tasks = lent_rig(tmp_path)
    tasks.proceed.clear()
    released = threading.Event()
    real_disarm = rig.guard.disarm
    rig.guard.disarm = lambda o: (real_disarm(o), released.set())[0]  # type: ignore[method-assign]
    returning = threading.Thread(target=rig.guard.owner_back, args=(OWNER,))
    returning.start()
    assert tasks.stopping.wait(WAIT)
    seen_while_locked: list[bool] = []
    locked = threading.Event()

    def hog() -> None:
        with rig.agent.solver.lock:
            locked.set()
            seen_while_locked.append(released.wait(WAIT))

    holder = threading.Thread(target=hog)
    holder.start()
    assert locked.wait(WAIT)
    tasks.proceed.set()
    holder.join(WAIT)
    returning.join(WAIT)
    assert seen_while_locked == [True]
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE
    assert rig.guard.calls.count(("disarm", OWNER)) == 1  # EvictionDone's Disarm is not repeated


@pytest.mark.parametrize("defer", [True, False])
def test_detection_waits_while_a_return_is_in_flight(tmp_path: Path, defer: bool) -> None:
    rig, tasks = lent_rig(tmp_path, EvictionConfig(defer_detection=defer))
    tasks.proceed.clear()
    returning = threading.Thread(target=rig.guard.owner_back, args=(OWNER,))
    returning.start()
    assert tasks.stopping.wait(WAIT)
    reads = rig.podres.calls
    cycle = threading.Thread(target=rig.agent.detect_once)
    cycle.start()
    deadline = time.monotonic() + (0.3 if defer else WAIT)
    while rig.podres.calls == reads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (rig.podres.calls == reads) is defer  # deferred: not even pod-resources was read
    tasks.proceed.set()
    returning.join(WAIT)
    cycle.join(WAIT)
    assert not cycle.is_alive() and rig.podres.calls > reads


def test_refreshes_name_the_lent_owners_spot_containers_and_bookkeeping_follows_the_release(tmp_path: Path) -> None:
    rig, tasks = lent_rig(tmp_path)
    assert isinstance(tasks, PinningTaskPort)
    assert tasks.pins[-1] == {"cid-a", "cid-b"}
    real_disarm = rig.guard.disarm
    rig.guard.disarm = lambda o: (tasks.events.append("disarm"), real_disarm(o))[1]  # type: ignore[method-assign]
    rig.guard.owner_back(OWNER)
    assert tasks.events == ["stop", "disarm", "after_release"]
    rig.cycle(1)
    assert tasks.pins[-1] == set()  # nothing lent any more


def test_returns_in_flight_count_each_ticket_once() -> None:
    returns = ReturnsInFlight()
    first, second = returns.enter(), returns.enter()
    first.leave()
    first.leave()
    assert returns.active and not returns.wait_clear(0.01)
    second.leave()
    assert not returns.active and returns.wait_clear(0.0)


def test_a_view_read_before_the_pods_deletion_does_not_evict_the_dead_again(tmp_path: Path) -> None:
    """pod-resources still lists the evicted pods (the kubelet has not caught up): a refresh
    right after the return sees dead users on Unhealthy twins; they were verified stopped
    moments ago, so nothing is stopped again. A container nobody verified (a restart in the
    same pod, new ID) is a violation at once."""
    rig, tasks = lent_rig(tmp_path)
    rig.guard.owner_back(OWNER)
    stops = len(tasks.stop_calls)
    rig.cycle(1)  # the allocations still list job-a and job-b on the owner's GPUs
    assert len(tasks.stop_calls) == stops
    rig.add_spot("job-a", [rig.d[0]], "cid-a2")  # job-a again, a new container on the owner's GPU
    rig.cycle(1)
    assert "cid-a2" in tasks.stop_calls[-1]
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE


@pytest.mark.root
def test_work_after_the_release_runs_at_normal_priority_on_a_raised_guard_thread(tmp_path: Path) -> None:
    """The guard's handler thread is raised (the real guard's thread is SCHED_RR): up to the
    release it keeps that, but the pod deletions and the bookkeeping after the release run at
    normal priority (they must not delay the released owner's wake-up); then it is raised again."""
    rig, _ = lent_rig(tmp_path)
    seen: dict[str, str] = {}
    real_delete, real_disarm = rig.kube.delete_pod, rig.guard.disarm

    def delete(*args: object, **kwargs: object) -> None:
        seen["delete"] = thread_policy(threading.get_native_id())
        real_delete(*args, **kwargs)  # type: ignore[arg-type]

    def disarm(owner: object) -> None:
        seen.setdefault("disarm", thread_policy(threading.get_native_id()))
        real_disarm(owner)  # type: ignore[arg-type]

    rig.kube.delete_pod = delete  # type: ignore[method-assign,assignment]
    rig.guard.disarm = disarm  # type: ignore[method-assign,assignment]

    def guard_thread() -> None:
        raise_thread()
        rig.guard.owner_back(OWNER)
        seen["after"] = thread_policy(threading.get_native_id())

    thread = threading.Thread(target=guard_thread)
    thread.start()
    thread.join(WAIT)
    assert seen == {"disarm": "SCHED_RR 10", "delete": "normal", "after": "SCHED_RR 10"}


class ListingTasks(PinningTasks):
    def __init__(self) -> None:
        super().__init__()
        self.listings = 0

    def list_containers(self) -> list[RuntimeContainer]:
        self.listings += 1
        return super().list_containers()


def test_a_container_id_the_watch_reported_after_the_last_refresh_needs_no_listing(tmp_path: Path) -> None:
    """The pod watch reports a new spot container's ID; pod-resources has the pod; no refresh
    has run since: the return's plan takes the ID from the watch's view, so no containerd
    listing is made on the owner's path."""
    tasks = ListingTasks()
    rig = make_rig(tmp_path, tasks=tasks)
    rig.cycle(0)
    rig.cycle(61)
    rig.add_spot("late", [rig.d[0]], "cid-late")  # watch event + pod-resources, no cycle
    listings = tasks.listings
    rig.guard.owner_back(OWNER)
    assert tasks.stop_calls[-1] == ("cid-late",)
    assert tasks.listings == listings


@pytest.mark.parametrize("pin", [True, False])
def test_a_spot_container_the_watch_reports_is_pinned_at_once(tmp_path: Path, pin: bool) -> None:
    rig, tasks = lent_rig(tmp_path, EvictionConfig(pin_pidfds=pin))
    before = len(tasks.pins)
    spot = PodInfo(
        PodRef("spot", "new"),
        "uid-new",
        NODE,
        "Running",
        containers=(ContainerInfo("worker", "cid-new", {SPOT_GPU_RESOURCE: 1}), ContainerInfo("side", "cid-side")),
    )
    rig.agent.on_pod_event(PodEvent(PodEventType.MODIFIED, spot))
    deadline = time.monotonic() + (WAIT if pin else 0.2)
    while not any("cid-new" in p for p in tasks.pins[before:]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [p for p in tasks.pins[before:] if "cid-new" in p] == ([{"cid-new"}] if pin else [])


def evicted_rig(tmp_path: Path) -> Rig:
    """Lent with spot pods on both of the owner's GPUs; the owner came back and was evicted, and
    pod-resources still lists the evicted pods (the kubelet removes them after their deletion)."""
    rig = make_rig(tmp_path)
    rig.cycle(0)
    rig.cycle(61)
    rig.add_spot("job-a", [rig.d[0]], "cid-a")
    rig.add_spot("job-b", [rig.d[1]], "cid-b")
    rig.cycle(1)
    outcome = rig.agent.solver.owner_back(OWNER)
    assert outcome is not None and set(outcome.plan.container_ids) == {"cid-a", "cid-b"}
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE
    return rig


def test_a_refresh_that_still_lists_just_evicted_users_evicts_nothing(tmp_path: Path) -> None:
    """Their stops were verified moments ago: a view read before the pods' deletion names dead
    work, not a violation (``STALE_VIEW``); no second eviction, no second stop."""
    rig = evicted_rig(tmp_path)
    stops = len(rig.tasks.stop_calls)
    rig.cycle(1)
    assert len(rig.tasks.stop_calls) == stops
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE


def test_a_new_spot_container_on_the_returned_owners_gpu_is_evicted_at_once(tmp_path: Path) -> None:
    """Fail closed: only containers verified stopped are skipped; one the evictor never stopped
    is a violation like any other, even within ``STALE_VIEW``."""
    rig = evicted_rig(tmp_path)
    rig.add_spot("job-new", [rig.d[0]], "cid-new")
    rig.cycle(1)
    assert "cid-new" in rig.tasks.stop_calls[-1]
    assert "cid-new" not in rig.tasks.running()


def test_the_stale_view_allowance_expires(tmp_path: Path) -> None:
    """After ``STALE_VIEW`` seconds users still listed on the owner's GPUs are evicted (stopped
    again) whatever the evictor remembers."""
    rig = evicted_rig(tmp_path)
    stops = len(rig.tasks.stop_calls)
    rig.cycle(STALE_VIEW + 1)
    assert len(rig.tasks.stop_calls) > stops
    assert set(rig.tasks.stop_calls[-1]) == {"cid-a", "cid-b"}
