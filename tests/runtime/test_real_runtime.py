"""spotgpu-runtime with real runc and a real containerd (root).

The installed shell fast path runs as the OCI runtime; the runtime service runs in this test
process (as the agent would host it) on real gRPC clients (the rig: :mod:`.realrig`). No kubelet
and no GPU can run here, so the kubelet's pod-resources API and an NVIDIA-like device plugin are
the protocol-level doubles of :mod:`spotgpu.testing.kubelet`, and the GPU is a harmless stand-in
(a character device with /dev/null's numbers that the plugin exposes as ``/dev/nvidia0``).
containerd is a private instance (root, state and socket under tmp_path) that runs our script
through ``ctr run --runc-binary``. The attacks on this path are in :mod:`.test_real_attacks`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotgpu.core import keys
from spotgpu.testing.containerd import Containerd

from .fakes import cri
from .realrig import OWNER, PROBE, GuardListener, Rig, real_rig, runc_run, spot_annotations, unique

pytestmark = pytest.mark.root


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with real_rig(tmp_path) as rig:
        yield rig


# --- real runc --------------------------------------------------------------------------------------


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
