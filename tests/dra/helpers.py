"""Claims, twins and node views the DRA tests share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE, DeviceID, NodeName
from spotgpu.core.mapping_cache import IDLE_SPACE, Owner
from spotgpu.core.refs import ContainerRef
from spotgpu.dra.claim import DriverName
from spotgpu.dra.decide import NodeView
from spotgpu.dra.slices import Publication, TwinDevice, TwinState, publication
from spotgpu.runtime.sync import SyncPolicy

DRIVER = DriverName("gpu.spotgpu.io")
NODE = NodeName("node-a")
OWNER = ContainerRef("team", "trainer", "main")
GPU0, GPU1, GPU2 = DeviceID("GPU-0aa"), DeviceID("GPU-1bb"), DeviceID("GPU-2cc")
POLICY = SyncPolicy(SPOT_GPU_RESOURCE, frozenset({NVIDIA_GPU_RESOURCE}), frozenset({"*"}))


def twins(states: Mapping[DeviceID, TwinState]) -> list[TwinDevice]:
    return [
        TwinDevice(DeviceID("spot-" + real), real, state, model="H200", memory_bytes=141 * 2**30, numa_node=0)
        for real, state in states.items()
    ]


class Node:
    """Owners and lending state as the agent records them (mutable for the tests)."""

    def __init__(self) -> None:
        self.owners: dict[DeviceID, Owner] = {GPU0: OWNER, GPU1: OWNER, GPU2: IDLE_SPACE}
        self.lent: dict[DeviceID, bool] = {GPU0: True, GPU1: False, GPU2: True}

    def states(self) -> dict[DeviceID, TwinState]:
        return {d: TwinState.LENDABLE if self.lent.get(d) else TwinState.NOT_LENDABLE for d in self.owners}

    def publication(self) -> Publication:
        return publication(twins(self.states()))

    def view(self, node: NodeName = NODE) -> NodeView:
        return NodeView(DRIVER, node, self.publication(), self.owners.get, self.lent.get, POLICY, NVIDIA_GPU_RESOURCE)


def claim(
    devices: Sequence[str] = ("spot-gpu-0aa",),
    *,
    uid: str = "0f0e-uid-1",
    name: str = "spot-claim",
    namespace: str = "spot",
    pool: str = NODE,
    driver: str = DRIVER,
    reserved: bool = True,
    allocated: bool = True,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {
            "devices": {"results": [{"request": "gpu", "driver": driver, "pool": pool, "device": d} for d in devices]},
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pool]}]}]
            },
        }
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "spot-job-0", "uid": "pod-uid-1"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "spot-gpu.spotgpu.io"}}]}},
        "status": status,
    }
