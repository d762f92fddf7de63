"""DRA claims in pod-resources read as the twins they stand for (real gRPC to the double), so the
agent's eviction plan covers spot containers that got a lent GPU through DRA."""

from __future__ import annotations

from pathlib import Path

from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE, DeviceID, NodeName, shared_resource_of
from spotgpu.core.refs import PodRef
from spotgpu.dra.claim import DriverName
from spotgpu.dra.podresources import DraPodResources, twin_table
from spotgpu.testing.podresources import (
    ClaimDevice,
    ContainerDevices,
    ContainerResources,
    PodResources,
    PodResourcesDouble,
)

DRIVER, NODE = DriverName("gpu.spotgpu.io"), NodeName("node-a")
GPUS = (DeviceID("GPU-0aa"), DeviceID("GPU-1bb"))


def test_claims_of_our_driver_and_pool_become_twin_rows(tmp_path: Path) -> None:
    base = tmp_path
    with PodResourcesDouble(base / "pr.sock") as double:
        double.set_allocatable([ContainerDevices(NVIDIA_GPU_RESOURCE, GPUS)])
        double.set_pods(
            [
                PodResources(
                    "team", "owner", (ContainerResources("main", (ContainerDevices(NVIDIA_GPU_RESOURCE, GPUS),)),)
                ),
                PodResources(
                    "spot",
                    "job",
                    (
                        ContainerResources(
                            "worker",
                            claims=(
                                ClaimDevice(
                                    "spot", "c1", DRIVER, NODE, "spot-gpu-0aa", ("k8s.gpu.spotgpu.io/claim=u-x",)
                                ),
                                ClaimDevice("spot", "c1", DRIVER, NODE, "spot-gpu-1bb-r1"),
                                ClaimDevice("spot", "c2", DRIVER, "node-b", "spot-gpu-1bb"),  # another node's pool
                                ClaimDevice("spot", "c3", "gpu.nvidia.com", NODE, "gpu-0"),  # another driver
                                ClaimDevice("spot", "c4", DRIVER, NODE, "spot-gpu-ffff"),  # never published
                            ),
                        ),
                    ),
                ),
            ]
        )
        view = DraPodResources(
            base / "pr.sock",
            driver=DRIVER,
            node=NODE,
            gpu_resource=NVIDIA_GPU_RESOURCE,
            spot_resource=SPOT_GPU_RESOURCE,
            shared_replicas=2,
        )
        try:
            rows = view.list()
        finally:
            view.close()
    spot = PodRef("spot", "job")
    assert rows == [
        AllocatedDevices(PodRef("team", "owner"), "main", NVIDIA_GPU_RESOURCE, GPUS),
        AllocatedDevices(spot, "worker", SPOT_GPU_RESOURCE, (DeviceID("spot-GPU-0aa"),)),
        AllocatedDevices(spot, "worker", shared_resource_of(SPOT_GPU_RESOURCE), (DeviceID("spot-GPU-1bb::1"),)),
    ]


def test_the_twin_table_matches_the_published_names() -> None:
    table = twin_table(list(GPUS), SPOT_GPU_RESOURCE, 1)
    assert table["spot-gpu-0aa"] == (SPOT_GPU_RESOURCE, "spot-GPU-0aa")
    assert table["spot-gpu-0aa-r0"] == (shared_resource_of(SPOT_GPU_RESOURCE), "spot-GPU-0aa::0")
