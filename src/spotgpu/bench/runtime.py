"""``spotgpu bench runtime --json``: what spotgpu-runtime adds to container creation and kill (root).

With ``--cri [--containerd 1.6|2.2] [--mode wrapper|nri]`` the figures are taken through the
real CRI instead (:mod:`spotgpu.bench.runtime_cri`); what follows is the ``ctr run`` baseline.

Side effects: a private containerd (root, state and socket in a temporary directory), a
stand-in GPU device node, the kubelet doubles (pod-resources and an NVIDIA-like device plugin,
real gRPC on unix sockets) and the runtime service in this process, as the agent would host it;
all removed at the end.

Figures (medians over ``--runs`` interleaved rounds, after ``--warmup`` rounds):

* ``plain_ms_median``: ``ctr run --rm`` of ``true`` with plain runc, named through the same
  ``--runc-binary`` option as the wrapper (a containerd handler always has a ``BinaryName``, and
  passing the option by itself costs ctr and the shim about 2 ms: ``plain_no_option_ms_median``).
* ``passthrough_added_ms``: the same through the installed shell fast path, no annotations
  (every verb: ``create``, ``start``, ``delete`` ... is one ``sh`` start and one ``exec``).
* ``sync_added_ms``: a spot container with a device sync (CRI and ``container-devices-from``
  annotations): ``create`` goes through the Python wrapper and one round trip to the service
  (pod-resources ``Get`` twice, the owner record, the device plugin's ``Allocate``, ``stat``).
* ``kill_added_ms``: containerd's Tasks ``Kill`` (SIGKILL, gRPC, as the agent evicts) of a task
  created through the fast path, against one created with plain runc.
* ``shim_per_call_added_ms``: one runtime call (``--version``) through the fast path against
  runc itself, paired over 100 calls: the cost of the shell layer alone.

Also measured, to document the design choice (docs/runtime.md): ``sync_local_added_ms`` (the
modifier chain run inside the wrapper, gRPC imported per create: the ``local`` fallback; since
the lend rule fails closed it can no longer sync, as nobody can say whether a GPU is lent now,
so this create carries an annotation env instead: the same imports, engine and pod-resources
lookup, without the Allocate) and
``python_every_verb_added_ms`` (a Python wrapper started for every verb instead of the shell
fast path). The machine may be shared: rounds interleave the variants (rotating their order) and
each added figure is the median of per-round differences against the baseline of the same round,
so slow drift cancels; ``iqr_ms`` and ``load_average_1m`` show how noisy the run was.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc

from spotgpu.adapters.proto import containerd_tasks_pb2 as tpb
from spotgpu.adapters.proto import containerd_tasks_pb2_grpc as tpb_grpc
from spotgpu.bench import env
from spotgpu.core import keys
from spotgpu.core.mapping_cache import MappingCache
from spotgpu.core.refs import ContainerRef
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.engine import SpecEngine
from spotgpu.runtime.node import KubeletNodeLookup, LinuxHost
from spotgpu.runtime.ownerstate import write_owner_state
from spotgpu.runtime.service import RuntimeService
from spotgpu.runtime.shim import install_shim, package_root, resolve_lower
from spotgpu.testing.containerd import Containerd, make_rootfs
from spotgpu.testing.podresources import ContainerDevices, ContainerResources, PodResources, PodResourcesDouble
from spotgpu.testing.vendorplugin import VendorDevice, VendorPluginDouble

TARGETS: Final = {"passthrough_added_ms": 5.0, "sync_added_ms": 25.0, "kill_added_ms": 2.0}
OWNER: Final = ContainerRef("bench", "dev-box", "main")
SPOT: Final = ContainerRef("bench", "spot-job", "worker")
NAMESPACE: Final = "default"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=15, help="measured rounds (each runs every variant once)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured rounds first")
    parser.add_argument("--no-extra", action="store_true", help="skip the design-choice variants (local, python)")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="niceness increment for this process and everything it starts (containerd, shims, runc); "
        "a negative value shields the measurement from unrelated load on a shared machine",
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON object (one line)")
    parser.add_argument(
        "--cri",
        action="store_true",
        help="through the real CRI: CreateContainer+StartContainer as the kubelet calls them",
    )
    parser.add_argument("--containerd", choices=["1.6", "2.2"], default="1.6", help="with --cri (default 1.6)")
    parser.add_argument("--mode", choices=["wrapper", "nri"], default="wrapper", help="with --cri (default wrapper)")
    env.add_arguments(parser)


def _spot_annotations() -> dict[str, str]:
    assert SPOT.namespace is not None
    return {
        keys.CRI_CONTAINER_TYPE: keys.CRI_TYPE_CONTAINER,
        keys.CRI_SANDBOX_NAMESPACE: SPOT.namespace,
        keys.CRI_SANDBOX_NAME: SPOT.pod,
        keys.CRI_CONTAINER_NAME: SPOT.name,
        keys.DEVICES_FROM_PREFIX: json.dumps({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}),
    }


class _Bench:
    def __init__(self, base: Path, daemon: Containerd) -> None:
        self.base = base
        self.daemon = daemon
        self.rootfs = make_rootfs(base / "rootfs")
        self.counter = 0
        channel = grpc.insecure_channel(f"unix://{daemon.address}")
        self.channel = channel
        self.tasks = tpb_grpc.TasksStub(channel)

    def cid(self, name: str) -> str:
        self.counter += 1
        return f"rt-{name}-{os.getpid()}-{self.counter}"

    def ctr_run(self, runc_binary: str | None, annotations: dict[str, str]) -> float:
        args = ["run", "--rm", "--runtime", "io.containerd.runc.v2", "--env", "PATH=/bin"]
        if runc_binary:
            args += ["--runc-binary", runc_binary]
        for key, value in annotations.items():
            args += ["--annotation", f"{key}={value}"]
        start = time.perf_counter()
        proc = self.daemon.ctr(*args, "--rootfs", str(self.rootfs), self.cid("run"), "true", check=False)
        elapsed = (time.perf_counter() - start) * 1000
        if proc.returncode != 0:
            raise RuntimeError(f"ctr run failed ({runc_binary or 'runc'}): {proc.stderr.strip()}")
        return elapsed

    def kill_ms(self, runc_binary: str | None) -> float:
        cid = self.cid("kill")
        self.daemon.run_detached(cid, self.rootfs, ["sleep", "1000"], runc_binary=runc_binary)
        md = ((keys.CONTAINERD_NAMESPACE_HEADER, NAMESPACE),)
        try:
            start = time.perf_counter()
            self.tasks.Kill(tpb.KillRequest(container_id=cid, signal=9, all=True), metadata=md, timeout=30)
            return (time.perf_counter() - start) * 1000
        finally:
            self.tasks.Wait(tpb.WaitRequest(container_id=cid), metadata=md, timeout=30)
            self.daemon.ctr("tasks", "delete", cid, check=False)
            self.daemon.ctr("containers", "delete", cid, check=False)


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def iqr_ms(values: list[float]) -> float:
    """Interquartile range: how noisy one variant's samples were."""
    if len(values) < 4:
        return 0.0
    q = statistics.quantiles(values, n=4)
    return round(q[2] - q[0], 2)


def per_call_added_ms(shim: str, lower: str, calls: int = 100) -> float:
    """Median paired difference of one ``--version`` call through the shell fast path and direct."""
    diffs = []
    for _ in range(calls):
        times = []
        for argv in ([lower, "--version"], [shim, "--version"]):
            start = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times.append((time.perf_counter() - start) * 1000)
        diffs.append(times[1] - times[0])
    return median_ms(diffs)


def _python_every_verb(dest: Path, lower: str, agent_socket: Path) -> Path:
    """A wrapper that starts Python for every verb (what the shell fast path avoids)."""
    code = (
        f"import sys;sys.path.insert(0,{str(package_root())!r});from spotgpu.runtime.wrapper import main;"
        f"sys.exit(main(lower={lower!r},agent_socket={str(agent_socket)!r}))"
    )
    script = dest / "python-every-verb"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S -c "{code}" "$@"\n')
    script.chmod(0o755)
    return script


@dataclass(frozen=True, slots=True)
class _Node:
    """The node the benchmark's containers run on: the runtime's configuration, the owner of
    the stand-in GPU, the kubelet's view and the ``local`` fallback's configuration file."""

    lower: str
    gpu: Path
    config: RuntimeConfig
    cache: MappingCache
    pods: list[PodResources]
    local_config: Path


def _node(base: Path) -> _Node:
    gpu = base / "dev" / "nvidia0"
    gpu.parent.mkdir(parents=True)
    os.mknod(gpu, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    plugin_dir = base / "device-plugins"
    lower = resolve_lower("runc")
    config = RuntimeConfig(
        lower_runtime=lower,
        agent_socket=base / "agent.sock",
        device_plugin_dir=plugin_dir,
        pod_resources_socket=base / "pod-resources" / "kubelet.sock",
        guard_listener_path=base / "guard.sock",
        owner_state_file=base / "owners.json",
    )
    cache = MappingCache()
    cache.create(OWNER, ["GPU-a"])
    write_owner_state(config.owner_state_file, cache.snapshot())
    pods = [
        PodResources(
            "bench", "dev-box", (ContainerResources("main", (ContainerDevices("nvidia.com/gpu", ("GPU-a",), (0,)),)),)
        ),
        PodResources(
            "bench",
            "spot-job",
            (ContainerResources("worker", (ContainerDevices("platform/spot-gpu", ("spot-GPU-a",), (0,)),)),),
        ),
    ]
    local_config = base / "local.yaml"
    local_config.write_text(
        "runtime:\n"
        f"  agentSocket: {base / 'no-agent.sock'}\n  fallback: local\n  lowerRuntime: {lower}\n"
        f"  devicePluginDir: {plugin_dir}\n  podResourcesSocket: {config.pod_resources_socket}\n"
        f"  ownerStateFile: {config.owner_state_file}\n  guardListenerPath: {base / 'guard.sock'}\n"
    )
    return _Node(lower, gpu, config, cache, pods, local_config)


def _variants(base: Path, node: _Node, bench: _Bench, extra: bool) -> tuple[dict[str, Callable[[], float]], str]:
    """Each variant's one sample (ms), and the shell fast path's script."""
    from spotgpu.runtime.config import load_runtime_config

    lower, config = node.lower, node.config
    shim = str(install_shim(base / "shim", config))
    local = str(
        install_shim(base / "shim-local", load_runtime_config(node.local_config), config_path=node.local_config)
    )
    every = str(_python_every_verb(base, lower, config.agent_socket))
    spot = _spot_annotations()
    env_only = {k: v for k, v in spot.items() if k != keys.DEVICES_FROM_PREFIX}
    env_only[keys.CONTAINER_ENV_PREFIX] = json.dumps({"BENCH": "1"})
    variants: dict[str, Callable[[], float]] = {
        "plain": lambda: bench.ctr_run(lower, {}),
        "passthrough": lambda: bench.ctr_run(shim, {}),
        "sync": lambda: bench.ctr_run(shim, spot),
        "kill_plain": lambda: bench.kill_ms(lower),
        "kill_shim": lambda: bench.kill_ms(shim),
        "plain_no_option": lambda: bench.ctr_run(None, {}),
    }
    if extra:
        variants["sync_local"] = lambda: bench.ctr_run(local, env_only)
        variants["python_every_verb"] = lambda: bench.ctr_run(every, {})
    return variants, shim


def _sample(variants: dict[str, Callable[[], float]], runs: int, warmup: int) -> dict[str, list[float]]:
    """Every variant once per round, the round's order rotated; warm-up rounds are dropped."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(warmup + runs):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            value = variants[name]()
            if round_ >= warmup:
                samples[name].append(value)
    return samples


def measure(base: Path, runs: int, warmup: int, extra: bool) -> dict[str, Any]:
    node = _node(base)
    config = node.config
    with (
        PodResourcesDouble(config.pod_resources_socket) as pod_resources,
        VendorPluginDouble(
            config.device_plugin_dir, "nvidia.com/gpu", [VendorDevice("GPU-a", str(node.gpu), "/dev/nvidia0", 0)]
        ),
        Containerd(base / "containerd") as daemon,
    ):
        pod_resources.set_pods(node.pods)
        lookup = KubeletNodeLookup.from_config(config, node.cache.get_device_owner, lendable=lambda d: d == "GPU-a")
        try:
            with RuntimeService(config.agent_socket, SpecEngine(config, lookup, LinuxHost())):
                bench = _Bench(base, daemon)
                variants, shim = _variants(base, node, bench, extra)
                samples = _sample(variants, runs, warmup)
                per_call = per_call_added_ms(shim, node.lower)
                bench.channel.close()
        finally:
            lookup.close()
    return _result(samples, per_call, runs, extra)


def _result(samples: dict[str, list[float]], per_call: float, runs: int, extra: bool) -> dict[str, Any]:
    medians = {name: median_ms(values) for name, values in samples.items()}

    def added(name: str, base: str = "plain") -> float:
        """Median of the per-round differences (paired: drift within a round cancels)."""
        return median_ms([a - b for a, b in zip(samples[name], samples[base], strict=True)])

    result: dict[str, Any] = {
        "plain_ms_median": medians["plain"],
        "passthrough_added_ms": added("passthrough"),
        "sync_added_ms": added("sync"),
        "kill_added_ms": added("kill_shim", "kill_plain"),
        "kill_plain_ms_median": medians["kill_plain"],
        "plain_no_option_ms_median": medians["plain_no_option"],
        "shim_per_call_added_ms": per_call,
        "runs": runs,
        "targets": TARGETS,
        "medians_ms": medians,
        "iqr_ms": {name: iqr_ms(values) for name, values in samples.items()},
        "load_average_1m": round(os.getloadavg()[0], 2),
        "niceness": os.nice(0),
    }
    if extra:
        result["sync_local_added_ms"] = added("sync_local")
        result["python_every_verb_added_ms"] = added("python_every_verb")
    result["meets_targets"] = {k: result[k] <= v for k, v in TARGETS.items()}
    return result


def run(args: argparse.Namespace) -> int:
    if args.cri:
        from spotgpu.bench import runtime_cri

        return runtime_cri.run(args)
    missing = [p for p in ("runc", "containerd", "ctr") if shutil.which(p) is None]
    if os.geteuid() != 0 or missing or not Path("/bin/busybox").exists():
        print(
            f"spotgpu bench runtime: needs root, runc, containerd, ctr and /bin/busybox (missing: {missing})",
            file=sys.stderr,
        )
        return 2
    if args.nice:
        os.nice(args.nice)
    base = Path(tempfile.mkdtemp(prefix="spotgpu-bench-runtime-"))
    before = env.load_average()
    try:
        with env.background_load(args.background_load):
            result = measure(base, args.runs, args.warmup, not args.no_extra)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result["environment"] = env.environment(
        background_load=args.background_load,
        load_before=before,
        load_after=env.load_average(),
        containerd_binaries=args.containerd_binary,
        note=f"niceness {os.nice(0)}",
    )
    print(json.dumps(result, sort_keys=True) if args.json else json.dumps(result, indent=2, sort_keys=True))
    return 0


__all__ = ["TARGETS", "add_arguments", "iqr_ms", "measure", "median_ms", "run"]
