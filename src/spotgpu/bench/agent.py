"""``spotgpu bench agent --containers 8 --json``: eviction latency and detection cost (root).

Side effects: starts a private containerd (root, state and socket in a temporary directory),
creates stand-in GPU device nodes there and runs busybox containers that hold them open; all
removed at the end.

Per run: N spot containers each hold one of N stand-in GPUs of one owner (an 8-GPU dev
machine lent out); the agent starts (recovery finds the GPUs lent, the guard armed), then the
guard's "owner back" signal is delivered and the time until every spot task is verified
stopped (containerd Kill SIGKILL + Wait) is measured: ``eviction_ms``. Pod deletion and
guard release follow (``eviction_complete_ms``; the Kubernetes API is an in-memory fake here).

``detect_cycle_cpu_ms``: CPU time (all threads of this process) of one full detection cycle
with N GPUs lent and N spot processes on them: pod-resources and containerd listings, the
device-node backend's /proc scan, attribution through /proc, the detectors, the health and
annotation publishing. The kubelet's pod-resources is an in-memory fake; NVML is not involved
(no GPU here): with NVML the /proc scan is replaced by N NVML calls.

Figures are medians and nearest-rank percentiles over the runs; the machine may be shared,
so compare ratios measured in one run rather than absolute numbers across machines.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import stat
import statistics
import sys
import tempfile
import time
from pathlib import Path

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.adapters.containerd import ContainerdTasks
from spotgpu.adapters.devnode_gpu import DeviceNode, DeviceNodeBackend
from spotgpu.agent.ports import ContainerInfo, PodInfo
from spotgpu.agent.service import Agent
from spotgpu.core import keys
from spotgpu.core.config import AgentConfig, Seconds
from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE, DeviceID, NodeName, to_spot_id
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.ports.node import AllocatedDevices
from spotgpu.testing.containerd import Containerd, make_rootfs
from spotgpu.testing.fakes import FakeGuard, FakeKube, FakePodResources

NS = "spotgpu-bench"
NODE = NodeName("bench-node")
OWNER = ContainerRef("dev", "devbox", "main")
TARGETS = {"eviction_ms_p99": 50.0, "detect_cycle_cpu_ms": 5.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--containers", type=int, default=8, help="spot containers (= lent GPUs) per run")
    parser.add_argument("--runs", type=int, default=20, help="evictions to measure")
    parser.add_argument("--cycles", type=int, default=50, help="detection cycles to measure")
    parser.add_argument("--grace", type=float, default=0.0, help="SIGTERM grace before SIGKILL (seconds)")
    parser.add_argument("--json", action="store_true", help="print only the JSON object")


def percentile(values: list[float], q: float) -> float:
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


class _Bench:
    def __init__(self, base: Path, count: int, grace: float) -> None:
        self.base = base
        self.count = count
        self.grace = grace
        (base / "dev").mkdir()
        self.gpus = []
        for i in range(count):
            path = base / "dev" / f"nvidia{i}"
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            self.gpus.append(path)
        self.rootfs = make_rootfs(base / "rootfs")
        self.ids = [DeviceID(f"GPU-bench-{i:04d}") for i in range(count)]
        self.spots = [PodRef("spot", f"job-{i}") for i in range(count)]

    def start_spots(self, containerd: Containerd, run: int) -> list[str]:
        cids = []
        for i, gpu in enumerate(self.gpus):
            cid = f"spot-{os.getpid()}-{run}-{i}"  # unique per process: runc's state is machine-wide
            containerd.run_detached(
                cid,
                self.rootfs,
                ["sh", "-c", f"exec 3<>{gpu}; exec sleep 100000"],
                namespace=NS,
                labels=_labels(self.spots[i]),
                devices=[str(gpu)],
            )
            cids.append(cid)
        return cids

    def agent(self, tasks: ContainerdTasks, cids: list[str]) -> tuple[Agent, FakeGuard]:
        backend = DeviceNodeBackend(
            [DeviceNode(d, str(p), i, i % 2) for i, (d, p) in enumerate(zip(self.ids, self.gpus, strict=True))]
        )
        deadline = time.monotonic() + 30
        while not all(backend.processes()[d] for d in self.ids):
            if time.monotonic() > deadline:
                raise RuntimeError("spot containers never opened their stand-in GPUs")
            time.sleep(0.01)
        pods = [PodInfo(OWNER.pod_ref, "uid-owner", NODE, "Running", containers=(ContainerInfo("main", "owner"),))]
        pods += [
            PodInfo(ref, f"uid-{i}", NODE, "Running", containers=(ContainerInfo("worker", cids[i]),))
            for i, ref in enumerate(self.spots)
        ]
        allocations = [AllocatedDevices(OWNER.pod_ref, "main", NVIDIA_GPU_RESOURCE, tuple(self.ids))]
        allocations += [
            AllocatedDevices(ref, "worker", SPOT_GPU_RESOURCE, (to_spot_id(self.ids[i]),))
            for i, ref in enumerate(self.spots)
        ]
        guard = FakeGuard()
        config = AgentConfig(
            detect_interval=Seconds(10.0),
            max_inactive_time=Seconds(600.0),
            device_plugin_dir=self.base / "dp",
            containerd_namespace=NS,
            sigterm_grace=Seconds(self.grace),
        )
        agent = Agent(
            config,
            node=NODE,
            kube=FakeKube(pods),
            backend=backend,
            tasks=tasks,
            pod_resources=FakePodResources(allocations),
            guard_factory=lambda handler: guard,
            metrics=AgentMetrics(),
            serve_device_plugin=False,
        )
        agent.start(serve_metrics=False, loops=False)
        if not guard.is_armed(OWNER):
            raise RuntimeError("recovery did not take the owner as lent")
        return agent, guard


def run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0 or not all(shutil.which(p) for p in ("containerd", "ctr", "runc")):
        print("spotgpu bench agent: needs root, containerd, ctr and runc", file=sys.stderr)
        return 2
    logging.getLogger("spotgpu.agent").setLevel(logging.WARNING)  # one line per step would drown the figures
    evictions: list[float] = []
    complete: list[float] = []
    cycles_cpu: list[float] = []
    cycles_wall: list[float] = []
    with tempfile.TemporaryDirectory(prefix="spotgpu-bench-agent-") as tmp:
        base = Path(tmp)
        bench = _Bench(base, args.containers, args.grace)
        with Containerd(base / "containerd") as containerd:
            tasks = ContainerdTasks(containerd.address, NS)
            try:
                for run_no in range(args.runs):
                    cids = bench.start_spots(containerd, run_no)
                    agent, _ = bench.agent(tasks, cids)
                    try:
                        if run_no == 0:
                            for _ in range(args.cycles):
                                report = agent.detect_once()
                                if report.events:
                                    raise RuntimeError(f"unexpected lending events {report.events}")
                                cycles_cpu.append(report.cpu_seconds * 1000)
                                cycles_wall.append(report.wall_seconds * 1000)
                        outcome = agent.solver.owner_back(OWNER)
                        if outcome is None or outcome.failed_tasks:
                            raise RuntimeError(f"eviction failed: {outcome}")
                        stopped = {cid: tasks.task_status(cid) for cid in cids}
                        if any(s not in ("STOPPED", None) for s in stopped.values()):
                            raise RuntimeError(f"tasks still running after eviction: {stopped}")
                        evictions.append(outcome.stop_latency * 1000)
                        complete.append((outcome.completed_at - outcome.plan.at) * 1000)
                    finally:
                        agent.stop()
                    containerd.remove_all(NS)
            finally:
                tasks.close()
    result = {
        "containers": args.containers,
        "runs": args.runs,
        "grace_s": args.grace,
        "eviction_ms_p50": round(statistics.median(evictions), 2),
        "eviction_ms_p99": round(percentile(evictions, 99), 2),
        "eviction_ms_max": round(max(evictions), 2),
        "eviction_complete_ms_p50": round(statistics.median(complete), 2),
        "detect_cycle_cpu_ms": round(statistics.median(cycles_cpu), 3),
        "detect_cycle_cpu_ms_p99": round(percentile(cycles_cpu, 99), 3),
        "detect_cycle_wall_ms": round(statistics.median(cycles_wall), 3),
        "backend": "devnode (stand-in GPUs, /proc scan)",
        "targets": TARGETS,
        "met": {
            "eviction_ms_p99": percentile(evictions, 99) <= TARGETS["eviction_ms_p99"],
            "detect_cycle_cpu_ms": statistics.median(cycles_cpu) <= TARGETS["detect_cycle_cpu_ms"],
        },
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(json.dumps(result, indent=2, sort_keys=True))
    return 0
