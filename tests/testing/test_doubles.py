"""The shipped test doubles behave like the components they stand in for.

KubeletDouble, PodResourcesDouble and VendorPluginDouble speak real gRPC over unix sockets
(our .proto files); the containerd fixture is the real daemon with private paths.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2 as dp
from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from spotgpu.adapters.proto import podresources_v1_pb2 as pr
from spotgpu.adapters.proto import podresources_v1_pb2_grpc as pr_grpc
from spotgpu.testing.containerd import Containerd, make_rootfs
from spotgpu.testing.kubelet import KubeletDouble
from spotgpu.testing.podresources import ContainerDevices, ContainerResources, PodResources, PodResourcesDouble
from spotgpu.testing.vendorplugin import VendorDevice, VendorPluginDouble

DEVICES = [VendorDevice("GPU-a", "/dev/null", "/dev/nvidia0", 0), VendorDevice("GPU-b", "/dev/zero", "/dev/nvidia1", 1)]


def test_vendor_plugin_registers_and_allocates(tmp_path: Path) -> None:
    with KubeletDouble(tmp_path) as kubelet, VendorPluginDouble(tmp_path, "nvidia.com/gpu", DEVICES) as plugin:
        plugin.register()
        reg = kubelet.wait_registered("nvidia.com/gpu")
        assert (reg.endpoint, reg.version) == ("nvidia-gpu.sock", "v1beta1")
        devices = kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 2)
        assert devices["GPU-b"].numa_nodes == (1,) and kubelet.healthy("nvidia.com/gpu") == {"GPU-a", "GPU-b"}
        response = kubelet.allocate("nvidia.com/gpu", ["GPU-b", "GPU-a"])
        (container,) = response.container_responses
        assert container.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b,GPU-a"
        assert [(d.container_path, d.host_path, d.permissions) for d in container.devices] == [
            ("/dev/nvidia1", "/dev/zero", "rw"),
            ("/dev/nvidia0", "/dev/null", "rw"),
        ]
        with pytest.raises(grpc.RpcError) as info:
            kubelet.allocate("nvidia.com/gpu", ["GPU-x"])
        assert 'invalid allocation request for "nvidia.com/gpu": unknown device: GPU-x' in str(info.value.details())


def test_registration_fails_when_the_plugin_is_not_serving(tmp_path: Path) -> None:
    """The kubelet dials the plugin before answering Register: register-before-serve fails."""
    with KubeletDouble(tmp_path) as kubelet, grpc.insecure_channel(f"unix://{tmp_path}/kubelet.sock") as channel:
        with pytest.raises(grpc.RpcError) as info:
            dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(version="v1beta1", endpoint="absent.sock", resource_name="x.io/y"), timeout=10
            )
        assert "failed to get device plugin options" in str(info.value.details())
        with pytest.raises(grpc.RpcError, match="unsupported API version"):
            dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(version="v1alpha", endpoint="absent.sock", resource_name="x.io/y"), timeout=10
            )
        assert len(kubelet.rejections) == 2


def test_restart_deletes_every_socket(tmp_path: Path) -> None:
    with KubeletDouble(tmp_path) as kubelet, VendorPluginDouble(tmp_path, "nvidia.com/gpu", DEVICES) as plugin:
        plugin.register()
        kubelet.wait_registered("nvidia.com/gpu")
        kubelet.restart()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["kubelet.sock"]
        assert kubelet.devices("nvidia.com/gpu") == {}
        plugin.stop()
        plugin.start()
        plugin.register()
        assert kubelet.wait_registered("nvidia.com/gpu", count=2).endpoint == "nvidia-gpu.sock"


def test_pod_resources(tmp_path: Path) -> None:
    socket = tmp_path / "pod-resources" / "kubelet.sock"
    pod = PodResources(
        "team", "dev-0", (ContainerResources("main", (ContainerDevices("nvidia.com/gpu", ("GPU-a",), (0,)),)),)
    )
    with PodResourcesDouble(socket) as double, grpc.insecure_channel(f"unix://{socket}") as channel:
        double.set_pods([pod])
        double.set_allocatable([ContainerDevices("nvidia.com/gpu", ("GPU-a", "GPU-b"))])
        stub = pr_grpc.PodResourcesListerStub(channel)
        listed = stub.List(pr.ListPodResourcesRequest(), timeout=5).pod_resources
        assert [(p.namespace, p.name, p.containers[0].devices[0].device_ids[0]) for p in listed] == [
            ("team", "dev-0", "GPU-a")
        ]
        got = stub.Get(pr.GetPodResourcesRequest(pod_name="dev-0", pod_namespace="team"), timeout=5)
        assert got.pod_resources.containers[0].name == "main"
        with pytest.raises(grpc.RpcError, match="pod ghost not found"):
            stub.Get(pr.GetPodResourcesRequest(pod_name="ghost", pod_namespace="team"), timeout=5)
        assert list(stub.GetAllocatableResources(pr.AllocatableResourcesRequest()).devices[0].device_ids) == [
            "GPU-a",
            "GPU-b",
        ]
        double.get_enabled = False
        with pytest.raises(grpc.RpcError, match="disabled via feature gate"):
            stub.Get(pr.GetPodResourcesRequest(pod_name="dev-0", pod_namespace="team"), timeout=5)
        assert double.calls == {"List": 1, "Get": 3, "GetAllocatableResources": 1}


@pytest.mark.root
def test_private_containerd_runs_and_cleans_up(tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path / "rootfs")
    with Containerd(tmp_path / "ctd") as ctd:
        ctd.run_detached("sleeper", rootfs, ["sleep", "60"])
        pids = ctd.task_pids()
        assert set(pids) == {"sleeper"}
        pid = pids["sleeper"]
        assert Path(f"/proc/{pid}").exists()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()
