"""Shared spot: several twins per GPU (``agent.twinReplicas``), so the kubelet, which hands each
device ID to one container, can give one lent GPU to several spot containers. The device plugin
over real gRPC against the kubelet double; the pure decisions directly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotgpu.agent.model import build_mapping, twin_ids
from spotgpu.core import keys
from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.config import AgentConfig
from spotgpu.core.configfile import ConfigError
from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE, DeviceID, real_of_twin
from spotgpu.core.refs import PodRef
from spotgpu.ports.node import GpuDevice
from spotgpu.testing.fakes import fake_devices
from spotgpu.testing.kubelet import KubeletDouble

from .helpers import OWNER, Rig, gpu_alloc, make_rig, pod

RES = str(SPOT_GPU_RESOURCE)


def test_twin_ids_per_replica_and_the_kubelets_length_limit() -> None:
    devices = [GpuDevice(DeviceID("GPU-a"), 0), GpuDevice(DeviceID("G" * 55), 1), GpuDevice(DeviceID("H" * 56), 2)]
    assert twin_ids(devices[:1]) == {"spot-GPU-a": "GPU-a"}
    ids = twin_ids(devices, replicas=3)
    assert [t for t, r in ids.items() if r == "GPU-a"] == ["spot-GPU-a::0", "spot-GPU-a::1", "spot-GPU-a::2"]
    assert len([t for t, r in ids.items() if r == "G" * 55]) == 3  # 5 + 55 + 3 = 63 characters
    assert all(r != "H" * 56 for r in ids.values())  # 64 characters: cannot be lent, never truncated


@pytest.mark.parametrize(
    ("twin", "known", "real"),
    [
        ("spot-GPU-a", {"GPU-a"}, "GPU-a"),
        ("spot-GPU-a::2", {"GPU-a"}, "GPU-a"),
        ("spot-GPU-a::2", {"GPU-a::2", "GPU-a"}, "GPU-a::2"),  # a vendor's own replica ID wins
        ("spot-GPU-a::x", {"GPU-a"}, None),
        ("spot-GPU-b::1", {"GPU-a"}, None),
        ("GPU-a", {"GPU-a"}, None),
    ],
)
def test_real_of_twin(twin: str, known: set[str], real: str | None) -> None:
    assert real_of_twin(twin, known) == real


def test_replica_users_are_users_of_the_real_gpu() -> None:
    devices = fake_devices(1)
    gpu = devices[0].id
    spot = [
        (PodRef("spot", "a"), (f"spot-{gpu}::0",)),
        (PodRef("spot", "b"), (f"spot-{gpu}::1", f"spot-{gpu}::2")),  # two replicas, one user
    ]
    rows = [gpu_alloc(OWNER, [gpu])]
    rows += [AllocatedDevices(ref, "w", SPOT_GPU_RESOURCE, tuple(DeviceID(t) for t in ts)) for ref, ts in spot]
    build = build_mapping(devices, rows, {}, gpu_resource=NVIDIA_GPU_RESOURCE, spot_resource=SPOT_GPU_RESOURCE)
    assert build.problems == ()
    assert build.snapshot.to_json() == {OWNER.format(): {gpu: ["spot/a", "spot/b"]}}


def test_twin_replicas_is_validated() -> None:
    with pytest.raises(ConfigError, match="twinReplicas"):
        AgentConfig(twin_replicas=0)


@pytest.fixture
def rig(tmp_path: Path, kubelet: KubeletDouble) -> Iterator[Rig]:
    rig = make_rig(tmp_path, plugin=True, replicas=2)
    try:
        yield rig
    finally:
        rig.agent.stop()


def test_the_plugin_serves_every_replica_with_its_gpus_health(rig: Rig, kubelet: KubeletDouble) -> None:
    devices = kubelet.wait_devices(RES, lambda d: len(d) == 8)
    assert {d for d, s in devices.items() if s.health == "Healthy"} == set()  # owner active, 2 and 3 unheld
    rig.add_shadow([rig.d[2], rig.d[3]])
    rig.cycle(0)
    kubelet.wait_devices(
        RES,
        lambda d: (
            {t for t, s in d.items() if s.health == "Healthy"}
            == {f"spot-{rig.d[i]}::{k}" for i in (2, 3) for k in (0, 1)}
        ),
    )
    rig.cycle(61)  # the owner of GPUs 0 and 1 is lent: all their replicas turn Healthy
    devices = kubelet.wait_devices(RES, lambda d: all(s.health == "Healthy" for s in d.values()))
    numa = {s.numa_nodes for d, s in devices.items() if d.startswith(f"spot-{rig.d[1]}")}
    assert numa == {(rig.devices[1].numa_node,)}


def test_two_replicas_of_one_gpu_sync_it_once(rig: Rig, kubelet: KubeletDouble) -> None:
    kubelet.wait_registered(RES)
    rig.cycle(0)
    rig.cycle(61)
    kubelet.wait_devices(
        RES,
        lambda d: all(
            d.get(f"spot-{rig.d[0]}::{k}") and d[f"spot-{rig.d[0]}::{k}"].health == "Healthy" for k in (0, 1)
        ),
    )
    (container,) = kubelet.allocate(RES, [f"spot-{rig.d[0]}::1", f"spot-{rig.d[0]}::0"]).container_responses
    assert json.loads(container.annotations[keys.DEVICES_FROM_PREFIX]) == {
        OWNER.format(): {"nvidia.com/gpu": [rig.d[0]]}
    }


def test_shared_users_are_evicted_together(rig: Rig) -> None:
    rig.cycle(0)
    rig.cycle(61)
    for name, replica in (("a", 0), ("b", 1)):
        ref = PodRef("spot", name)
        rig.add_pod(pod(ref, (("w", f"cid-{name}"),)))
        rig.tasks.add(f"cid-{name}", {})
        twin = DeviceID(f"spot-{rig.d[0]}::{replica}")
        rig.allocations.append(AllocatedDevices(ref, "w", SPOT_GPU_RESOURCE, (twin,)))
    rig.podres.set(rig.allocations)
    rig.cycle(1)
    assert rig.agent.solver.mapping.get_device_users(rig.d[0]) == (PodRef("spot", "a"), PodRef("spot", "b"))
    rig.guard.owner_back(OWNER)
    assert set(rig.tasks.stop_calls[-1]) == {"cid-a", "cid-b"}
