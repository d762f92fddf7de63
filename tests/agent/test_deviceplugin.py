"""The spot-gpu device plugin against the kubelet double over real gRPC on unix sockets.

No kubelet can run here; :class:`~spotgpu.testing.kubelet.KubeletDouble` speaks the kubelet's
side of device plugin API v1beta1 (Registration server that dials back and calls
GetDevicePluginOptions before answering, ListAndWatch, Allocate) and restarts like a kubelet
(deleting every socket in the directory).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2 as dp
from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from spotgpu.core import keys
from spotgpu.core.codec import parse_devices_from
from spotgpu.core.ids import SPOT_GPU_RESOURCE, to_spot_id
from spotgpu.testing.kubelet import KubeletDouble

from .helpers import OWNER, Rig, make_rig

RES = str(SPOT_GPU_RESOURCE)


@pytest.fixture
def rig(tmp_path: Path, kubelet: KubeletDouble) -> Iterator[Rig]:
    rig = make_rig(tmp_path, plugin=True)
    try:
        yield rig
    finally:
        rig.agent.stop()


def twins(rig: Rig, *idx: int) -> set[str]:
    return {to_spot_id(rig.d[i]) for i in idx}


def test_registers_after_serving_and_streams_twins_with_numa(rig: Rig, kubelet: KubeletDouble) -> None:
    reg = kubelet.wait_registered(RES)
    assert reg.version == "v1beta1" and reg.endpoint == "spotgpu-spot-gpu.sock"
    assert not reg.pre_start_required and reg.get_preferred_allocation_available  # steering
    devices = kubelet.wait_devices(RES, lambda d: len(d) == 4)
    assert {d: s.numa_nodes for d, s in devices.items()} == {to_spot_id(x.id): (x.numa_node,) for x in rig.devices}
    assert kubelet.healthy(RES) == twins(rig, 2, 3)


def test_health_change_streams_the_full_list(rig: Rig, kubelet: KubeletDouble) -> None:
    kubelet.wait_devices(RES, lambda d: len(d) == 4)
    before = kubelet.updates(RES)
    rig.cycle(0)
    rig.cycle(61)  # owner idle -> lent
    devices = kubelet.wait_devices(RES, lambda d: all(s.health == "Healthy" for s in d.values()))
    assert len(devices) == 4
    assert kubelet.updates(RES) > before


def test_allocate_answers_the_devices_from_annotation(rig: Rig, kubelet: KubeletDouble) -> None:
    kubelet.wait_registered(RES)
    rig.cycle(0)
    rig.cycle(61)
    kubelet.wait_devices(RES, lambda d: all(s.health == "Healthy" for s in d.values()))
    response = kubelet.allocate(RES, [to_spot_id(rig.d[1]), to_spot_id(rig.d[0])])
    (container,) = response.container_responses
    assert set(container.annotations) == {keys.DEVICES_FROM_PREFIX}
    parsed = parse_devices_from(container.annotations[keys.DEVICES_FROM_PREFIX])
    (source,) = parsed.sources
    assert source.ref == OWNER
    assert set(source.devices("nvidia.com/gpu")) == {rig.d[0], rig.d[1]}
    assert json.loads(container.annotations[keys.DEVICES_FROM_PREFIX]) == {
        "dev/devbox/main": {"nvidia.com/gpu": [rig.d[1], rig.d[0]]}
    }


def test_allocate_refuses_unhealthy_and_unknown_twins(rig: Rig, kubelet: KubeletDouble) -> None:
    kubelet.wait_registered(RES)
    kubelet.wait_devices(RES, lambda d: len(d) == 4)
    with pytest.raises(grpc.RpcError) as err:
        kubelet.allocate(RES, [to_spot_id(rig.d[0])])  # owner active: Unhealthy
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "Unhealthy" in (err.value.details() or "")
    with pytest.raises(grpc.RpcError) as err:
        kubelet.allocate(RES, ["spot-GPU-nonexistent"])
    assert "not a twin this plugin serves" in (err.value.details() or "")


def test_allocate_refuses_an_unallocated_gpu_without_shadow_pod(rig: Rig, kubelet: KubeletDouble) -> None:
    kubelet.wait_registered(RES)
    kubelet.wait_devices(RES, lambda d: len(d) == 4)
    calls = rig.podres.calls
    with pytest.raises(grpc.RpcError) as err:
        kubelet.allocate(RES, [to_spot_id(rig.d[3])])
    assert "no ShadowPod" in (err.value.details() or "")
    assert rig.podres.calls == calls + 1  # it re-read pod-resources before refusing


def test_kubelet_restart_serves_again_and_reregisters(rig: Rig, kubelet: KubeletDouble) -> None:
    kubelet.wait_registered(RES, count=1)
    kubelet.wait_devices(RES, lambda d: len(d) == 4)
    plugin = rig.agent.plugin
    assert plugin is not None
    kubelet.restart()  # deletes our socket too
    kubelet.wait_registered(RES, count=2, timeout=15)
    assert plugin.socket.is_socket()
    devices = kubelet.wait_devices(RES, lambda d: len(d) == 4)
    assert {d for d, s in devices.items() if s.health == "Healthy"} == twins(rig, 2, 3)


def test_registration_waits_for_a_late_kubelet(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, plugin=True)
    try:
        plugin = rig.agent.plugin
        assert plugin is not None and not plugin.registered
        with KubeletDouble(tmp_path / "device-plugins") as kubelet:
            kubelet.wait_registered(RES, timeout=15)
            assert kubelet.wait_devices(RES, lambda d: len(d) == 4)
    finally:
        rig.agent.stop()


def test_stop_ends_streams_and_removes_the_socket(rig: Rig, kubelet: KubeletDouble) -> None:
    kubelet.wait_registered(RES)
    plugin = rig.agent.plugin
    assert plugin is not None and plugin.socket.is_socket()
    rig.agent.stop()
    assert not plugin.socket.exists()


def test_options_and_preferred_allocation_over_the_wire(rig: Rig, kubelet: KubeletDouble) -> None:
    kubelet.wait_registered(RES)
    plugin = rig.agent.plugin
    assert plugin is not None
    with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
        stub = dp_grpc.DevicePluginStub(channel)
        options = stub.GetDevicePluginOptions(dp.Empty(), timeout=5)
        assert not options.pre_start_required and options.get_preferred_allocation_available
        stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=["x"]), timeout=5)
    rig.agent.solver.settings = dataclasses.replace(rig.agent.solver.settings, candidate_wait=0.01)  # no pod waits
    free = sorted(twins(rig, 2, 3))
    # must_include always comes first; IDs the plugin does not serve are never preferred
    assert kubelet.preferred_allocation(RES, [*free, "spot-unknown"], [free[1]], 2) == [free[1], free[0]]
    assert kubelet.preferred_allocation(RES, ["a", "b"], [], 1) == []
