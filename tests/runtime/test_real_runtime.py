"""spotgpu-runtime with real runc and a real containerd (root).

The installed shell fast path runs as the OCI runtime; the runtime service runs in this test
process (as the agent would host it) on real gRPC clients. No kubelet and no GPU can run here,
so the kubelet's pod-resources API and an NVIDIA-like device plugin are the protocol-level
doubles of :mod:`spotgpu.testing.kubelet` (real gRPC on unix sockets), and the GPU is a
harmless stand-in: a character device with /dev/null's numbers (1, 3) that the plugin exposes
as ``/dev/nvidia0``. containerd is a private instance (root, state and socket under tmp_path)
that runs our script through ``ctr run --runc-binary``.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from spotgpu.core import keys
from spotgpu.core.mapping_cache import MappingCache
from spotgpu.core.refs import ContainerRef
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.engine import SpecEngine
from spotgpu.runtime.node import KubeletNodeLookup, LinuxHost
from spotgpu.runtime.service import RuntimeService
from spotgpu.runtime.shim import install_shim
from spotgpu.testing.containerd import Containerd, make_bundle, make_rootfs
from spotgpu.testing.kubelet import (
    PodResourcesDouble,
    VendorDevice,
    VendorPluginDouble,
)
from spotgpu.testing.listener import RecordingListener as GuardListener

from .fakes import cri, devices_from, kubelet_pods

pytestmark = pytest.mark.root

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
    extra: list[Any] = field(default_factory=list)

    def bundle(
        self, name: str, annotations: dict[str, str], script: str = PROBE, env: tuple[str, ...] = ("PATH=/bin",)
    ) -> Path:
        bundle = self.root / "bundles" / name
        make_bundle(bundle, self.rootfs, ["sh", "-c", script], env=env, annotations=annotations)
        return bundle


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    # A stand-in GPU (/dev/null's numbers) and a "driver" directory the plugin mounts.
    gpu = tmp_path / "dev" / "nvidia0"
    gpu.parent.mkdir()
    os.mknod(gpu, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    driver = tmp_path / "driver"
    (driver / "lib").mkdir(parents=True)
    (driver / "lib" / "libfake.txt").write_text("FAKE-DRIVER-LIB\n")
    plugin_dir = tmp_path / "device-plugins"
    calls = tmp_path / "lower-calls"
    lower = tmp_path / "lower-runc"
    lower.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec runc "$@"\n')
    lower.chmod(0o755)
    listener_path = tmp_path / "guard.sock"
    config = RuntimeConfig(
        lower_runtime=str(lower),
        agent_socket=tmp_path / "agent.sock",
        device_plugin_dir=plugin_dir,
        pod_resources_socket=tmp_path / "pod-resources" / "kubelet.sock",
        guard_listener_path=listener_path,
    )
    cache = MappingCache()
    cache.create(OWNER, ["GPU-a", "GPU-b"])
    with (
        PodResourcesDouble(config.pod_resources_socket) as pod_resources,
        VendorPluginDouble(
            plugin_dir,
            "nvidia.com/gpu",
            [VendorDevice("GPU-a", str(gpu), "/dev/nvidia0", 0), VendorDevice("GPU-b", "/dev/zero", "/dev/nvidia1", 0)],
            mounts=[("/usr/local/nvidia", str(driver), True)],
        ),
    ):
        pod_resources.set_pods(kubelet_pods())
        lookup = KubeletNodeLookup.from_config(config, cache.get_device_owner)
        try:
            with RuntimeService(config.agent_socket, SpecEngine(config, lookup, LinuxHost())):
                shim = install_shim(tmp_path / "shim", config)
                yield Rig(tmp_path, shim, make_rootfs(tmp_path / "rootfs"), calls, pod_resources, cache, listener_path)
        finally:
            lookup.close()


def spot_annotations(sources: dict[str, dict[str, list[str]]]) -> dict[str, str]:
    return {**cri(SPOT), keys.DEVICES_FROM_PREFIX: devices_from(sources)}


# --- real runc --------------------------------------------------------------------------------------


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


def test_runc_container_sees_the_synced_device_env_and_mounts(rig: Rig) -> None:
    bundle = rig.bundle("spot", spot_annotations({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}))
    code, out = runc_run(rig, bundle, unique("spot"))
    assert code == 0, out
    assert "1,   3" in out and "/dev/nvidia0" in out  # the node has /dev/null's numbers
    assert "OPEN-OK" in out  # the cgroup allow rule admits it
    assert "FAKE-DRIVER-LIB" in out and "VISIBLE=GPU-a" in out
    spec = json.loads((bundle / "config.json").read_text())
    assert json.loads(spec["annotations"][keys.SYNCED_DEVICES]) == {"nvidia.com/gpu": ["GPU-a"]}
    assert "create" in rig.calls.read_text() and "start" not in rig.calls.read_text()  # start went to runc directly


def test_a_refused_sync_leaves_the_spec_byte_identical_and_never_calls_runc(rig: Rig) -> None:
    bundle = rig.bundle("thief", spot_annotations({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-b"]}}))
    before = (bundle / "config.json").read_bytes()
    code, out = runc_run(rig, bundle, unique("thief"))
    assert code != 0
    assert (bundle / "config.json").read_bytes() == before
    assert not rig.calls.exists()  # the lower runtime never ran
    assert "twin-not-allocated" in out
    error = json.loads((bundle / "log.json").read_text().splitlines()[-1])
    assert error["level"] == "error" and "spot-GPU-b" in error["msg"]


def test_runc_owner_gets_the_guard_rule_and_runc_hands_the_listener_a_notify_fd(rig: Rig) -> None:
    listener = GuardListener(rig.listener_path)
    try:
        bundle = rig.bundle(
            "owner", cri(OWNER), script="echo OWNER-RAN", env=("PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b")
        )
        code, out = runc_run(rig, bundle, unique("owner"))
        assert code == 0 and "OWNER-RAN" in out, out
        spec = json.loads((bundle / "config.json").read_text())
        assert spec["annotations"][keys.GUARDED] == OWNER.format()
        deadline = time.monotonic() + 5
        while not listener.states and time.monotonic() < deadline:
            time.sleep(0.02)
        (state,) = listener.states
        assert state["fds"] == ["seccompFd"] and OWNER.format() in state["metadata"]
    finally:
        listener.close()


# --- real containerd -------------------------------------------------------------------------------


@pytest.fixture
def containerd(tmp_path: Path) -> Iterator[Containerd]:
    with Containerd(tmp_path / "containerd") as daemon:
        yield daemon


def ctr_run(daemon: Containerd, rig: Rig, container_id: str, annotations: dict[str, str]) -> Any:
    args = ["run", "--rm", "--runtime", "io.containerd.runc.v2", "--runc-binary", str(rig.shim), "--env", "PATH=/bin"]
    for key, value in annotations.items():
        args += ["--annotation", f"{key}={value}"]
    return daemon.ctr(*args, "--rootfs", str(rig.rootfs), container_id, "sh", "-c", PROBE, check=False, timeout=120)


def test_containerd_runs_a_synced_spot_container_through_the_runtime(rig: Rig, containerd: Containerd) -> None:
    proc = ctr_run(containerd, rig, unique("spot"), spot_annotations({"_/dev-box": {"nvidia.com/gpu": ["GPU-a"]}}))
    assert proc.returncode == 0, proc.stderr
    assert "1,   3" in proc.stdout and "OPEN-OK" in proc.stdout
    assert "FAKE-DRIVER-LIB" in proc.stdout and "VISIBLE=GPU-a" in proc.stdout
    verbs = [_verb(line) for line in rig.calls.read_text().splitlines()]
    assert verbs[:2] == ["create", "start"] and "delete" in verbs  # every verb reached runc


def test_containerd_surfaces_a_refusal(rig: Rig, containerd: Containerd) -> None:
    rig.pod_resources.set_pods([])  # the kubelet knows no such pods: nothing was granted
    proc = ctr_run(
        containerd, rig, unique("refused"), spot_annotations({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}})
    )
    assert proc.returncode != 0
    assert "OCI runtime create failed" in proc.stderr and "spotgpu-runtime" in proc.stderr
    assert "source-not-found" in proc.stderr
    calls = rig.calls.read_text().splitlines() if rig.calls.exists() else []
    assert "create" not in [_verb(c) for c in calls]  # runc never created it (the shim's cleanup may delete)


def test_containerd_kill_goes_through_the_fast_path(rig: Rig, containerd: Containerd) -> None:
    sleeper = unique("sleeper")
    containerd.run_detached(sleeper, rig.rootfs, ["sleep", "60"], runc_binary=str(rig.shim))
    assert sleeper in containerd.task_pids()
    containerd.ctr("tasks", "kill", "-s", "SIGKILL", sleeper)
    deadline = time.monotonic() + 10
    while sleeper in containerd.task_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleeper not in containerd.task_pids()
    assert f"kill {sleeper} 9" in rig.calls.read_text()  # the same arguments reached runc


def _verb(line: str) -> str:
    """The runc verb of a logged command line (after the global flags)."""
    from spotgpu.runtime.argv import parse

    return parse(line.split()).command or ""


def unique(name: str) -> str:
    """A container ID no concurrent test run uses: containerd's shim keeps runc state in the
    global /run/containerd/runc/<namespace>, even for a private containerd."""
    return f"{name}-{os.getpid()}-{time.monotonic_ns() % 10**9}"
