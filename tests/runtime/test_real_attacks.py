"""Attacks on the runtime path with real runc: each one a tenant could try, each one must fail.

Every test drives a real ``create`` through the installed ``spotgpu-runtime`` shell fast path,
the wrapper and the runtime service (the rig of :mod:`.realrig`: kubelet doubles over real gRPC,
stand-in GPU device nodes), then runs the container with runc and reads what it could open.
Issue 12's items: the ``::`` twin confusion (2), the lend rule's "cannot say" (4), the device
selecting env of a non-holder (5), forged "written by us" annotations (6), and a sync request
hidden past the 4 MiB read window (7).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotgpu.core import keys
from spotgpu.core.ids import SPOT_GPU_RESOURCE
from spotgpu.core.refs import ContainerRef
from spotgpu.runtime import protocol
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.shim import install_shim
from spotgpu.testing.podresources import ContainerDevices, ContainerResources, PodResources

from .fakes import cri
from .realrig import OWNER, SPOT, Rig, real_rig, runc_run, spot_annotations, unique

pytestmark = pytest.mark.root

OPEN0 = "head -c 1 /dev/nvidia0 && echo OPEN0-OK; echo VISIBLE=$NVIDIA_VISIBLE_DEVICES"
OPEN1 = "head -c 1 /dev/nvidia1 && echo OPEN1-OK; echo VISIBLE=$NVIDIA_VISIBLE_DEVICES"
TENANT = ContainerRef("team-b", "cpu-job", "main")
"""A pod of another tenant that holds no device at all."""


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with real_rig(tmp_path) as rig:
        yield rig


def _pod(ref: ContainerRef, resource: str, ids: tuple[str, ...]) -> PodResources:
    assert ref.namespace is not None
    return PodResources(ref.namespace, ref.pod, (ContainerResources(ref.name, (ContainerDevices(resource, ids),)),))


# --- item 2: twin IDs containing "::" ----------------------------------------------------------------


def test_a_replica_twin_never_grants_another_owners_replica(tmp_path: Path) -> None:
    """Time-sliced GPU ``GPU-t``: the vendor plugin serves ``GPU-t::0`` (owner A) and ``GPU-t::1``
    (owner B, both lent). The spot container was granted ``spot-GPU-t::0`` and asks for B's
    ``GPU-t::1``; cutting IDs at the first ``::`` made both ``GPU-t`` and let it through, and the
    agent (which reads the twin as ``GPU-t::0``) found no victim when B came back."""
    owner_a, owner_b = ContainerRef("team-a", "owner-a", "main"), ContainerRef("team-b", "owner-b", "main")
    pods = [
        _pod(owner_a, "nvidia.com/gpu", ("GPU-t::0",)),
        _pod(owner_b, "nvidia.com/gpu", ("GPU-t::1",)),
        _pod(SPOT, SPOT_GPU_RESOURCE, ("spot-GPU-t::0",)),
    ]
    devices = [("GPU-t::0", "nvidia0"), ("GPU-t::1", "nvidia1")]
    owners = [(owner_a, ("GPU-t::0",)), (owner_b, ("GPU-t::1",))]
    with real_rig(tmp_path, devices=devices, owners=owners, pods=pods) as rig:
        theft = rig.bundle("theft", spot_annotations({"team-b/owner-b/main": {"nvidia.com/gpu": ["GPU-t::1"]}}), OPEN1)
        code, out = runc_run(rig, theft, unique("theft"))
        assert code != 0 and "OPEN1-OK" not in out, out
        assert "twin-not-allocated" in out
        granted = rig.bundle("own", spot_annotations({"team-a/owner-a/main": {"nvidia.com/gpu": ["GPU-t::0"]}}), OPEN0)
        code, out = runc_run(rig, granted, unique("own"))
        assert code == 0 and "OPEN0-OK" in out and "VISIBLE=GPU-t::0" in out, out


# --- item 4: the lend rule fails closed --------------------------------------------------------------


def test_a_gpu_the_agent_cannot_vouch_for_is_not_synced(rig: Rig) -> None:
    """The kubelet granted ``spot-GPU-a`` and the owner record matches, but the agent cannot say
    whether GPU-a is lent now (it does not serve it, or nobody asks it): refused, not passed."""
    rig.lent.pop("GPU-a")
    bundle = rig.bundle("unvouched", spot_annotations({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}), OPEN0)
    before = (bundle / "config.json").read_bytes()
    code, out = runc_run(rig, bundle, unique("unvouched"))
    assert code != 0 and "OPEN0-OK" not in out, out
    assert "not-lent" in out and "cannot say" in out
    assert (bundle / "config.json").read_bytes() == before
    rig.lent["GPU-a"] = True  # the same request once the agent says "lent"
    code, out = runc_run(rig, rig.bundle("vouched", json.loads(before)["annotations"], OPEN0), unique("vouched"))
    assert code == 0 and "OPEN0-OK" in out, out


# --- item 5: device-selecting env of a container that holds no GPU -----------------------------------

_NVIDIA_STAND_IN = """#!{python} -I
# A stand-in for nvidia-container-runtime's legacy mode: it reads NVIDIA_VISIBLE_DEVICES from the
# bundle's process env and gives the container those GPUs' device nodes (and, as the toolkit does,
# IMEX channel 0 for NVIDIA_IMEX_CHANNELS=0, the NVSwitch for NVIDIA_NVSWITCH=enabled), then execs
# runc. As the toolkit does (internal/config/image/cuda_image.go): "void" or empty selects none,
# and the variable UNSET on a legacy CUDA image (CUDA_VERSION set, no NVIDIA_REQUIRE_CUDA) selects all.
import json, os, sys
args = sys.argv[1:]
nodes = {{"GPU-a": ("/dev/nvidia0", 3), "GPU-b": ("/dev/nvidia1", 5)}}
if "create" in args:
    bundle = args[args.index("--bundle") + 1] if "--bundle" in args else "."
    path = os.path.join(bundle, "config.json")
    spec = json.load(open(path))
    env = dict(e.split("=", 1) for e in spec["process"].get("env", []) if "=" in e)
    legacy = bool(env.get("CUDA_VERSION")) and not env.get("NVIDIA_REQUIRE_CUDA")
    value = env.get("NVIDIA_VISIBLE_DEVICES", "all" if legacy else "")
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    gpus = [] if "void" in chosen else list(nodes) if "all" in chosen else [v for v in chosen if v in nodes]
    wanted = [nodes[g] for g in gpus]
    if env.get("NVIDIA_IMEX_CHANNELS") == "0":  # the hook creates the channel on the host, then injects it
        wanted.append(("/dev/nvidia-caps-imex-channels/channel0", 7))
    if wanted and env.get("NVIDIA_NVSWITCH") == "enabled":  # gated: only with GPUs requested
        wanted.append(("/dev/nvidia-nvswitch0", 8))
    linux = spec.setdefault("linux", {{}})
    for where, minor in wanted:
        linux.setdefault("devices", []).append(
            {{"path": where, "type": "c", "major": 1, "minor": minor, "fileMode": 438, "uid": 0, "gid": 0}}
        )
        linux.setdefault("resources", {{}}).setdefault("devices", []).append(
            {{"allow": True, "type": "c", "major": 1, "minor": minor, "access": "rwm"}}
        )
    json.dump(spec, open(path, "w"))
os.execvp("runc", ["runc", *args])
"""


@pytest.fixture
def nvidia_rig(tmp_path: Path) -> Iterator[Rig]:
    lower = tmp_path / "bin" / "nvidia-container-runtime"
    lower.parent.mkdir()
    lower.write_text(_NVIDIA_STAND_IN.format(python=sys.executable))
    lower.chmod(0o755)
    with real_rig(tmp_path, lower=lower) as rig:
        yield rig


def test_a_container_holding_no_gpu_cannot_select_devices_through_its_env(nvidia_rig: Rig) -> None:
    """With nvidia-container-runtime below us, ``NVIDIA_VISIBLE_DEVICES=all`` in a CPU pod's own
    env (or a CUDA image's) would hand it every GPU on the node, the lent ones included, without
    any sync check. It is neutralized (``void``) in every container that is not an allocated GPU
    holder; the owner, which the kubelet allocated GPU-a and GPU-b, keeps its own."""
    rig = nvidia_rig
    env = ("PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all")
    tenant = rig.bundle("tenant", cri(TENANT), OPEN0, env=env)
    code, out = runc_run(rig, tenant, unique("tenant"))
    assert code == 0, out
    assert "OPEN0-OK" not in out and "VISIBLE=void\n" in out, out
    spot = rig.bundle("spot-sidecar", cri(SPOT), OPEN0, env=("PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-a"))
    code, out = runc_run(rig, spot, unique("spot-sidecar"))  # holds a twin, syncs nothing: no GPU
    assert code == 0 and "OPEN0-OK" not in out, out
    owner = rig.bundle("owner", cri(OWNER), OPEN0, env=("PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"))
    code, out = runc_run(rig, owner, unique("owner"))
    assert code == 0 and "OPEN0-OK" in out and "VISIBLE=GPU-a,GPU-b" in out, out


OPEN_FABRIC = (
    "head -c 1 /dev/nvidia-caps-imex-channels/channel0 >/dev/null && echo IMEX-OK; "
    "head -c 1 /dev/nvidia-nvswitch0 >/dev/null && echo NVSWITCH-OK; echo done"
)
FABRIC_ENV = ("PATH=/bin", "NVIDIA_IMEX_CHANNELS=0", "NVIDIA_NVSWITCH=enabled")


def test_a_container_holding_no_gpu_cannot_select_imex_channels_or_nvswitches(nvidia_rig: Rig) -> None:
    """The toolkit turns more env than ``NVIDIA_VISIBLE_DEVICES`` into device nodes: IMEX channels
    (which its hook even creates on the host) and, for a container given any GPU, the gated devices
    (NVSwitch, MOFED, GDS, GDRCopy). A tenant's CPU pod gets none of them; the owner, a GPU holder,
    keeps its own env (so the stand-in does hand them out)."""
    rig = nvidia_rig
    tenant = rig.bundle("tenant", cri(TENANT), OPEN_FABRIC, env=(*FABRIC_ENV, "NVIDIA_VISIBLE_DEVICES=all"))
    code, out = runc_run(rig, tenant, unique("tenant"))
    assert code == 0 and "done" in out, out
    assert "IMEX-OK" not in out and "NVSWITCH-OK" not in out, out
    owner = rig.bundle("owner", cri(OWNER), OPEN_FABRIC, env=(*FABRIC_ENV, "NVIDIA_VISIBLE_DEVICES=GPU-a"))
    code, out = runc_run(rig, owner, unique("owner"))
    assert code == 0 and "IMEX-OK" in out and "NVSWITCH-OK" in out, out


def test_a_legacy_cuda_images_selector_is_neutralized_not_removed(nvidia_rig: Rig) -> None:
    """Attack: a CPU pod from a legacy CUDA image (``CUDA_VERSION``, no ``NVIDIA_REQUIRE_CUDA``)
    with ``NVIDIA_VISIBLE_DEVICES=all``. Removing the variable would not help: unset on such an
    image, the toolkit selects every GPU. The sanitizer writes ``void``, which selects none."""
    rig = nvidia_rig
    env = ("PATH=/bin", "CUDA_VERSION=11.0.3", "NVIDIA_VISIBLE_DEVICES=all")
    tenant = rig.bundle("legacy", cri(TENANT), OPEN0, env=env)
    code, out = runc_run(rig, tenant, unique("legacy"))
    assert code == 0, out
    assert "OPEN0-OK" not in out and "VISIBLE=void\n" in out, out


def test_a_legacy_cuda_image_without_a_selector_gets_none(nvidia_rig: Rig) -> None:
    """Attack: a CPU pod from a legacy CUDA image that does not set ``NVIDIA_VISIBLE_DEVICES``:
    unset means every GPU to the toolkit. The shell fast path sends it to the agent
    (``"CUDA_VERSION=`` marker) and the sanitizer adds ``NVIDIA_VISIBLE_DEVICES=void``."""
    rig = nvidia_rig
    tenant = rig.bundle("legacy-unset", cri(TENANT), OPEN0, env=("PATH=/bin", "CUDA_VERSION=11.0.3"))
    code, out = runc_run(rig, tenant, unique("legacy-unset"))
    assert code == 0, out
    assert "OPEN0-OK" not in out and "VISIBLE=void\n" in out, out


def test_without_the_agent_a_device_selecting_env_is_refused(nvidia_rig: Rig) -> None:
    rig = nvidia_rig
    assert rig.config is not None
    blind = install_shim(rig.root / "blind", dataclasses.replace(rig.config, agent_socket=rig.root / "none.sock"))
    bundle = rig.bundle("tenant", cri(TENANT), OPEN0, env=("PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"))
    code, out = runc_run(dataclasses.replace(rig, shim=blind), bundle, unique("blind"))
    assert code != 0 and "OPEN0-OK" not in out and "unreachable" in out, out


# --- item 6: forged "written by us" annotations -------------------------------------------------------

FORGED = {
    keys.GUARDED: OWNER.format(),
    keys.GUARD_SKIPPED: "opted-out: forged",
    keys.SYNCED_DEVICES: '{"nvidia.com/gpu":["GPU-a"]}',
    "cdi.k8s.io/spotgpu-synced": "nvidia.com/gpu=all",  # keys.CDI_SYNCED
}


def test_forged_runtime_annotations_never_reach_runc(rig: Rig) -> None:
    """A pod-annotation allow-list (``spotgpu.io/*``, ``platform.k8s.io/*``) copies a tenant's own
    annotations into its specs. A spec we did not otherwise modify went straight to runc, so an
    unguarded owner could claim ``spotgpu.io/guarded`` (the agent lends only guarded owners) and a
    CDI-aware runtime would resolve a forged ``cdi.k8s.io/spotgpu-synced``."""
    tenant = rig.bundle("tenant", {**cri(TENANT), **FORGED}, "true")
    code, out = runc_run(rig, tenant, unique("tenant"))
    assert code == 0, out
    assert not set(FORGED) & set(json.loads((tenant / "config.json").read_text())["annotations"])
    owner = rig.bundle("owner", {**cri(OWNER), **FORGED}, "true")  # no guard listens: unguarded
    code, out = runc_run(rig, owner, unique("owner"))
    assert code == 0, out
    annotations = json.loads((owner / "config.json").read_text())["annotations"]
    assert keys.GUARDED not in annotations and annotations[keys.GUARD_SKIPPED].startswith("listener-down")
    assert keys.SYNCED_DEVICES not in annotations and "cdi.k8s.io/spotgpu-synced" not in annotations


def test_without_the_agent_a_forged_annotation_is_refused(rig: Rig) -> None:
    assert rig.config is not None
    blind = install_shim(rig.root / "blind", dataclasses.replace(rig.config, agent_socket=rig.root / "none.sock"))
    bundle = rig.bundle("tenant", {**cri(TENANT), keys.GUARDED: OWNER.format()}, "true")
    before = (bundle / "config.json").read_bytes()
    code, out = runc_run(dataclasses.replace(rig, shim=blind), bundle, unique("blind"))
    assert code != 0 and "unreachable" in out, out
    assert (bundle / "config.json").read_bytes() == before


# --- item 7: a sync request past the read window ------------------------------------------------------


def test_a_sync_request_past_the_read_window_is_refused_not_ignored(rig: Rig) -> None:
    """A spec of more than 4 MiB whose ``container-devices-from`` comes after the first 4 MiB: the
    wrapper looked for the request only in what it read, found none and ran the container without
    its devices (and without any check). A spec we cannot read whole is refused."""
    pad = {"a.example.com/pad": "x" * (protocol.MAX_SPEC_BYTES + 1024)}
    request = spot_annotations({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}})
    bundle = rig.bundle("huge", {**pad, **request}, OPEN0)
    raw = (bundle / "config.json").read_bytes()
    assert raw.index(keys.DEVICES_FROM_PREFIX.encode()) > protocol.MAX_SPEC_BYTES
    code, out = runc_run(rig, bundle, unique("huge"))
    assert code != 0 and "OPEN0-OK" not in out, out
    assert "exceeds" in out and (bundle / "config.json").read_bytes() == raw


def test_the_runtime_config_marks_device_selecting_env_only_below_nvidia() -> None:
    assert RuntimeConfig(lower_runtime="/usr/bin/runc").env_markers == ()
    markers = RuntimeConfig(lower_runtime="/usr/bin/nvidia-container-runtime").env_markers
    assert '"NVIDIA_VISIBLE_DEVICES=' in markers
    assert RuntimeConfig(lower_runtime="/usr/bin/runc", env_selects_devices=True).env_markers == markers
