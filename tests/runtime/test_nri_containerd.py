"""NRI mode against real containerd 2.2.7 and runc (root): what only the real runtime can show.

* the plugin re-registers when containerd restarts, and Synchronize tells it what exists;
* an adjustment larger than one 4096-byte frame arrives whole;
* an owner with containerd's RuntimeDefault profile (which containerd 2.2.7 does not show NRI)
  keeps that profile and is created unguarded with the reason, and containerd survives;
* a CPU pod's device selector (``NVIDIA_VISIBLE_DEVICES=all``, or a legacy CUDA image without
  it) arrives in config.json as ``NVIDIA_VISIBLE_DEVICES=void`` (containerd ignores env removals);
* the create/start race: a spot container created while lent whose owner returns before its
  StartContainer is refused at the start and its process never runs; one still lent starts;
* no plugin connected: NRI's default validator (the shipped nri-v3.toml) refuses every create,
  except for pods with the toleration annotation; with the validator off, NRI fails open;
* the limit that stays: when the plugin process dies in the middle of a CreateContainer,
  containerd creates that container without our adjustment, validator or not (the plugin was
  registered when the create began). An owner created so has no guard rule (the guard never
  gets its notify fd, so the agent never lends it) and a spot container has no device: both
  are checked here;
* CDI: a vendor plugin that answers Allocate with CDI names only (containerd resolves them for
  the owner); a spot container's sync of such devices is injected through the NRI adjustment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spotgpu.adapters.proto import cri_runtime_v1_pb2 as cri_pb
from spotgpu.core import keys
from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE
from spotgpu.core.refs import ContainerRef
from spotgpu.runtime.ownerstate import write_owner_state
from spotgpu.testing.cri import ContainerSpec, CriError, RunningPod
from spotgpu.testing.cri_rig import CriRig
from spotgpu.testing.listener import RecordingListener

pytestmark = pytest.mark.root

OWNER = ContainerRef("team-a", "dev-box", "main")


@pytest.fixture(scope="module")
def rig(
    tmp_path_factory: pytest.TempPathFactory, cri_images: list[Path], containerd_binaries: Callable[[str], Any]
) -> Iterator[tuple[CriRig, RecordingListener]]:
    node = CriRig(Path(tmp_path_factory.mktemp("nri")), containerd_binaries("2.2"), "nri", cri_images, gpus=3)
    listener = RecordingListener(node.listener)
    try:
        node.start()
        node.owner(OWNER, ["GPU-0", "GPU-1"])
        yield node, listener
    finally:
        node.stop()
        listener.close()


def test_the_plugin_registers_again_after_containerd_restarts(rig: tuple[CriRig, RecordingListener]) -> None:
    node, _ = rig
    plugin = node.service.plugin
    sessions = plugin.sessions
    node.containerd.pause()  # SIGKILL: shims and containers keep running
    node.containerd.start()
    deadline = time.monotonic() + 20
    while plugin.sessions == sessions and time.monotonic() < deadline:
        time.sleep(0.05)
    assert plugin.wait_synchronized(10) and plugin.sessions == sessions + 1
    assert node.service.runtime.synchronized["guarded"] >= 1  # Synchronize showed the guarded owner
    assert node.cri is not None
    pod = node.pod(ContainerRef("team-a", "after-restart", "worker"))
    cid = node.cri.run_container(pod, ContainerSpec("worker", resources={SPOT_GPU_RESOURCE: 1}))
    assert any(d["path"].startswith("/dev/nvidia") for d in node.bundle_spec(cid)["linux"]["devices"])
    node.cri.delete_pod(pod)


def test_an_adjustment_larger_than_a_frame_arrives_whole(rig: tuple[CriRig, RecordingListener]) -> None:
    node, _ = rig
    assert node.cri is not None
    env = {f"SPOTGPU_TEST_VARIABLE_{i:03d}": "v" * 40 for i in range(200)}  # ~14 KB of adjustment
    pod = node.pod(
        ContainerRef("team-a", "big-env", "worker"), annotations={keys.CONTAINER_ENV_PREFIX: json.dumps(env)}
    )
    cid = node.cri.run_container(pod, ContainerSpec("worker"))
    got = node.bundle_spec(cid)["process"]["env"]
    assert sum(e.startswith("SPOTGPU_TEST_VARIABLE_") for e in got) == 200
    node.cri.delete_pod(pod)


def test_a_runtime_default_owner_keeps_its_profile_and_is_unguarded(rig: tuple[CriRig, RecordingListener]) -> None:
    """containerd 2.2.7 sends NRI only the profile's type for RuntimeDefault, not the policy:
    composing the guard's rule into "no policy" would replace the owner's RuntimeDefault with an
    allow-all profile. The owner must keep containerd's profile and be created unguarded."""
    node, listener = rig
    owner = ContainerRef("team-b", "secure-box", "main")
    _, cid = node.owner(owner, ["GPU-2"], seccomp="RuntimeDefault")
    spec = node.bundle_spec(cid)
    assert spec["annotations"][keys.GUARD_SKIPPED].startswith("conflict: NRI mode cannot install the rule")
    seccomp = spec["linux"]["seccomp"]
    assert seccomp["defaultAction"] == "SCMP_ACT_ERRNO" and "listenerPath" not in seccomp  # containerd's own
    assert any(s.get("errnoRet") == 38 and s["names"] == ["clone3"] for s in seccomp["syscalls"])
    assert listener.wait_for(owner.format(), timeout=0.5) is None
    assert node.containerd.running  # we never sent errno_ret: containerd did not crash


SELECTOR = {"NVIDIA_VISIBLE_DEVICES": "all", "KEEP": "1"}
"""A CPU pod's env as a CUDA base image sets it: with nvidia-container-runtime as the handler,
``all`` would give the pod every GPU of the node."""


def env_of(spec: dict[str, Any]) -> list[str]:
    return [str(e) for e in spec["process"]["env"]]


@pytest.mark.parametrize("env", [SELECTOR, {"CUDA_VERSION": "11.0.3", "KEEP": "1"}], ids=["all", "legacy-unset"])
def test_a_cpu_pods_device_selector_is_neutralized_in_the_config_runc_runs(
    rig: tuple[CriRig, RecordingListener], env: dict[str, str]
) -> None:
    """Attack: a CPU pod whose image env selects every GPU (``all``, or a legacy CUDA image
    without the variable). containerd 2.2.7 ignores an NRI env removal, so the plugin sends the
    neutral value instead: config.json selects no GPU."""
    node, _ = rig
    assert node.cri is not None
    pod = node.pod(ContainerRef("team-a", "cpu-selector", "worker"))
    cid = node.cri.run_container(pod, ContainerSpec("worker", env=env))
    got = env_of(node.bundle_spec(cid))
    assert [e for e in got if e.startswith("NVIDIA_VISIBLE_DEVICES")] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert "KEEP=1" in got
    node.cri.delete_pod(pod)


# --- StartContainer: the lend rule asked again ------------------------------------------------------


def spot_created_while_lent(node: CriRig, name: str, marker: Path) -> tuple[RunningPod, str]:
    """A spot container created (not started) while its GPU is lent; its process would write
    ``marker`` (a host folder mounted at /out) the moment it runs."""
    assert node.cri is not None
    marker.parent.mkdir(parents=True, exist_ok=True)
    pod = node.pod(ContainerRef("team-a", name, "worker"))
    spec = ContainerSpec(
        "worker",
        args=("sh", "-c", "echo ran > /out/ran; sleep 1000000"),
        resources={SPOT_GPU_RESOURCE: 1},
        mounts=[("/out", str(marker.parent), False)],
    )
    cid = node.cri.create_container(pod, spec)
    assert keys.SYNCED_DEVICES in node.cri.runtime_spec(cid)["annotations"]
    return pod, cid


def test_a_spot_container_whose_owner_returned_before_its_start_never_runs(
    rig: tuple[CriRig, RecordingListener], tmp_path: Path
) -> None:
    """Attack (the create/start race): the spot container is created while its GPU is lent; the
    owner comes back before the kubelet's StartContainer (the eviction found no task to kill).
    The plugin asks the lend rule again at StartContainer: the start fails, no process runs."""
    node, _ = rig
    assert node.cri is not None
    pod, cid = spot_created_while_lent(node, "late-start", tmp_path / "out" / "ran")
    node.lent.update(dict.fromkeys(node.gpu_ids, False))  # the owner is back
    try:
        with pytest.raises(CriError) as refused:
            node.cri.start_container(cid)
        assert "start refused" in refused.value.details and "is not lent out now" in refused.value.details
        state = node.cri.status(cid).status.state
        assert state != cri_pb.CONTAINER_RUNNING
        time.sleep(0.5)
        assert not (tmp_path / "out" / "ran").exists()  # its process never ran
    finally:
        node.lent.clear()
        node.cri.delete_pod(pod)


def test_a_spot_container_still_lent_at_its_start_runs(rig: tuple[CriRig, RecordingListener], tmp_path: Path) -> None:
    """The control case: created and started while lent, the process runs."""
    node, _ = rig
    assert node.cri is not None
    pod, cid = spot_created_while_lent(node, "on-time-start", tmp_path / "out" / "ran")
    try:
        node.cri.start_container(cid)
        deadline = time.monotonic() + 10
        while not (tmp_path / "out" / "ran").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "out" / "ran").read_text() == "ran\n"
    finally:
        node.cri.delete_pod(pod)


# --- the limit: the plugin killed mid-create (the validator saw it registered) ----------------------


class PluginProcess:
    """tests/runtime/nri_plugin_proc.py as a child process, serving the rig's NRI socket."""

    def __init__(self, node: CriRig) -> None:
        settings = node.base / "plugin-proc.json"
        owners = node.base / "owners.json"
        write_owner_state(owners, node.cache.snapshot())
        settings.write_text(
            json.dumps(
                {
                    "nri_socket": str(node.containerd.nri_socket),
                    "device_plugin_dir": str(node.config.device_plugin_dir),
                    "pod_resources_socket": str(node.config.pod_resources_socket),
                    "device_plugin_sockets": dict(node.config.device_plugin_sockets),
                    "listener": str(node.listener),
                    "owner_state": str(owners),
                }
            )
        )
        script = Path(__file__).with_name("nri_plugin_proc.py")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(settings)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "synchronized" in line, line

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture(scope="module")
def bare(
    tmp_path_factory: pytest.TempPathFactory, cri_images: list[Path], containerd_binaries: Callable[[str], Any]
) -> Iterator[CriRig]:
    """NRI on in containerd with the shipped default validator, no plugin in this process: each
    test that needs one runs it as a child."""
    base = Path(tmp_path_factory.mktemp("nri-bare"))
    node = CriRig(base, containerd_binaries("2.2"), "nri", cri_images, host_plugin=False)
    try:
        yield node.start()
    finally:
        node.stop()


def killed_mid_create(node: CriRig, create: Callable[[], str]) -> str:
    """Run ``create`` while the plugin process waits on a slow kubelet; SIGKILL the plugin then."""
    plugin = PluginProcess(node)
    asked = threading.Event()
    original = node.pod_resources.pods

    def slow() -> Any:
        asked.set()
        time.sleep(5)
        return original()

    node.pod_resources.pods = slow  # type: ignore[method-assign]
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(cid=create()), daemon=True)
    try:
        thread.start()
        assert asked.wait(10), "the plugin never asked the kubelet"
        plugin.kill()
        thread.join(30)
    finally:
        node.pod_resources.pods = original  # type: ignore[method-assign]
        plugin.kill()
    assert "cid" in result, "CreateContainer did not return"
    return str(result["cid"])


def test_an_owner_created_while_the_plugin_dies_is_unguarded(bare: CriRig) -> None:
    listener = RecordingListener(bare.listener)
    try:
        pod = bare.pod(OWNER)
        bare.cache.create(OWNER, ["GPU-0", "GPU-1"])
        assert bare.cri is not None
        spec_of_owner = ContainerSpec(OWNER.name, devices={NVIDIA_GPU_RESOURCE: ["GPU-0", "GPU-1"]})
        cid = killed_mid_create(bare, lambda: bare.cri.create_container(pod, spec_of_owner))  # type: ignore[union-attr]
        bare.cri.start_container(cid)
        spec = bare.bundle_spec(cid)
        assert "seccomp" not in spec["linux"]  # created without our adjustment: no guard rule,
        assert keys.GUARDED not in spec.get("annotations", {})
        assert listener.wait_for(OWNER.format(), timeout=1.0) is None  # and no notify fd for the guard
        bare.cri.delete_pod(pod)
        bare.cache.delete(OWNER)
    finally:
        listener.close()


def test_a_spot_container_created_while_the_plugin_dies_has_no_device(bare: CriRig) -> None:
    assert bare.cri is not None
    bare.cache.create(OWNER, ["GPU-0", "GPU-1"])
    pod = bare.pod(ContainerRef("team-a", "spot-orphan", "worker"))
    try:
        spot = ContainerSpec("worker", resources={SPOT_GPU_RESOURCE: 1})
        cid = killed_mid_create(bare, lambda: bare.cri.create_container(pod, spot))  # type: ignore[union-attr]
        bare.cri.start_container(cid)
        spec = bare.bundle_spec(cid)
        assert not [d for d in spec["linux"].get("devices", []) if d["path"].startswith("/dev/nvidia")]
        assert keys.SYNCED_DEVICES not in spec.get("annotations", {})
        probe = bare.cri.exec_sync(cid, ["sh", "-c", "ls /dev/nvidia0"])
        assert probe.exit_code != 0  # simply no GPU
    finally:
        bare.cri.delete_pod(pod)
        bare.cache.delete(OWNER)


# --- no plugin connected: NRI's default validator ------------------------------------------------


def test_without_the_plugin_no_container_is_created(bare: CriRig) -> None:
    """Attack: the agent is down and a CPU pod whose image selects every GPU is created. The
    shipped nri-v3.toml makes NRI's default validator require the ``spotgpu`` plugin: the
    create fails, nothing reaches runc."""
    assert bare.cri is not None
    pod = bare.pod(ContainerRef("team-a", "agent-down", "worker"))
    try:
        with pytest.raises(CriError) as refused:
            bare.cri.create_container(pod, ContainerSpec("worker", env=SELECTOR))
        assert 'required plugin "spotgpu" not present' in refused.value.details
    finally:
        bare.cri.delete_pod(pod)


def test_a_pod_with_the_toleration_is_created_without_the_plugin(bare: CriRig) -> None:
    """What the toleration annotation allows (the agent's own pod, system pods): created
    unadjusted, its env as the image set it. Admission reserves the annotation to system
    namespaces, since it opts the pod out of every spotgpu rule."""
    assert bare.cri is not None
    pod = bare.pod(
        ContainerRef("kube-system", "system-pod", "worker"), annotations={keys.NRI_TOLERATE_MISSING_PLUGIN: "true"}
    )
    try:
        cid = bare.cri.run_container(pod, ContainerSpec("worker", env=SELECTOR))
        assert "NVIDIA_VISIBLE_DEVICES=all" in env_of(bare.bundle_spec(cid))
    finally:
        bare.cri.delete_pod(pod)


@pytest.fixture(scope="module")
def open_node(
    tmp_path_factory: pytest.TempPathFactory, cri_images: list[Path], containerd_binaries: Callable[[str], Any]
) -> Iterator[CriRig]:
    """NRI on, no plugin, the default validator turned OFF: a node without the shipped table."""
    base = Path(tmp_path_factory.mktemp("nri-open"))
    node = CriRig(base, containerd_binaries("2.2"), "nri", cri_images, host_plugin=False, nri_validator=False)
    try:
        yield node.start()
    finally:
        node.stop()


def test_without_the_validator_nri_fails_open(open_node: CriRig) -> None:
    """The limit the validator closes, shown: with it off and the agent down, containerd creates
    the CPU pod unadjusted and its config.json still selects every GPU."""
    assert open_node.cri is not None
    pod = open_node.pod(ContainerRef("team-a", "fail-open", "worker"))
    try:
        cid = open_node.cri.run_container(pod, ContainerSpec("worker", env=SELECTOR))
        assert "NVIDIA_VISIBLE_DEVICES=all" in env_of(open_node.bundle_spec(cid))
    finally:
        open_node.cri.delete_pod(pod)


# --- CDI -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["wrapper", "nri"])
def test_cdi_only_vendor_plugin(
    mode: str, tmp_path: Path, cri_images: list[Path], containerd_binaries: Callable[[str], Any]
) -> None:
    """The vendor plugin answers with CDI names only (NVIDIA's cdi-cri strategy). The owner gets
    its devices from containerd's CDI; a spot container's sync names them: NRI mode has
    containerd inject them, wrapper mode can only pass them on as an annotation."""
    cdi = tmp_path / "cdi"
    binaries = containerd_binaries("2.2")
    node = CriRig(tmp_path / "n", binaries, mode, cri_images, cdi_dirs=[str(cdi)], vendor_cdi_only=True)  # type: ignore[arg-type]
    node.write_cdi_spec(cdi)
    try:
        node.start()
        _, owner_cid = node.owner(OWNER, ["GPU-0", "GPU-1"])
        owner_devices = {d["path"] for d in node.bundle_spec(owner_cid)["linux"]["devices"]}
        assert {"/dev/nvidia0", "/dev/nvidia1"} <= owner_devices  # the kubelet's CDI_devices, resolved
        assert node.cri is not None
        pod = node.pod(ContainerRef("team-a", "cdi-spot", "worker"))
        cid = node.cri.run_container(pod, ContainerSpec("worker", resources={SPOT_GPU_RESOURCE: 1}))
        spec = node.bundle_spec(cid)
        assert spec["annotations"]["cdi.k8s.io/spotgpu-synced"] == "nvidia.com/gpu=GPU-0"
        paths = {d["path"] for d in spec["linux"].get("devices", [])}
        if mode == "nri":
            assert "/dev/nvidia0" in paths and "NVIDIA_VISIBLE_DEVICES=GPU-0" in spec["process"]["env"]
        else:
            assert "/dev/nvidia0" not in paths  # docs/runtime.md: CDI-only sync needs NRI or a CDI-aware runtime
    except CriError as exc:
        pytest.fail(f"{exc}\n{node.containerd.log_tail()}")
    finally:
        node.stop()
