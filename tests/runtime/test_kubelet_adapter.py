"""The kubelet clients of device sync over real gRPC on unix sockets.

No kubelet can run here: the pod-resources API and an NVIDIA-like device plugin are the
protocol-level doubles of :mod:`spotgpu.testing.kubelet` (our .proto files, the real method
paths and field numbers). Also the whole engine on these clients (:class:`KubeletNodeLookup`)
with the host's ``/dev/null`` and ``/dev/zero`` as stand-in GPU nodes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotgpu.adapters.kubelet import DevicePlugins, PodResourcesView, conventional_socket
from spotgpu.core import keys
from spotgpu.core.errors import PermanentError, TemporaryError
from spotgpu.core.ids import DeviceID, ResourceName
from spotgpu.core.mapping_cache import MappingCache
from spotgpu.ports.lookup import ContainerAssignment, DeviceGroup, DeviceNodeSpec, MountSpec, PodAssignment
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.engine import SpecEngine
from spotgpu.runtime.node import KubeletNodeLookup, LinuxHost
from spotgpu.testing.podresources import ContainerDevices, PodResourcesDouble
from spotgpu.testing.vendorplugin import VendorDevice, VendorPluginDouble

from .fakes import OWNER, SPOT_CTR, cri, kubelet_pods, make_spec, spot_spec

GPU = ResourceName("nvidia.com/gpu")
DEVICES = [VendorDevice("GPU-a", "/dev/null", "/dev/nvidia0", 0), VendorDevice("GPU-b", "/dev/zero", "/dev/nvidia1", 1)]
PODS = kubelet_pods()


@pytest.fixture
def pod_resources(tmp_path: Path) -> Iterator[PodResourcesDouble]:
    with PodResourcesDouble(tmp_path / "pod-resources" / "kubelet.sock") as double:
        double.set_pods(PODS)
        double.set_allocatable(
            [ContainerDevices("nvidia.com/gpu", ("GPU-a",), (0,)), ContainerDevices("nvidia.com/gpu", ("GPU-b",), (1,))]
        )
        yield double


def test_get_answers_one_pod(pod_resources: PodResourcesDouble) -> None:
    view = PodResourcesView(pod_resources.socket)
    try:
        assert view.pod("team-a", "dev-box") == PodAssignment(
            "team-a",
            "dev-box",
            (ContainerAssignment("main", (DeviceGroup(GPU, (DeviceID("GPU-a"), DeviceID("GPU-b")), (0,)),)),),
        )
        assert view.pod("team-a", "absent") is None
        assert view.device_numa(GPU) == {"GPU-a": (0,), "GPU-b": (1,)}
    finally:
        view.close()
    assert pod_resources.calls["Get"] == 2 and pod_resources.calls["List"] == 1  # not found: List confirms


def test_falls_back_to_list_when_get_is_disabled_and_remembers(tmp_path: Path) -> None:
    with PodResourcesDouble(tmp_path / "kubelet.sock", get_enabled=False) as double:
        double.set_pods(PODS)
        view = PodResourcesView(double.socket)
        try:
            for _ in range(3):
                assert view.pod("team-a", "spot-job") is not None
        finally:
            view.close()
        assert double.calls["Get"] == 1 and double.calls["List"] == 3


def test_a_missing_kubelet_socket_is_temporary(tmp_path: Path) -> None:
    view = PodResourcesView(tmp_path / "absent.sock", timeout=1.0)
    try:
        with pytest.raises(TemporaryError, match="no such socket"):
            view.pod("team-a", "x")
    finally:
        view.close()


def test_allocate_on_the_conventional_socket(tmp_path: Path) -> None:
    assert conventional_socket("nvidia.com/gpu") == "nvidia-gpu.sock"
    mounts = [("/usr/local/nvidia", "/opt/driver", True)]
    with VendorPluginDouble(tmp_path, "nvidia.com/gpu", DEVICES, mounts=mounts) as plugin:
        plugins = DevicePlugins(tmp_path, probe=False)
        try:
            allocation = plugins.allocate(GPU, [DeviceID("GPU-b"), DeviceID("GPU-a")])
            assert allocation.envs == (("NVIDIA_VISIBLE_DEVICES", "GPU-b,GPU-a"),)
            assert allocation.devices == (
                DeviceNodeSpec("/dev/nvidia1", "/dev/zero", "rw"),
                DeviceNodeSpec("/dev/nvidia0", "/dev/null", "rw"),
            )
            assert allocation.mounts == (MountSpec("/usr/local/nvidia", "/opt/driver", True),)
            with pytest.raises(PermanentError, match=r'invalid allocation request for "nvidia\.com/gpu"'):
                plugins.allocate(GPU, [DeviceID("GPU-zz")])
        finally:
            plugins.close()
        assert plugin.allocate_calls == [[["GPU-b", "GPU-a"]], [["GPU-zz"]]]


def test_explicit_socket_map_and_probing(tmp_path: Path) -> None:
    with (
        VendorPluginDouble(tmp_path, "nvidia.com/gpu", DEVICES, socket_name="vendor-x.sock"),
        VendorPluginDouble(
            tmp_path, "example.com/fpga", [VendorDevice("F-1", "/dev/null", "/dev/fpga0")], socket_name="other.sock"
        ),
    ):
        (tmp_path / "kubelet.sock").touch()
        explicit = DevicePlugins(tmp_path, sockets={"nvidia.com/gpu": "vendor-x.sock"}, probe=False)
        probing = DevicePlugins(tmp_path)
        off = DevicePlugins(tmp_path, probe=False)
        off_cache = DevicePlugins(tmp_path)
        try:
            assert explicit.allocate(GPU, [DeviceID("GPU-a")]).envs == (("NVIDIA_VISIBLE_DEVICES", "GPU-a"),)
            assert probing.socket_for("nvidia.com/gpu", ["GPU-a", "GPU-b"])[0] == tmp_path / "vendor-x.sock"
            assert probing.allocate(GPU, [DeviceID("GPU-b")]).devices[0].host_path == "/dev/zero"
            with pytest.raises(TemporaryError, match=r"lists nvidia\.com/gpu devices GPU-q"):
                off_cache.socket_for("nvidia.com/gpu", ["GPU-q"])
            with pytest.raises(TemporaryError, match="probing is off"):
                off.allocate(GPU, [DeviceID("GPU-a")])
        finally:
            for p in (explicit, probing, off, off_cache):
                p.close()


def test_a_restarted_plugin_is_found_again(tmp_path: Path) -> None:
    plugins = DevicePlugins(tmp_path)
    try:
        for round_ in range(2):
            with VendorPluginDouble(tmp_path, "nvidia.com/gpu", DEVICES, socket_name="renamed.sock"):
                assert plugins.allocate(GPU, [DeviceID("GPU-a")]).envs == (("NVIDIA_VISIBLE_DEVICES", "GPU-a"),), round_
        with pytest.raises(TemporaryError):
            plugins.allocate(GPU, [DeviceID("GPU-a")])
    finally:
        plugins.close()


def test_the_engine_over_real_grpc(tmp_path: Path, pod_resources: PodResourcesDouble) -> None:
    """Spot container team-a/spot-job/worker syncs GPU-a from its owner, end to end over gRPC."""
    cache = MappingCache()
    cache.create(OWNER, ["GPU-a", "GPU-b"])
    plugin_dir = tmp_path / "device-plugins"
    config = RuntimeConfig(
        device_plugin_dir=plugin_dir, pod_resources_socket=pod_resources.socket, probe_device_plugins=False
    )
    with VendorPluginDouble(plugin_dir, "nvidia.com/gpu", DEVICES):
        lookup = KubeletNodeLookup.from_config(config, cache.get_device_owner, lendable=lambda d: True)
        try:
            new, _ = SpecEngine(config, lookup, LinuxHost(), guard=None).modify(
                spot_spec({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}})
            )
        finally:
            lookup.close()
    assert new["linux"]["devices"][0] | {"uid": 0, "gid": 0} == {
        "path": "/dev/nvidia0",
        "type": "c",
        "major": 1,
        "minor": 3,
        "fileMode": 0o666,
        "uid": 0,
        "gid": 0,
    }
    assert json.loads(new["annotations"][keys.SYNCED_DEVICES]) == {"nvidia.com/gpu": ["GPU-a"]}
    assert new["linux"]["resources"]["cpu"]["cpus"]  # NUMA node 0's CPUs from this host's sysfs
    assert SPOT_CTR.format() == "team-a/spot-job/worker"


def test_local_fallback_runs_the_chain_in_the_wrapper_and_never_syncs(
    tmp_path: Path, pod_resources: PodResourcesDouble
) -> None:
    """The agent is unreachable and ``fallback: local``: the wrapper runs the chain itself, with
    owners from the agent's record file. Nobody can say whether a GPU is lent now, so a device
    sync is refused (the lend rule fails closed) and the spec is untouched; an annotation env
    is still applied as the service would have."""
    from spotgpu.runtime.ownerstate import write_owner_state
    from spotgpu.runtime.wrapper import decide

    cache = MappingCache()
    cache.create(OWNER, ["GPU-a", "GPU-b"])
    write_owner_state(tmp_path / "owners.json", cache.snapshot())
    plugin_dir = tmp_path / "device-plugins"
    config = tmp_path / "config.yaml"
    config.write_text(
        f"runtime:\n  fallback: local\n  devicePluginDir: {plugin_dir}\n  podResourcesSocket: {pod_resources.socket}\n"
        f"  ownerStateFile: {tmp_path / 'owners.json'}\n  guardEnabled: false\n"
    )
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    spec = json.dumps(spot_spec({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}))
    (bundle / "config.json").write_text(spec)
    with VendorPluginDouble(plugin_dir, "nvidia.com/gpu", DEVICES):
        _, code = decide(
            ["create", "--bundle", str(bundle), "cid"],
            agent_socket=str(tmp_path / "absent.sock"),
            fallback=((), str(config)),
        )
    assert code == 1
    assert (bundle / "config.json").read_text() == spec
    env_only = make_spec({**cri(SPOT_CTR), keys.CONTAINER_ENV_PREFIX: json.dumps({"MODE": "fast"})})
    (bundle / "config.json").write_text(json.dumps(env_only))
    _, code = decide(
        ["create", "--bundle", str(bundle), "cid"],
        agent_socket=str(tmp_path / "absent.sock"),
        fallback=((), str(config)),
    )
    assert code is None
    assert "MODE=fast" in json.loads((bundle / "config.json").read_text())["process"]["env"]
