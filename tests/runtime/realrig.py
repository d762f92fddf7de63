"""The real-runc rig of the runtime tests: spotgpu-runtime's installed shell fast path as the OCI
runtime, the runtime service in the test process (as the agent hosts it) on real gRPC clients.

No kubelet and no GPU can run here, so the kubelet's pod-resources API and an NVIDIA-like device
plugin are the protocol-level doubles of :mod:`spotgpu.testing.kubelet` (real gRPC on unix
sockets), and the GPUs are harmless stand-ins: character devices with /dev/null's (1, 3) and
/dev/zero's (1, 5) numbers that the plugin exposes as ``/dev/nvidia0`` and ``/dev/nvidia1``. The
agent's answers (owners, whether a GPU is lent now) come from a MappingCache and a dict the test
sets. ``lower`` may name a stand-in of another lower runtime (the env attack's
nvidia-container-runtime stand-in).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotgpu.core import keys
from spotgpu.core.ids import DeviceID
from spotgpu.core.mapping_cache import MappingCache
from spotgpu.core.refs import ContainerRef
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.engine import SpecEngine
from spotgpu.runtime.node import KubeletNodeLookup, LinuxHost
from spotgpu.runtime.service import RuntimeService
from spotgpu.runtime.shim import install_shim
from spotgpu.testing.containerd import make_bundle, make_rootfs
from spotgpu.testing.listener import RecordingListener as GuardListener
from spotgpu.testing.podresources import PodResources, PodResourcesDouble
from spotgpu.testing.vendorplugin import VendorDevice, VendorPluginDouble

from .fakes import cri, devices_from, kubelet_pods

OWNER = ContainerRef("team-a", "dev-box", "main")
SPOT = ContainerRef("team-a", "spot-job", "worker")
PROBE = (
    "ls -l /dev/nvidia0; head -c 1 /dev/nvidia0 && echo OPEN-OK; "
    "cat /usr/local/nvidia/lib/libfake.txt; echo VISIBLE=$NVIDIA_VISIBLE_DEVICES"
)


@dataclass
class Rig:
    root: Path
    shim: Path
    rootfs: Path
    calls: Path
    pod_resources: PodResourcesDouble
    cache: MappingCache
    listener_path: Path
    lent: dict[str, bool] = field(default_factory=dict)
    """The agent's lend answer per real device (a device missing here: the agent cannot say)."""
    config: RuntimeConfig | None = None
    extra: list[Any] = field(default_factory=list)

    def bundle(
        self, name: str, annotations: dict[str, str], script: str = PROBE, env: tuple[str, ...] = ("PATH=/bin",)
    ) -> Path:
        bundle = self.root / "bundles" / name
        make_bundle(bundle, self.rootfs, ["sh", "-c", script], env=env, annotations=annotations)
        return bundle


def stand_in_gpus(tmp_path: Path) -> tuple[Path, Path]:
    """Two character devices with /dev/null's and /dev/zero's numbers (readable, harmless)."""
    (tmp_path / "dev").mkdir(exist_ok=True)
    nodes = []
    for name, minor in (("nvidia0", 3), ("nvidia1", 5)):
        node = tmp_path / "dev" / name
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        nodes.append(node)
    return nodes[0], nodes[1]


@contextlib.contextmanager
def real_rig(
    tmp_path: Path,
    *,
    devices: Sequence[tuple[str, str]] | None = None,
    owners: Sequence[tuple[ContainerRef, Sequence[str]]] = ((OWNER, ("GPU-a", "GPU-b")),),
    pods: Sequence[PodResources] | None = None,
    lent: dict[str, bool] | None = None,
    lower: Path | None = None,
    **config: Any,
) -> Iterator[Rig]:
    """The rig; ``devices``: ``(id, which stand-in: "nvidia0" or "nvidia1")`` (default GPU-a on
    nvidia0, GPU-b on /dev/zero itself); ``owners`` seed the MappingCache; ``lent`` the lend answers
    (default: every owner's device lent)."""
    gpu0, gpu1 = stand_in_gpus(tmp_path)
    driver = tmp_path / "driver"
    (driver / "lib").mkdir(parents=True)
    (driver / "lib" / "libfake.txt").write_text("FAKE-DRIVER-LIB\n")
    plugin_dir = tmp_path / "device-plugins"
    calls = tmp_path / "lower-calls"
    if lower is None:
        lower = tmp_path / "lower-runc"
        lower.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec runc "$@"\n')
        lower.chmod(0o755)
    listener_path = tmp_path / "guard.sock"
    settings: dict[str, Any] = {
        "lower_runtime": str(lower),
        "agent_socket": tmp_path / "agent.sock",
        "device_plugin_dir": plugin_dir,
        "pod_resources_socket": tmp_path / "pod-resources" / "kubelet.sock",
        "guard_listener_path": listener_path,
        **config,
    }
    runtime_config = RuntimeConfig(**settings)
    cache = MappingCache()
    for owner, held in owners:
        cache.create(owner, list(held))
    answers = dict(lent) if lent is not None else {d: True for _, held in owners for d in held}
    nodes = {"nvidia0": str(gpu0), "nvidia1": str(gpu1)}
    vendor = (
        [VendorDevice(i, nodes[n], f"/dev/{n}", 0) for i, n in devices]
        if devices is not None
        else [
            VendorDevice("GPU-a", str(gpu0), "/dev/nvidia0", 0),
            VendorDevice("GPU-b", "/dev/zero", "/dev/nvidia1", 0),
        ]
    )
    with (
        PodResourcesDouble(runtime_config.pod_resources_socket) as pod_resources,
        VendorPluginDouble(plugin_dir, "nvidia.com/gpu", vendor, mounts=[("/usr/local/nvidia", str(driver), True)]),
    ):
        pod_resources.set_pods(list(pods) if pods is not None else kubelet_pods())

        def lendable(device: DeviceID) -> bool | None:
            return answers.get(device)

        lookup = KubeletNodeLookup.from_config(runtime_config, cache.get_device_owner, lendable=lendable)
        try:
            with RuntimeService(runtime_config.agent_socket, SpecEngine(runtime_config, lookup, LinuxHost())):
                shim = install_shim(tmp_path / "shim", runtime_config)
                rig = Rig(tmp_path, shim, make_rootfs(tmp_path / "rootfs"), calls, pod_resources, cache, listener_path)
                rig.lent, rig.config = answers, runtime_config
                yield rig
        finally:
            lookup.close()


def spot_annotations(sources: dict[str, dict[str, list[str]]], target: ContainerRef = SPOT) -> dict[str, str]:
    return {**cri(target), keys.DEVICES_FROM_PREFIX: devices_from(sources)}


def runc_run(rig: Rig, bundle: Path, container_id: str) -> tuple[int, str]:
    """``create`` through the shim (as the shim would), then runc ``start``; the container's output."""
    state_root, out_path = rig.root / "runc-root", bundle / "out.txt"
    log = bundle / "log.json"
    try:
        with out_path.open("w") as out:
            created = subprocess.run(
                [str(rig.shim), "--root", str(state_root), "--log", str(log), "--log-format", "json", "create",
                 "--bundle", str(bundle), "--pid-file", str(bundle / "init.pid"), container_id],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=60, check=False,
            )  # fmt: skip
        if created.returncode != 0:
            return created.returncode, out_path.read_text()
        subprocess.run(["runc", "--root", str(state_root), "start", container_id], check=True, timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            state = subprocess.run(
                ["runc", "--root", str(state_root), "state", container_id], capture_output=True, text=True, check=False
            )
            if state.returncode != 0 or json.loads(state.stdout)["status"] == "stopped":
                break
            time.sleep(0.05)
        return 0, out_path.read_text()
    finally:
        subprocess.run(
            ["runc", "--root", str(state_root), "delete", "--force", container_id], capture_output=True, check=False
        )


def unique(name: str) -> str:
    """A container ID no concurrent test run uses: containerd's shim keeps runc state in the
    global /run/containerd/runc/<namespace>, even for a private containerd."""
    return f"{name}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


__all__ = [
    "OWNER",
    "PROBE",
    "SPOT",
    "GuardListener",
    "Rig",
    "real_rig",
    "runc_run",
    "spot_annotations",
    "stand_in_gpus",
    "unique",
]
