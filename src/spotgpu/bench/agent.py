"""``spotgpu bench agent --containers 1,8,16,32 --background-load 0,2 --json``: the return path (root).

Side effects: starts a private containerd (root, state and socket in a temporary directory),
creates stand-in GPU device nodes there and runs busybox containers that hold them open, and
with ``--background-load`` starts busy-loop processes (:mod:`spotgpu.bench.env`); all removed
at the end. ``--out FILE`` also writes the JSON object there.

Per measured return: N spot containers each hold one of N stand-in GPUs of one owner (an
N-GPU dev machine lent out); the agent starts (recovery finds the GPUs lent, the guard armed,
the spot containers' processes pinned), the background load (if any) runs for ``--settle``
seconds, then the guard's "owner back" signal is delivered the way the real guard delivers it:
from the guard's own waiting thread (at the priority the agent's configuration gives the real
guard's thread), woken for it, calling the agent's handler. Timed from the moment the signal
is raised:

* ``eviction_ms``: until every spot task is verified stopped (by the default configuration:
  the pinned processes SIGKILLed, their pidfds readable);
* ``hold_ms``: until the owner is released (the guard disarmed, after the kill is verified):
  the agent's share of the owner's held first GPU call (the guard's own release, disarm to
  the owner's ioctl returning, is ``spotgpu bench guard``'s ``release_after_eviction_ms``);
  ``release_step_ms`` = hold minus eviction;
* ``eviction_complete_ms``: until the pods are deleted too (an in-memory Kubernetes API here).

``--configs`` measures the agent's return path with some of ``agent.eviction``'s switches off
(:data:`CONFIGS`; ``default`` is the shipped configuration, ``legacy`` all switches off), for
A/B comparisons on a machine whose load drifts; ``--detect-load`` runs detection cycles back to
back on another thread while each return runs (the interference ``deferDetection`` removes; an
upper bound: a real agent runs one cycle per ``detectInterval``).

Every combination of ``--containers``, ``--background-load`` and ``--configs`` is measured
``--runs`` times, interleaved (each round visits every combination, in a rotating order), so a
machine whose other load drifts affects all combinations alike. ``detect_cycle_cpu_ms``: CPU
time (all threads of this process) of one full detection cycle with N GPUs lent and N spot
processes on them (pod-resources and containerd listings, the device-node backend's /proc scan,
attribution, detectors, publishing, the pin refresh), taken in the first round of each
combination under its load; the kubelet's pod-resources is an in-memory fake and NVML is not
involved (no GPU here).

Bars (issue 15), for the ``default`` configuration where the issue defines one (``met`` says
which held): at 8 containers ``eviction_ms_p99`` and ``hold_ms_p99`` <= 30 ms quiet and <= 50 ms
under background load 2, ``detect_cycle_cpu_ms`` <= 5; at 32 containers under load 2
``hold_ms_p99`` <= 100 ms (the hold bars are node-e2e's for the whole hold; the agent's share
must meet them). Figures are medians and nearest-rank percentiles; the machine may be shared,
so compare ratios from one run rather than absolute numbers across machines. With a single
combination its figures are repeated at the top level (the former output's keys); ``met``
names each bar with its combination, ``all_met`` says whether every one held.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import shutil
import stat
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.adapters.containerd import ContainerdTasks
from spotgpu.adapters.devnode_gpu import CgroupPids, DeviceNode, DeviceNodeBackend
from spotgpu.agent.service import Agent
from spotgpu.bench import env
from spotgpu.core import keys
from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.config import AgentConfig, EvictionConfig
from spotgpu.core.configfile import Seconds
from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE, DeviceID, NodeName, to_spot_id
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.ports.guard import OwnerBackHandler
from spotgpu.ports.kube import ContainerInfo, PodInfo
from spotgpu.ports.node import TaskPort
from spotgpu.testing.containerd import Containerd, make_rootfs
from spotgpu.testing.fakes import FakeGuard, FakeKube, FakePodResources
from spotgpu.util.priority import raise_thread

NS = "spotgpu-bench"
NODE = NodeName("bench-node")
OWNER = ContainerRef("dev", "devbox", "main")
SIGNAL_TIMEOUT = 120.0
CTR_WORKERS = 4
TARGETS: dict[str, Any] = {
    "eviction_ms_p99": {"quiet": 30.0, "background_load_2": 50.0, "applies_to": "8 containers"},
    "hold_ms_p99": {
        "quiet": 30.0,
        "background_load_2": 50.0,
        "applies_to": "8 containers; 32 containers under background load 2: 100 ms",
    },
    "hold_ms_p99_32_background_load_2": 100.0,
    "detect_cycle_cpu_ms": {
        "any_load": 5.0,
        "applies_to": "8 containers; 32 containers (issue 28: also beside --host-processes 2000)",
    },
    "configuration": "default",
}
_OFF = EvictionConfig(
    realtime=False, pin_pidfds=False, verify_by_pidfd=False, defer_detection=False, boost_cpu=False, hold_mount_ns=False
)
CONFIGS: dict[str, EvictionConfig] = {
    "default": EvictionConfig(),
    "legacy": _OFF,
    "no-pin": replace(EvictionConfig(), pin_pidfds=False),
    "no-pidfd": replace(EvictionConfig(), verify_by_pidfd=False),
    "no-realtime": replace(EvictionConfig(), realtime=False),
    "no-defer": replace(EvictionConfig(), defer_detection=False),
    "no-boost": replace(EvictionConfig(), boost_cpu=False),
    "no-mntns": replace(EvictionConfig(), hold_mount_ns=False),
}
"""``--configs`` names: ``agent.eviction`` with switches off (``legacy``: all of them, the return
path before issue 15)."""


def _switches(config: EvictionConfig) -> dict[str, bool]:
    """The boolean switches of ``config`` (what a configuration name stands for)."""
    return {k: v for k, v in dataclasses.asdict(config).items() if isinstance(v, bool)}


def bars(containers: int, load: int) -> dict[str, float]:
    """The issue-15 bars that apply to one combination of the default configuration."""
    found: dict[str, float] = {}
    if containers == 8:
        found["detect_cycle_cpu_ms"] = 5.0
        if load in (0, 2):
            found["eviction_ms_p99"] = found["hold_ms_p99"] = 30.0 if load == 0 else 50.0
    elif containers == 32:
        found["detect_cycle_cpu_ms"] = 5.0
        if load == 2:
            found["hold_ms_p99"] = 100.0
    return found


def config_list(text: str) -> list[str]:
    """argparse type for ``--configs default,legacy``."""
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown configuration(s) {unknown}: choose from {', '.join(CONFIGS)}")
    return list(dict.fromkeys(names))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--containers",
        type=env.int_list,
        default=[8],
        metavar="N[,N...]",
        help="spot containers (= lent GPUs) per return; a list measures each (default 8)",
    )
    parser.add_argument("--runs", type=int, default=20, help="returns to measure per combination (default 20)")
    parser.add_argument("--cycles", type=int, default=50, help="detection cycles per combination (default 50)")
    parser.add_argument("--grace", type=float, default=0.0, help="SIGTERM grace before SIGKILL (seconds)")
    parser.add_argument(
        "--settle", type=float, default=0.3, help="seconds the background load runs before each signal (default 0.3)"
    )
    parser.add_argument(
        "--configs",
        type=config_list,
        default=["default"],
        metavar="NAME[,NAME...]",
        help=f"agent.eviction configurations to measure, interleaved ({', '.join(CONFIGS)}; default: default)",
    )
    parser.add_argument(
        "--detect-load", action="store_true", help="run detection cycles back to back during each return"
    )
    parser.add_argument(
        "--host-processes",
        type=env.non_negative,
        default=0,
        help="N idle host processes beside the node, every other one holding files open (default 0)",
    )
    parser.add_argument(
        "--process-scan",
        choices=["cgroups", "proc"],
        default="cgroups",
        help="detection looks at the containers' cgroups (the agent's way, default) or at every /proc entry",
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--out", type=Path, help="also write the JSON object to this file")
    parser.add_argument("--check", action="store_true", help="exit 1 when a bar is missed")
    env.add_arguments(parser, several=True)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def _labels(ref: PodRef) -> dict[str, str]:
    return {
        keys.LABEL_POD_NAMESPACE: ref.namespace or "",
        keys.LABEL_POD_NAME: ref.name,
        keys.LABEL_CONTAINER_NAME: "worker",
        keys.LABEL_CRI_KIND: "container",
    }


class GuardThread:
    """The guard's side of "owner back": a thread that waits for its event and then calls the
    agent's handler (as the real guard's thread does when a held call arrives)."""

    def __init__(self, guard: FakeGuard, *, realtime: bool = False) -> None:
        self._guard = guard
        self._realtime = realtime
        """Raise the thread as the real guard raises its own (``agent.eviction.realtime``)."""
        self._wanted = threading.Event()
        self._done = threading.Event()
        self._stop = False
        self._error: BaseException | None = None
        self.fired_at = 0
        """When the last signal was raised (monotonic ns)."""
        self._thread = threading.Thread(target=self._loop, name="bench-guard", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        if self._realtime:
            raise_thread()
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._stop:
                return
            try:
                self._call()
            except BaseException as exc:  # raised again by fire(), on the bench's thread
                self._error = exc
            finally:
                self._done.set()

    def _call(self) -> None:
        self._guard.owner_back(OWNER)

    def fire(self) -> float:
        """Raise the signal; returns its time (monotonic seconds) once the handler returned."""
        self._done.clear()
        self.fired_at = time.monotonic_ns()
        self._wanted.set()
        if not self._done.wait(SIGNAL_TIMEOUT):
            raise RuntimeError("the agent's owner-back handler did not return")
        if self._error is not None:
            raise RuntimeError("the agent's owner-back handler failed") from self._error
        return self.fired_at / 1e9

    def close(self) -> None:
        self._stop = True
        self._wanted.set()
        self._thread.join(10)


class Node:
    """Stand-in GPUs, a busybox rootfs and the spot containers of one return."""

    def __init__(self, base: Path, count: int, grace: float) -> None:
        self.base = base
        self.grace = grace
        (base / "dev").mkdir(parents=True)
        self.gpus = []
        for i in range(count):
            path = base / "dev" / f"nvidia{i}"
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            self.gpus.append(path)
        self.rootfs = make_rootfs(base / "rootfs")
        self.ids = [DeviceID(f"GPU-bench-{i:04d}") for i in range(count)]
        self.spots = [PodRef("spot", f"job-{i}") for i in range(count)]

    def start_spots(self, containerd: Containerd, tag: str, count: int) -> list[str]:
        """``count`` spot containers, each holding one stand-in GPU open (in parallel)."""

        def start(i: int) -> str:
            # 64-hex as a CRI container ID is; unique per process: runc's state is machine-wide
            cid = hashlib.sha256(f"spot-{os.getpid()}-{tag}-{i}".encode()).hexdigest()
            containerd.run_detached(
                cid,
                self.rootfs,
                ["sh", "-c", f"exec 3<>{self.gpus[i]}; exec sleep 100000"],
                namespace=NS,
                labels=_labels(self.spots[i]),
                devices=[str(self.gpus[i])],
            )
            return cid

        with ThreadPoolExecutor(CTR_WORKERS) as pool:
            return list(pool.map(start, range(count)))

    def agent(
        self,
        tasks: TaskPort,
        cids: Sequence[str],
        *,
        guard: FakeGuard | None = None,
        eviction: EvictionConfig | None = None,
        scan: str = "cgroups",
    ) -> tuple[Agent, FakeGuard]:
        """An agent that recovers the owner's ``len(cids)`` GPUs as lent (``guard`` armed);
        ``scan``: its device-node backend looks at the containers' cgroups (``ctr`` puts them
        under ``/<namespace>``), as the agent does at the pod cgroups, or at every process."""
        count = len(cids)
        ids, gpus, spots = self.ids[:count], self.gpus[:count], self.spots[:count]
        nodes = [DeviceNode(d, str(p), i, i % 2) for i, (d, p) in enumerate(zip(ids, gpus, strict=True))]
        backend = DeviceNodeBackend(nodes, pids=CgroupPids([NS]) if scan == "cgroups" else None)
        deadline = time.monotonic() + 30
        while not all(backend.processes()[d] for d in ids):
            if time.monotonic() > deadline:
                raise RuntimeError("spot containers never opened their stand-in GPUs")
            time.sleep(0.01)
        pods = [PodInfo(OWNER.pod_ref, "uid-owner", NODE, "Running", containers=(ContainerInfo("main", "owner"),))]
        pods += [
            PodInfo(ref, f"uid-{i}", NODE, "Running", containers=(ContainerInfo("worker", cids[i]),))
            for i, ref in enumerate(spots)
        ]
        allocations = [AllocatedDevices(OWNER.pod_ref, "main", NVIDIA_GPU_RESOURCE, tuple(ids))]
        allocations += [
            AllocatedDevices(ref, "worker", SPOT_GPU_RESOURCE, (to_spot_id(ids[i]),)) for i, ref in enumerate(spots)
        ]
        fake = guard or FakeGuard()

        def guard_factory(handler: OwnerBackHandler) -> FakeGuard:
            fake.handler = handler  # what the real guard calls from its thread
            return fake

        config = AgentConfig(
            detect_interval=Seconds(10.0),
            max_inactive_time=Seconds(600.0),
            device_plugin_dir=self.base / "dp",
            containerd_namespace=NS,
            sigterm_grace=Seconds(self.grace),
            eviction=eviction or EvictionConfig(),
        )
        agent = Agent(
            config,
            node=NODE,
            kube=FakeKube(pods),
            backend=backend,
            tasks=tasks,
            pod_resources=FakePodResources(allocations),
            guard_factory=guard_factory,
            metrics=AgentMetrics(),
            serve_device_plugin=False,
        )
        agent.start(serve_metrics=False, loops=False)
        if not fake.is_armed(OWNER):
            agent.stop()
            raise RuntimeError("recovery did not take the owner as lent")
        return agent, fake


def remove(containerd: Containerd, cids: Sequence[str]) -> None:
    """Delete the (stopped) tasks and containers, several at a time."""
    containerd.remove(cids, NS, workers=CTR_WORKERS)


@dataclass(frozen=True, slots=True)
class Return:
    """One measured return (milliseconds from the owner-back signal)."""

    eviction_ms: float
    hold_ms: float
    complete_ms: float


def measure_return(
    agent: Agent, guard: FakeGuard, tasks: ContainerdTasks, cids: Sequence[str], *, detect_load: bool = False
) -> Return:
    """Raise the guard's signal once and read the agent's record of the eviction it ran; check
    that no process holds a stand-in GPU any more and that containerd sees every task stopped
    (it may hear of an exit a moment after the agent saw it: a bounded wait, not timed)."""
    signaller = GuardThread(guard, realtime=agent.config.eviction.realtime)
    try:
        with detection_meanwhile(agent, detect_load):
            at = signaller.fire()
    finally:
        signaller.close()
    evictions = agent.debug_state()["evictions"]
    if not evictions:
        raise RuntimeError("the owner-back signal ran no eviction")
    record = evictions[-1]
    if record["failed_tasks"]:
        raise RuntimeError(f"eviction failed: {record}")
    if guard.is_armed(OWNER):
        raise RuntimeError("the owner was not released")
    holders = {d: p for d, p in agent.backend.processes().items() if p}
    if holders:
        raise RuntimeError(f"stand-in GPUs still held after the eviction: {holders}")
    deadline = time.monotonic() + 10
    while running := [c for c in cids if tasks.task_status(c) not in ("STOPPED", None)]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"containerd still reports tasks running after the eviction: {running}")
        time.sleep(0.01)
    base = (record["at"] - at) * 1000
    released = record["released_ms"] if record["released_ms"] is not None else record["complete_ms"]
    return Return(base + record["tasks_stopped_ms"], base + released, base + record["complete_ms"])


@contextlib.contextmanager
def detection_meanwhile(agent: Agent, on: bool) -> Iterator[None]:
    """Detection cycles back to back on their own thread while the block runs (when ``on``)."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                agent.detect_once()
            except BaseException as exc:  # raised again below, on the bench's thread
                failures.append(exc)
                return

    thread = threading.Thread(target=loop, name="bench-detect", daemon=True)
    if on:
        thread.start()
        time.sleep(0.02)  # a cycle under way when the signal comes
    try:
        yield
    finally:
        stop.set()
        if on:
            thread.join(30)
    if failures:
        raise RuntimeError("a detection cycle during the return failed") from failures[0]


@dataclass
class Samples:
    returns: list[Return] = field(default_factory=list)
    cycles_cpu: list[float] = field(default_factory=list)
    cycles_wall: list[float] = field(default_factory=list)


def detect_cycles(agent: Agent, cycles: int, samples: Samples) -> None:
    for _ in range(cycles):
        report = agent.detect_once()
        if report.events:
            raise RuntimeError(f"unexpected lending events {report.events}")
        samples.cycles_cpu.append(report.cpu_seconds * 1000)
        samples.cycles_wall.append(report.wall_seconds * 1000)


def _stats(prefix: str, values: Sequence[float], digits: int = 2) -> dict[str, float]:
    return {
        f"{prefix}_p50": round(statistics.median(values), digits),
        f"{prefix}_p99": round(percentile(values, 99), digits),
        f"{prefix}_max": round(max(values), digits),
    }


def summarize(containers: int, load: int, samples: Samples, config: str = "default") -> dict[str, Any]:
    """One combination's figures, its bars (default configuration only) and which of them held."""
    returns = samples.returns
    figures: dict[str, Any] = {
        "containers": containers,
        "background_load": load,
        "config": config,
        "runs": len(returns),
    }
    figures |= _stats("eviction_ms", [r.eviction_ms for r in returns])
    figures |= _stats("hold_ms", [r.hold_ms for r in returns])
    figures |= _stats("release_step_ms", [r.hold_ms - r.eviction_ms for r in returns], 3)
    figures["eviction_complete_ms_p50"] = round(statistics.median(r.complete_ms for r in returns), 2)
    if samples.cycles_cpu:
        figures["detect_cycle_cpu_ms"] = round(statistics.median(samples.cycles_cpu), 3)
        figures["detect_cycle_cpu_ms_p99"] = round(percentile(samples.cycles_cpu, 99), 3)
        figures["detect_cycle_wall_ms"] = round(statistics.median(samples.cycles_wall), 3)
    applicable = bars(containers, load) if config == "default" else {}
    targets = {k: v for k, v in applicable.items() if k in figures}
    figures["targets"] = targets
    figures["met"] = {k: figures[k] <= v for k, v in targets.items()}
    return figures


@contextlib.contextmanager
def quiet_agent_logs() -> Iterator[None]:
    agent_log = logging.getLogger("spotgpu.agent")
    level = agent_log.level
    agent_log.setLevel(logging.WARNING)  # one line per step would drown the figures
    try:
        yield
    finally:
        agent_log.setLevel(level)


Combination = tuple[int, int, str]
"""(containers, background load, configuration name)."""


def _task_ports(address: str, configs: Sequence[str]) -> dict[str, ContainerdTasks]:
    """One containerd task port per configuration, built as the agent builds its own."""
    return {
        name: ContainerdTasks(
            address,
            NS,
            verify_by_pidfd=CONFIGS[name].verify_by_pidfd,
            pin_pidfds=CONFIGS[name].pin_pidfds,
            boost_cpu=CONFIGS[name].boost_cpu,
            hold_mount_ns=CONFIGS[name].hold_mount_ns,
        )
        for name in configs
    }


def measure(args: argparse.Namespace) -> dict[Combination, Samples]:
    """Every combination ``args.runs`` times, interleaved (see module docstring)."""
    combos: list[Combination] = list(itertools.product(args.containers, args.background_load, args.configs))
    samples = {c: Samples() for c in combos}
    with tempfile.TemporaryDirectory(prefix="spotgpu-bench-agent-") as tmp, quiet_agent_logs():
        base = Path(tmp)
        node = Node(base, max(args.containers), args.grace)
        with Containerd(base / "containerd") as containerd:
            ports = _task_ports(containerd.address, args.configs)
            try:
                for run_no in range(args.runs):
                    shift = run_no % len(combos)
                    for count, load, config in combos[shift:] + combos[:shift]:
                        tasks = ports[config]
                        cids = node.start_spots(containerd, f"{run_no}-{count}-{load}-{config}", count)
                        try:
                            agent, guard = node.agent(tasks, cids, eviction=CONFIGS[config], scan=args.process_scan)
                            try:
                                with env.background_load(load):
                                    time.sleep(args.settle if load else 0.0)
                                    cell = samples[(count, load, config)]
                                    if run_no == 0:
                                        detect_cycles(agent, args.cycles, cell)
                                    ret = measure_return(agent, guard, tasks, cids, detect_load=args.detect_load)
                                    cell.returns.append(ret)
                            finally:
                                agent.stop()
                        finally:
                            remove(containerd, cids)
            finally:
                for tasks in ports.values():
                    tasks.close()
    return samples


def run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0 or not all(shutil.which(p) for p in ("containerd", "ctr", "runc")):
        print("spotgpu bench agent: needs root, containerd, ctr and runc", file=sys.stderr)
        return 2
    if args.runs < 1 or 0 in args.containers:
        print("spotgpu bench agent: --runs and --containers must be >= 1", file=sys.stderr)
        return 2
    before = env.load_average()
    with env.host_processes(args.host_processes):
        samples = measure(args)
    combinations = [summarize(count, load, s, config) for (count, load, config), s in samples.items()]
    several_configs = len(args.configs) > 1
    result: dict[str, Any] = {
        "benchmark": "agent",
        "runs": args.runs,
        "cycles": args.cycles,
        "grace_s": args.grace,
        "settle_s": args.settle,
        "detect_load": args.detect_load,
        "backend": f"devnode (stand-in GPUs, {args.process_scan} scan)",
        "host_processes": args.host_processes,
        "process_scan": args.process_scan,
        # the return path's switches (the release check is not run here: node-e2e measures it)
        "configs": {name: _switches(CONFIGS[name]) for name in args.configs},
        "combinations": combinations,
        "targets": TARGETS,
        "met": {
            f"{c['containers']} containers, background load {c['background_load']}"
            + (f", {c['config']}" if several_configs else "")
            + f": {bar}": held
            for c in combinations
            for bar, held in c["met"].items()
        },
    }
    if len(combinations) == 1:
        result |= {k: v for k, v in combinations[0].items() if k not in ("met", "targets")}
        result["met"] = combinations[0]["met"]
    result["all_met"] = all(result["met"].values())
    result["environment"] = env.environment(
        background_load=args.background_load,
        load_before=before,
        load_after=env.load_average(),
        containerd_binaries=args.containerd_binary,
    )
    text = json.dumps(result, indent=2, sort_keys=True)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(json.dumps(result, sort_keys=True) if args.json else text)
    return 1 if args.check and not result["all_met"] else 0
