"""spotgpu-runtime's decisions on the real path a node takes: the kubelet's CRI calls into a
real containerd, real runc, in every mode (root).

Each module-scoped node (:class:`spotgpu.testing.cri_rig.CriRig`) is one of
``1.6/wrapper`` (Debian's containerd, the ``spotgpu`` handler of deploy/containerd/spotgpu-runtime.toml),
``2.2/wrapper`` (containerd 2.2.7, deploy/containerd/spotgpu-runtime-v3.toml) and ``2.2/nri``
(containerd 2.2.7 with no handler; the NRI plugin in this process). The kubelet (CRI client and
device manager), pod-resources and the vendor plugin are the protocol-level doubles; the GPUs
are stand-ins with /dev/null's numbers. Every test performs what a tenant can do (a pod that
asks for devices it was not granted, forged annotations, device-selecting env) and checks the
container runc ran, or that runc never ran it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spotgpu.core import keys
from spotgpu.core.ids import SPOT_GPU_RESOURCE
from spotgpu.core.refs import ContainerRef
from spotgpu.testing.cri import ContainerSpec, CriError, RunningPod
from spotgpu.testing.cri_rig import CriRig
from spotgpu.testing.listener import RecordingListener

pytestmark = pytest.mark.root

OWNER = ContainerRef("team-a", "dev-box", "main")
PROBE = (
    "exec 3</dev/nvidia0 && echo OPEN-OK; echo VISIBLE=$NVIDIA_VISIBLE_DEVICES; cat /usr/local/nvidia/lib/libfake.txt"
)
"""What a spot container's init process checks (exec'd processes may not see the synced env:
in wrapper mode containerd's own copy of the spec, which exec uses, has none)."""
NODES = [("1.6", "wrapper"), ("2.2", "wrapper"), ("2.2", "nri")]
_names = itertools.count()


@pytest.fixture(scope="module", params=NODES, ids=[f"{v}-{m}" for v, m in NODES])
def node(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    cri_images: list[Path],
    containerd_binaries: Callable[[str], Any],
) -> Iterator[tuple[CriRig, RecordingListener]]:
    version, mode = request.param
    binaries = containerd_binaries(version)
    base = Path(tmp_path_factory.mktemp(f"cri-{version}-{mode}"))
    rig = CriRig(base, binaries, mode, cri_images)
    listener = RecordingListener(rig.listener)
    try:
        rig.start()
        rig.owner(OWNER, ["GPU-0", "GPU-1"])  # holds both GPUs for the whole module
        yield rig, listener
    finally:
        rig.stop()
        listener.close()


def spot(ref_name: str = "spot") -> ContainerRef:
    return ContainerRef("team-a", f"{ref_name}-{next(_names)}", "worker")


def run(rig: CriRig, pod: RunningPod, container: ContainerSpec) -> tuple[str | None, str]:
    """Create and start as the kubelet does; (container ID, "") or (None, the error the kubelet sees)."""
    assert rig.cri is not None
    try:
        cid = rig.cri.create_container(pod, container)
    except CriError as exc:
        return None, exc.details
    try:
        rig.cri.start_container(cid)
    except CriError as exc:
        return None, exc.details
    return cid, ""


def started(rig: CriRig, pod: RunningPod, container: ContainerSpec) -> str:
    cid, error = run(rig, pod, container)
    assert cid is not None, error
    return cid


def init_output(rig: CriRig, cid: str) -> str:
    """What the container's init process printed into /tmp/out."""
    assert rig.cri is not None
    return rig.cri.exec_sync(cid, ["cat", "/tmp/out"]).stdout.decode(errors="replace")


def probe_spec(**kwargs: Any) -> ContainerSpec:
    return ContainerSpec("worker", args=["sh", "-c", f"({PROBE}) >/tmp/out 2>&1; exec sleep 100000"], **kwargs)


def test_a_granted_spot_container_gets_the_owners_gpu(node: tuple[CriRig, RecordingListener]) -> None:
    rig, _ = node
    pod = rig.pod(spot())
    cid = started(rig, pod, probe_spec(resources={SPOT_GPU_RESOURCE: 1}))
    assert rig.cri is not None
    out = ""
    for _ in range(50):
        out = init_output(rig, cid)
        if "FAKE-DRIVER-LIB" in out:
            break
    assert "OPEN-OK" in out and "FAKE-DRIVER-LIB" in out  # the node, its cgroup rule, the driver mount
    twin = pod.grants["worker"].granted[0][1][0]
    gpu = twin.removeprefix("spot-")
    assert f"VISIBLE={gpu}" in out
    spec = rig.bundle_spec(cid)
    assert json.loads(spec["annotations"][keys.SYNCED_DEVICES]) == {"nvidia.com/gpu": [gpu]}
    rig.cri.delete_pod(pod)


def refused(rig: CriRig, annotations: dict[str, str], **container: Any) -> str:
    """A pod the tenant annotated; the kubelet's error (the container must never run)."""
    ref = spot("thief")
    pod = rig.pod(ref, annotations=annotations)
    cid, error = run(rig, pod, probe_spec(**container))
    assert rig.cri is not None
    rig.cri.delete_pod(pod)
    assert cid is None, "the container ran"
    assert "spotgpu-runtime" in error
    return error


def test_a_sync_the_kubelet_did_not_grant_is_never_run(node: tuple[CriRig, RecordingListener]) -> None:
    rig, _ = node
    request = {"team-a/dev-box/main": {"nvidia.com/gpu": ["GPU-1"]}}
    error = refused(rig, {keys.DEVICES_FROM_PREFIX + ".worker": json.dumps(request)})
    assert "twin-not-allocated" in error and "spot-GPU-1" in error


def test_a_sync_from_a_pod_that_is_not_there_is_never_run(node: tuple[CriRig, RecordingListener]) -> None:
    rig, _ = node
    request = {"team-a/no-such-pod/main": {"nvidia.com/gpu": []}}
    error = refused(rig, {keys.DEVICES_FROM_PREFIX + ".worker": json.dumps(request)}, resources={SPOT_GPU_RESOURCE: 1})
    assert "source-not-found" in error


def test_device_selecting_env_is_refused(node: tuple[CriRig, RecordingListener]) -> None:
    rig, _ = node
    error = refused(rig, {keys.CONTAINER_ENV_PREFIX + ".worker": '{"NVIDIA_VISIBLE_DEVICES": "all"}'})
    assert "selects devices" in error


def test_forged_runtime_annotations_never_reach_the_spec(node: tuple[CriRig, RecordingListener]) -> None:
    """In both modes: a pod-level forgery of the keys only spotgpu-runtime writes is stripped (wrapper
    mode: the shell fast path sends any create carrying one to the agent's chain)."""
    rig, _ = node
    forged = {keys.SYNCED_DEVICES: '{"nvidia.com/gpu":["GPU-1"]}', keys.GUARDED: OWNER.format()}
    pod = rig.pod(spot("forger"), annotations=forged)
    cid = started(rig, pod, ContainerSpec("worker"))
    annotations = rig.bundle_spec(cid).get("annotations", {})
    assert keys.SYNCED_DEVICES not in annotations and keys.GUARDED not in annotations
    assert rig.cri is not None
    rig.cri.delete_pod(pod)


def test_the_owner_runs_with_the_guards_rule(node: tuple[CriRig, RecordingListener]) -> None:
    rig, listener = node
    assert rig.cri is not None
    cid = rig.cri.pods[(OWNER.namespace or "", OWNER.pod)].containers[OWNER.name]
    spec = rig.bundle_spec(cid)
    assert spec["annotations"][keys.GUARDED] == OWNER.format()
    seccomp = spec["linux"]["seccomp"]
    assert seccomp["listenerPath"] == str(rig.listener)
    assert any(s["action"] == "SCMP_ACT_NOTIFY" and s["names"] == ["ioctl"] for s in seccomp["syscalls"])
    state = listener.wait_for(OWNER.format())
    assert state is not None and state["fds"] == ["seccompFd"]  # runc handed the guard the notify fd


def test_containers_of_no_interest_are_untouched(node: tuple[CriRig, RecordingListener]) -> None:
    rig, _ = node
    pod = rig.pod(ContainerRef("web", f"nginx-{next(_names)}", "nginx"))
    cid = started(rig, pod, ContainerSpec("nginx"))
    spec = rig.bundle_spec(cid)
    ours = [k for k in spec.get("annotations", {}) if k.startswith(("spotgpu.io/", "platform.k8s.io/"))]
    assert ours == [] and "seccomp" not in spec["linux"]
    assert rig.cri is not None
    rig.cri.delete_pod(pod)
