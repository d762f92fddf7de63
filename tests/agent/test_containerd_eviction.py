"""Eviction through a REAL containerd (private root, state and socket under tmp_path) running
busybox tasks, with stand-in GPUs (character devices with /dev/null's numbers) that the
containers hold open, found by the device-node backend through /proc/*/fd and attributed to
containers through real /proc/<pid>/cgroup and /proc/<pid>/ns/pid. The Kubernetes API, the
kubelet's pod-resources and the guard are in-memory fakes here (other modules cover them)."""

from __future__ import annotations

import hashlib
import os
import select
import stat
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.adapters.containerd import ContainerdTasks
from spotgpu.adapters.devnode_gpu import DeviceNode, DeviceNodeBackend
from spotgpu.agent.service import Agent
from spotgpu.core.clock import ManualClock
from spotgpu.core.config import AgentConfig
from spotgpu.core.configfile import Seconds
from spotgpu.core.ids import DeviceID
from spotgpu.core.lending import LendState
from spotgpu.core.refs import PodRef
from spotgpu.e2e.node import remove_cgroup_tree
from spotgpu.ports.kube import PodInfo
from spotgpu.ports.node import TaskState, TaskStopResult
from spotgpu.testing.containerd import Containerd, make_rootfs
from spotgpu.testing.fakes import FakeGuard, FakeKube, FakePodResources
from spotgpu.util.cpuboost import Knob, Raised

from .helpers import NODE, OWNER, cri_labels, gpu_alloc, mount_namespace_fds, pod, spot_alloc

pytestmark = pytest.mark.root
NS = "spotgpu-agent-test"


@dataclass
class Node:
    containerd: Containerd
    rootfs: Path
    gpus: list[Path]
    tasks: ContainerdTasks

    def run(self, cid: str, script: str, pod_ref: PodRef, container: str = "worker", extra: Sequence[str] = ()) -> None:
        self.containerd.run_detached(
            cid,
            self.rootfs,
            ["sh", "-c", script],
            namespace=NS,
            labels=cri_labels(pod_ref, container),
            devices=[str(g) for g in self.gpus],
            extra=extra,
        )

    def status(self, cid: str) -> str | None:
        return self.tasks.task_status(cid)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    gpus = []
    (tmp_path / "dev").mkdir()
    for i in range(2):
        path = tmp_path / "dev" / f"nvidia{i}"
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        gpus.append(path)
    rootfs = make_rootfs(tmp_path / "rootfs")
    with Containerd(tmp_path / "ctrd") as containerd:
        tasks = ContainerdTasks(containerd.address, NS)
        try:
            yield Node(containerd, rootfs, gpus, tasks)
        finally:
            tasks.close()
            containerd.remove_all(NS)


def hold(gpu: Path, then: str = "exec sleep 1000") -> str:
    """A shell script that opens the stand-in GPU as fd 3 (inherited by what it execs)."""
    return f"exec 3<>{gpu}; {then}"


def wait_for_process(cmdline: str) -> int:
    """The host PID of the one process whose command line is ``cmdline``."""
    wanted = cmdline.replace(" ", "\0").encode() + b"\0"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if (entry / "cmdline").read_bytes() == wanted:
                        return int(entry.name)
                except OSError:
                    continue
        time.sleep(0.02)
    raise AssertionError(f"no process {cmdline!r}")


def wait_holders(backend: DeviceNodeBackend, device: str, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(backend.processes()[DeviceID(device)]) < count:
        assert time.monotonic() < deadline, f"{count} processes never held {device}"
        time.sleep(0.02)


def eventually_stopped(node: Node, cid: str, timeout: float = 10.0) -> None:
    """containerd learns of an exit from the shim a moment after the kernel saw it."""
    deadline = time.monotonic() + timeout
    while node.status(cid) != "STOPPED":
        assert time.monotonic() < deadline, f"containerd never reported {cid} stopped"
        time.sleep(0.02)


@pytest.fixture
def wait_tasks(node: Node) -> Iterator[ContainerdTasks]:
    """The return path before issue 15: stops verified by containerd's Wait, nothing pinned."""
    tasks = ContainerdTasks(node.containerd.address, NS, verify_by_pidfd=False, pin_pidfds=False)
    try:
        yield tasks
    finally:
        tasks.close()


def test_stop_tasks_sigkill_and_wait(node: Node, wait_tasks: ContainerdTasks) -> None:
    for i in range(3):
        node.run(f"victim-{i}", "exec sleep 1000", PodRef("spot", f"v{i}"))
    results = wait_tasks.stop_tasks(["victim-0", "victim-1", "victim-2", "no-such"], grace=0, timeout=10)
    by_id = {r.container_id: r for r in results}
    for i in range(3):
        assert by_id[f"victim-{i}"].state is TaskState.STOPPED
        assert by_id[f"victim-{i}"].exit_status == 137  # 128 + SIGKILL
        assert node.status(f"victim-{i}") == "STOPPED"
    assert by_id["no-such"].state is TaskState.GONE
    again = wait_tasks.stop_tasks(["victim-0"], grace=0, timeout=5)  # idempotent
    assert again[0].state is TaskState.STOPPED


def test_stop_tasks_verified_by_the_inits_pidfd(node: Node) -> None:
    """The default (``verify_by_pidfd``): each init is PID 1 of its namespace, so its pidfd
    turning readable proves the container gone (its GPU closed) before containerd has heard of
    it; containerd's bookkeeping follows after_release()."""
    for i in range(3):
        node.run(f"victim-{i}", hold(node.gpus[0]), PodRef("spot", f"v{i}"))
    results = node.tasks.stop_tasks(["victim-0", "victim-1", "victim-2", "no-such"], grace=0, timeout=10)
    by_id = {r.container_id: r for r in results}
    assert not DeviceNodeBackend([DeviceNode(DeviceID("GPU-0"), str(node.gpus[0]), 0, 0)]).processes()["GPU-0"]
    node.tasks.after_release()
    for i in range(3):
        expected = TaskStopResult(f"victim-{i}", TaskState.STOPPED, None, "init exited (pid from containerd)", 9)
        assert by_id[f"victim-{i}"] == expected
        eventually_stopped(node, f"victim-{i}")
    assert by_id["no-such"].state is TaskState.GONE
    assert node.tasks.stop_tasks(["victim-0"], grace=0, timeout=5)[0].state is TaskState.STOPPED  # idempotent


def test_pinned_containers_are_killed_and_verified_with_containerd_down(node: Node) -> None:
    """Pinned before the return, the spot containers need no containerd call at all: with its
    daemon dead (shims and containers keep running) the stop still kills every one through its
    pinned pidfd and verifies it by the pidfd (not the /proc fallback, which says so)."""
    for i in range(2):
        node.run(f"pinned-{i}", hold(node.gpus[i]), PodRef("spot", f"p{i}"))
    pids = [wait_pid(node, f"pinned-{i}") for i in range(2)]
    node.tasks.pin(["pinned-0", "pinned-1"])
    assert node.tasks.pins is not None and node.tasks.pins.pinned() == {"pinned-0": pids[0], "pinned-1": pids[1]}
    node.containerd.pause()
    try:
        results = node.tasks.stop_tasks(["pinned-0", "pinned-1"], grace=0, timeout=10)
    finally:
        node.containerd.start()
    assert [(r.state, r.detail) for r in results] == [(TaskState.STOPPED, "init exited (pinned)")] * 2
    backend = DeviceNodeBackend([DeviceNode(DeviceID(f"GPU-{i}"), str(g), i, 0) for i, g in enumerate(node.gpus)])
    assert not any(backend.processes().values())
    node.tasks.after_release()
    for i in range(2):
        eventually_stopped(node, f"pinned-{i}")


def test_a_restarted_container_is_pinned_again_and_a_stale_pin_is_never_signalled(node: Node) -> None:
    """The pinned init exits (the container finished, or restarts with a new init): the stale
    pin is not used (the pidfd can name no other process anyway), the next pin() takes the new
    init, and a stop of the container goes through containerd when no live pin is left."""
    ref = PodRef("spot", "again")
    node.run("again", "exec sleep 1000", ref)
    first = wait_pid(node, "again")
    node.tasks.pin(["again"])
    assert node.tasks.pins is not None and node.tasks.pins.pinned() == {"again": first}
    node.containerd.ctr("tasks", "kill", "-s", "SIGKILL", "again", namespace=NS)
    eventually_stopped(node, "again")
    assert node.tasks.pins.take(["again"]) == {}  # stale: its init exited
    node.containerd.ctr("tasks", "delete", "again", namespace=NS)
    node.containerd.ctr("tasks", "start", "-d", "again", namespace=NS)
    second = wait_pid(node, "again")
    node.tasks.pin(["again"])
    assert node.tasks.pins.pinned() == {"again": second} and second != first
    [result] = node.tasks.stop_tasks(["again"], grace=0, timeout=10)
    assert (result.state, result.detail) == (TaskState.STOPPED, "init exited (pinned)")
    node.tasks.pin([])
    assert node.tasks.pins.pinned() == {}


def run_sharing_pods_pid_namespace(node: Node, pod_name: str, cid: str, script: str) -> None:
    """Pod ``pod_name``'s pause container (``<pod>-pause``), then container ``cid`` in its PID
    namespace (``shareProcessNamespace``)."""
    node.run(f"{pod_name}-pause", "exec sleep 999", PodRef("spot", pod_name), container="POD")
    pause = node.tasks.init_pid(f"{pod_name}-pause")
    assert pause is not None
    node.run(cid, script, PodRef("spot", pod_name), extra=["--with-ns", f"pid:/proc/{pause}/ns/pid"])


def test_a_container_sharing_its_pods_pid_namespace_is_verified_by_wait_and_killed_whole(node: Node) -> None:
    """``shareProcessNamespace``, not pinned: the container's init is not PID 1 of its namespace
    (the pod's pause is), so its exit would leave its children running: the stop is not taken
    from the init's pidfd, and containerd's Kill(all) ends the child too."""
    run_sharing_pods_pid_namespace(node, "shared", "worker", "sleep 1000 & exec sleep 1001")
    child = wait_for_process("sleep 1000")
    [result] = node.tasks.stop_tasks(["worker"], grace=0, timeout=10)
    assert (result.state, result.exit_status, result.detail) == (TaskState.STOPPED, 137, "")
    fd = os.pidfd_open(child)
    try:
        assert select.select([fd], [], [], 10)[0], "the init's child outlived the stop"
    finally:
        os.close(fd)
    assert node.status("shared-pause") == "RUNNING"


def test_a_pinned_container_sharing_a_pid_namespace_is_killed_whole_through_its_cgroup(node: Node) -> None:
    """Pinned, a container sharing its pod's PID namespace has its cgroup's processes pinned
    too; at the kill its cgroup is read again, so a process started after the pin dies as
    well, and the stop is verified by every pidfd, with containerd down meanwhile."""
    run_sharing_pods_pid_namespace(node, "shared2", "worker2", "sleep 0.3; sleep 1002 & exec sleep 1003")
    wait_pid(node, "worker2")
    node.tasks.pin(["worker2"])
    assert node.tasks.pins is not None
    [pin] = node.tasks.pins.take(["worker2"]).values()
    try:
        assert not pin.namespace_init and pin.procs is not None, "the container's cgroup.procs was not found"
    finally:
        pin.close()
    late = wait_for_process("sleep 1002")  # started after the pin
    node.containerd.pause()
    try:
        [result] = node.tasks.stop_tasks(["worker2"], grace=0, timeout=10)
    finally:
        node.containerd.start()
    assert (result.state, result.detail) == (TaskState.STOPPED, "every process exited (pinned)")
    assert not Path(f"/proc/{late}/fd").exists() or not os.listdir(f"/proc/{late}/fd")
    assert node.status("shared2-pause") == "RUNNING"


def make_agent(tmp_path: Path, node: Node, kube: FakeKube, podres: FakePodResources, guard: FakeGuard) -> Agent:
    backend = DeviceNodeBackend([DeviceNode(DeviceID(f"GPU-{i}"), str(p), i, 0) for i, p in enumerate(node.gpus)])
    config = AgentConfig(
        detect_interval=Seconds(1.0),
        max_inactive_time=Seconds(30.0),
        device_plugin_dir=tmp_path / "dp",
        containerd_namespace=NS,
    )
    agent = Agent(
        config,
        node=NODE,
        kube=kube,
        backend=backend,
        tasks=node.tasks,
        pod_resources=podres,
        guard_factory=lambda handler: setattr(guard, "handler", handler) or guard,
        clock=ManualClock(start=100.0),
        metrics=AgentMetrics(),
        serve_device_plugin=False,
    )
    agent.ref_retry_interval = 0.0  # the test starts the owner's container between two cycles
    return agent


def test_owner_back_really_stops_spot_tasks_and_owner_processes_are_attributed(tmp_path: Path, node: Node) -> None:
    spot_a, spot_b = PodRef("spot", "job-a"), PodRef("spot", "job-b")
    node.run("spot-a", hold(node.gpus[0]), spot_a)
    node.run("spot-b", hold(node.gpus[1]), spot_b)
    kube = FakeKube([pod(OWNER.pod_ref, (("main", "owner"),)), pod(spot_a, (("worker", "spot-a"),)), pod(spot_b, ())])
    podres = FakePodResources(
        [
            gpu_alloc(OWNER, ["GPU-0", "GPU-1"]),
            spot_alloc(spot_a, "worker", ["GPU-0"]),
            spot_alloc(spot_b, "worker", ["GPU-1"]),
        ]
    )
    guard = FakeGuard()
    agent = make_agent(tmp_path, node, kube, podres, guard)
    agent.start(serve_metrics=False, loops=False)
    try:
        # recovery: spot users present -> the owner was lent; the spot processes hold the GPUs
        assert agent.solver.state().lend_states[OWNER] is LendState.LENT
        assert isinstance(agent.backend, DeviceNodeBackend)
        wait_holders(agent.backend, "GPU-0", 1)
        wait_holders(agent.backend, "GPU-1", 1)
        agent.detect_once()
        assert agent.solver.state().lend_states[OWNER] is LendState.LENT  # spot processes are not the owner's
        # the owner container starts and opens its GPU: the poll attributes it and evicts
        node.run("owner", hold(node.gpus[1]), OWNER.pod_ref, "main")
        wait_holders(agent.backend, "GPU-1", 2)
        report = agent.detect_once()
        assert report.events and agent.solver.state().lend_states[OWNER] is LendState.ACTIVE
        assert not agent.backend.processes()[DeviceID("GPU-0")]  # verified gone by their pidfds
        eventually_stopped(node, "spot-a")  # containerd is told after the release (verifyByPidfd)
        eventually_stopped(node, "spot-b")
        assert node.status("owner") == "RUNNING"
        assert {d.pod for d in kube.deletes} == {spot_a, spot_b}
        assert guard.calls == [("arm", OWNER), ("disarm", OWNER)]
    finally:
        agent.stop()


def test_guard_signal_evicts_eight_containers_quickly(tmp_path: Path, node: Node) -> None:
    spots = [PodRef("spot", f"job-{i}") for i in range(8)]
    for i, ref in enumerate(spots):
        node.run(f"spot-{i}", hold(node.gpus[i % 2]), ref)
    kube = FakeKube([pod(OWNER.pod_ref, (("main", "owner"),)), *(pod(r, ()) for r in spots)])
    podres = FakePodResources(
        [
            gpu_alloc(OWNER, ["GPU-0", "GPU-1"]),
            *(spot_alloc(r, "worker", [f"GPU-{i % 2}"]) for i, r in enumerate(spots)),
        ]
    )
    guard = FakeGuard()
    agent = make_agent(tmp_path, node, kube, podres, guard)
    assert isinstance(agent.backend, DeviceNodeBackend)
    wait_holders(agent.backend, "GPU-0", 4)
    wait_holders(agent.backend, "GPU-1", 4)
    agent.start(serve_metrics=False, loops=False)
    try:
        assert guard.is_armed(OWNER)
        outcome = agent.solver.owner_back(OWNER)
        assert outcome is not None and not outcome.failed_tasks
        assert sorted(outcome.plan.container_ids) == sorted(f"spot-{i}" for i in range(8))
        assert not agent.backend.processes()[DeviceID("GPU-0")]
        for i in range(8):
            eventually_stopped(node, f"spot-{i}")  # containerd hears of the stops after the release
        assert not guard.is_armed(OWNER)
        # a generous bound: the benchmark measures the real figure
        assert outcome.stop_latency < 5.0
    finally:
        agent.stop()


def test_containerd_down_spot_processes_are_killed_through_proc(node: Node) -> None:
    """containerd's daemon dies (shims and containers keep running): stop_tasks finds each
    container's processes by the container ID in their cgroup path and kills them itself."""
    cids = [hashlib.sha256(uuid.uuid4().bytes).hexdigest() for _ in range(2)]  # CRI-style 64-hex IDs
    for i, cid in enumerate(cids):
        node.run(cid, hold(node.gpus[i]), PodRef("spot", f"v{i}"))
    pids = [wait_pid(node, cid) for cid in cids]
    node.containerd.pause()
    try:
        results = {r.container_id: r for r in node.tasks.stop_tasks(cids, grace=0.0, timeout=10)}
    finally:
        node.containerd.start()  # so the fixture can delete the containers (runc's state is global)
    assert {r.state for r in results.values()} == {TaskState.STOPPED}
    assert all("SIGKILLed directly" in r.detail for r in results.values())
    for pid in pids:
        assert not Path(f"/proc/{pid}/fd").exists() or not os.listdir(f"/proc/{pid}/fd")


def test_containerd_down_and_ids_unknown_the_sweep_finds_the_pods_gpu_processes(tmp_path: Path, node: Node) -> None:
    """The worst case of a return: containerd is down and the spot container started after the
    agent last listed containers, with no ID in the API yet. The agent finds the spot pod's
    processes on the owner's GPUs by the pod UID in their (kubelet-style) cgroup path and kills
    them before it releases the owner."""
    uid = str(uuid.uuid4())
    cid = hashlib.sha256(uid.encode()).hexdigest()
    spot = PodRef("spot", "unseen")
    group = f"spotgpu-test-{uid[:8]}"
    kube = FakeKube([pod(OWNER.pod_ref, (("main", "owner"),)), PodInfo(spot, uid, NODE, "Running")])
    podres = FakePodResources([gpu_alloc(OWNER, ["GPU-0", "GPU-1"]), spot_alloc(spot, "worker", ["GPU-0"])])
    guard = FakeGuard()
    agent = make_agent(tmp_path, node, kube, podres, guard)
    assert isinstance(agent.backend, DeviceNodeBackend)
    agent.start(serve_metrics=False, loops=False)  # recovery lists containerd before the container exists
    try:
        node.containerd.run_detached(
            cid, node.rootfs, ["sh", "-c", hold(node.gpus[0])], namespace=NS, labels=cri_labels(spot, "worker"),
            devices=[str(g) for g in node.gpus], extra=["--cgroup", f"/{group}/pod{uid}/{cid}"],
        )  # fmt: skip
        pid = wait_pid(node, cid)
        wait_holders(agent.backend, "GPU-0", 1)
        node.containerd.pause()
        outcome = agent.solver.owner_back(OWNER)
        assert outcome is not None and outcome.plan.container_ids == ()  # nobody knew its ID
        assert not agent.backend.processes()[DeviceID("GPU-0")]  # cleared before the release
        assert not Path(f"/proc/{pid}/fd").exists() or not os.listdir(f"/proc/{pid}/fd")
        assert guard.calls[-1] == ("disarm", OWNER)
    finally:
        agent.stop()
        if not node.containerd.running:
            node.containerd.start()  # so the fixture can delete the container (runc's state is global)
        node.containerd.remove_all(NS)
        remove_cgroup_tree(group)


def wait_pid(node: Node, cid: str) -> int:
    deadline = time.monotonic() + 10
    while (pid := node.tasks.init_pid(cid)) is None:
        assert time.monotonic() < deadline, f"{cid} never ran"
        time.sleep(0.02)
    return pid


def test_killed_containers_cgroups_get_the_top_cpu_weight_until_their_stops_are_verified(node: Node) -> None:
    """``agent.eviction.boostCpu``: right after the SIGKILLs the CPU weight of each killed
    container's cgroup and its ancestors is raised (a dying process must still run to exit),
    for a pinned container (knobs found at pin time) and one whose PID came from containerd,
    and every value is back once the stops are verified."""
    group = f"spotgpu-test-{uuid.uuid4().hex[:8]}"
    ids = ["victim-0", "victim-1"]
    try:
        for i, cid in enumerate(ids):
            node.run(cid, hold(node.gpus[0]), PodRef("spot", f"v{i}"), extra=["--cgroup", f"/{group}/pod{i}/{cid}"])
        node.tasks.pin(ids[:1])
        assert node.tasks.pins is not None and set(node.tasks.pins.pinned()) == {"victim-0"}
        boost = node.tasks.boost
        assert boost is not None
        during: list[dict[Path, str]] = []
        original = boost.raise_

        def spy(knobs: Iterable[Knob]) -> Raised:
            raised = original(knobs)
            during.append({k.file: k.file.read_text().strip() for k in raised.knobs})
            return raised

        boost.raise_ = spy  # type: ignore[method-assign]
        results = node.tasks.stop_tasks(ids, grace=0, timeout=10)
        assert [r.state for r in results] == [TaskState.STOPPED, TaskState.STOPPED]
        files = {f for d in during for f in d}
        shares = {f.parent.name for f in files if f.name in ("cpu.shares", "cpu.weight")}
        assert {"pod0", "pod1", group} <= shares, files
        assert all(v == k_value(f) for d in during for f, v in d.items())
        assert boost.raised() == {}
        for f in files:
            if f.exists() and f.name in ("cpu.shares", "cpu.weight"):
                assert f.read_text().strip() in ("1024", "100"), f"{f} was not restored"
    finally:
        node.tasks.after_release()
        node.containerd.remove_all(NS)
        remove_cgroup_tree(group)


def k_value(file: Path) -> str:
    return {"cpu.shares": "262144", "cpu.weight": "10000", "cpu.idle": "0"}[file.name]


class CountingTasks:
    """containerd's Tasks stub, counting the ``Get`` calls made through it."""

    def __init__(self, stub: object) -> None:
        self.stub = stub
        self.gets = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.stub, name)

    @property
    def Get(self) -> object:
        self.gets += 1
        return self.stub.Get  # type: ignore[attr-defined]


def cri_id(i: int) -> str:
    return hashlib.sha256(f"victim-{i}-{uuid.uuid4()}".encode()).hexdigest()


def test_unpinned_containers_are_killed_from_their_bundles_with_their_mount_namespaces_held(node: Node) -> None:
    """A return with no containerd call for containers not pinned yet: each init's PID from its
    shim's bundle (``init.pid``, accepted because the process's cgroup names the CRI ID), each
    mount namespace held across the exit (its teardown is not part of the stop) and dropped
    after the release."""
    tasks = ContainerdTasks(node.containerd.address, NS, state_dir=node.containerd.base / "state")
    counting = CountingTasks(tasks._tasks)
    tasks._tasks = counting  # type: ignore[assignment]
    ids = [cri_id(i) for i in range(2)]
    try:
        for i, cid in enumerate(ids):
            node.run(cid, hold(node.gpus[0]), PodRef("spot", f"v{i}"))
        results = tasks.stop_tasks(ids, grace=0, timeout=10)
        assert [(r.state, r.detail) for r in results] == [
            (TaskState.STOPPED, "init exited (pid from the task bundle)")
        ] * 2
        assert counting.gets == 0
        assert not DeviceNodeBackend([DeviceNode(DeviceID("GPU-0"), str(node.gpus[0]), 0, 0)]).processes()["GPU-0"]
        assert tasks.mntns is not None and tasks.mntns.held_total == 2 and len(tasks.mntns) == 2
        tasks.after_release()
        assert len(tasks.mntns) == 0
        for cid in ids:
            eventually_stopped(node, cid)
    finally:
        tasks.close()


def test_a_bundle_pid_that_names_a_stranger_is_never_signalled(node: Node) -> None:
    """The attack on the bundle path: the file names a PID that is not the container's (its init
    exited and the PID was reused, or the file was tampered with). That process's cgroup does not
    name the container: it is left alone, and the container's init comes from containerd."""
    tasks = ContainerdTasks(node.containerd.address, NS, state_dir=node.containerd.base / "state")
    cid = cri_id(0)
    stranger = subprocess.Popen(["sleep", "1000"])
    try:
        node.run(cid, hold(node.gpus[0]), PodRef("spot", "v0"))
        pid_file = node.containerd.base / "state" / "io.containerd.runtime.v2.task" / NS / cid / "init.pid"
        real = pid_file.read_text()
        pid_file.write_text(str(stranger.pid))
        try:
            (result,) = tasks.stop_tasks([cid], grace=0, timeout=10)
        finally:
            pid_file.write_text(real)
        assert (result.state, result.detail) == (TaskState.STOPPED, "init exited (pid from containerd)")
        assert stranger.poll() is None, "the stranger was signalled"
        tasks.after_release()
        eventually_stopped(node, cid)
    finally:
        stranger.kill()
        stranger.wait(10)
        tasks.close()


def test_with_holdmountns_off_the_stops_hold_no_namespace(node: Node) -> None:
    """``agent.eviction.holdMountNs: false``: the same stop, and the agent keeps no namespace fd."""
    tasks = ContainerdTasks(node.containerd.address, NS, hold_mount_ns=False, state_dir=node.containerd.base / "state")
    cid = cri_id(0)
    try:
        node.run(cid, hold(node.gpus[0]), PodRef("spot", "v0"))
        (result,) = tasks.stop_tasks([cid], grace=0, timeout=10)
        assert (result.state, result.detail) == (TaskState.STOPPED, "init exited (pid from the task bundle)")
        assert tasks.mntns is None
        assert not mount_namespace_fds()
        tasks.after_release()
        eventually_stopped(node, cid)
    finally:
        tasks.close()
