"""Forged ShadowPods (issue 12, item 1), attacked through the agent's real device plugin.

A ShadowPod's GPUs get Healthy twins without activity detection, and other tenants' spot pods
are synced onto them. A tenant that annotates its own GPU pod ``pod-device-type: shadow`` must
not get that: its GPU, busy with its own work, must stay Unhealthy (the kubelet double, which
plays the kubelet's device manager over real gRPC, sees no lendable twin), the runtime's lend
rule must say no, and the forgery is counted and logged. Only a pod the scheduler made (its
namespace, label and annotation) is believed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spotgpu.core import keys
from spotgpu.core.ids import SPOT_GPU_RESOURCE, to_spot_id
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.testing.kubelet import KubeletDouble

from .helpers import Rig, gpu_alloc, make_rig, shadow_pod

RES = str(SPOT_GPU_RESOURCE)


@pytest.fixture
def rig(tmp_path: Path, kubelet: KubeletDouble) -> Iterator[Rig]:
    rig = make_rig(tmp_path, plugin=True)
    try:
        kubelet.wait_registered(RES)
        yield rig
    finally:
        rig.agent.stop()


def _hold(rig: Rig, ref: PodRef, gpu: str, *, labels: dict[str, str] | None = None) -> None:
    """The tenant's pod as the API shows it, and the kubelet's allocation of ``gpu`` to it."""
    rig.add_pod(shadow_pod(ref, [gpu], labels=labels))
    rig.allocations.append(gpu_alloc(ContainerRef(ref.namespace, ref.name, "main"), [gpu]))
    rig.podres.set(rig.allocations)
    rig.cycle(0)


@pytest.mark.parametrize(
    ("namespace", "labels"),
    [
        ("team-b", {}),  # the annotation alone: what any tenant can write
        ("team-b", {keys.SHADOW_POD_LABEL: "true"}),  # and the label, in its own namespace
        (keys.DEFAULT_SHADOW_NAMESPACE, {}),  # in the right namespace (somehow) but unlabelled
    ],
)
def test_a_forged_shadow_pod_gets_no_lendable_twin(
    rig: Rig, kubelet: KubeletDouble, namespace: str, labels: dict[str, str]
) -> None:
    gpu = rig.d[2]
    _hold(rig, PodRef(namespace, "my-training"), gpu, labels=labels)
    devices = kubelet.wait_devices(RES, lambda d: len(d) == 4)
    assert devices[to_spot_id(gpu)].health == "Unhealthy"  # an ordinary, active owner
    assert rig.agent.lendable(gpu) is False  # the runtime's lend rule refuses any sync of it
    assert rig.agent.solver.mapping.get_device_owner(gpu) == ContainerRef(namespace, "my-training", "main")
    assert rig.agent.metrics.sample("spotgpu_agent_forged_shadow_pods", {}) == 1


def test_the_schedulers_shadow_pod_is_believed(rig: Rig, kubelet: KubeletDouble) -> None:
    gpu = rig.d[2]
    _hold(rig, PodRef(keys.DEFAULT_SHADOW_NAMESPACE, "s-shadow-1"), gpu)
    kubelet.wait_devices(RES, lambda d: to_spot_id(gpu) in d and d[to_spot_id(gpu)].health == "Healthy")
    assert rig.agent.lendable(gpu) is True
    assert rig.agent.metrics.sample("spotgpu_agent_forged_shadow_pods", {}) == 0
