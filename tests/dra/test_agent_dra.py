"""``agent.mode: dra`` inside the agent: the agent's twin lists become ResourceSlices (in the
API double), lending clears the taint, the owner's return puts ``NoExecute`` on the device and
removes the claim's CDI spec at once, Unprepare ends the return; the kubelet DRA double prepares
over real gRPC. Ports other than the API are the agent's in-memory fakes."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from tests.agent.helpers import NODE, OWNER, Rig, make_rig
from tests.dra.helpers import claim

from spotgpu.agent.build import build_agent
from spotgpu.agent.service import Agent
from spotgpu.core.config import AgentConfig, AgentMode, DraConfig
from spotgpu.core.errors import PermanentError
from spotgpu.core.ids import DeviceID, ResourceName
from spotgpu.core.lending import LendState
from spotgpu.dra.host import DraHost
from spotgpu.dra.slices import NOT_LENDABLE_TAINT, OWNER_RETURNED_TAINT, device_name
from spotgpu.kube.client import connect
from spotgpu.kube.dra_port import KubeDraApi
from spotgpu.ports.lookup import Allocation
from spotgpu.testing.fakes import FakeKube
from spotgpu.testing.kubeapi import KubeApiServer
from spotgpu.testing.kubeapi_dra import dra_api
from spotgpu.testing.kubelet_dra import KubeletDraDouble

DRIVER = "gpu.spotgpu.io"


class Node:
    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="draag.", dir="/tmp"))
        self.api: KubeApiServer = dra_api().start()
        self.api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        self.kubelet = KubeletDraDouble(self.base / "registry").start()
        self.config = DraConfig(
            registry_dir=self.base / "registry",
            plugins_dir=self.base / "plugins",
            cdi_dir=self.base / "cdi",
            vendor_cdi_dirs=(),
            republish_interval=60.0,  # the test steps the host itself
        )
        self.host: DraHost | None = None

    def factory(self, agent: Agent) -> DraHost:
        def allocate(resource: ResourceName, devices: Sequence[DeviceID]) -> Allocation:
            return Allocation(envs=(("NVIDIA_VISIBLE_DEVICES", ",".join(devices)),))

        self.host = DraHost(
            self.config,
            node=agent.node,
            gpu_resource=agent.config.gpu_resource,
            spot_resource=agent.config.spot_resource,
            api=KubeDraApi(connect(url=self.api.url)),
            owner_of=agent.owner_of,
            lendable=agent.lendable,
            allocate=allocate,
            devices=agent.solver.devices,
            forecasts=agent.solver.idle_forecasts,
        )
        return self.host

    def taints(self) -> dict[str, set[tuple[str, str]]]:
        [stored] = self.api.objects("resource.k8s.io", "resourceslices")
        return {d["name"]: {(t["key"], t["effect"]) for t in d.get("taints", ())} for d in stored["spec"]["devices"]}

    def close(self) -> None:
        self.kubelet.close()
        self.api.stop()
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Node, Rig]]:
    n = Node()
    rig = make_rig(tmp_path, twin_host=n.factory)
    try:
        yield n, rig
    finally:
        rig.agent.stop()
        n.close()


def test_lend_prepare_return_unprepare(node: tuple[Node, Rig]) -> None:
    n, rig = node
    assert n.host is not None and not rig.agent.plugins
    n.host.step()
    d0, d1, d2 = (device_name("spot-" + d) for d in rig.d[:3])
    taints = n.taints()
    assert taints[d0] == taints[d1] == {(NOT_LENDABLE_TAINT, "NoSchedule")}  # the owner is active
    # unallocated and held by no ShadowPod: its twin is Unhealthy in device-plugin mode too
    assert taints[d2] == {(NOT_LENDABLE_TAINT, "NoSchedule")}
    rig.cycle(0)
    rig.cycle(61)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.LENT
    n.host.step()
    assert n.taints()[d0] == set()
    [stored] = n.api.objects("resource.k8s.io", "resourceslices")
    lent = next(d for d in stored["spec"]["devices"] if d["name"] == d0)
    assert lent["attributes"]["idleForecastSeconds"]["int"] >= 0, "the lent GPU carries its owner's idle forecast"

    key = n.api.put(claim([d0], pool=NODE, driver=DRIVER))["metadata"]
    answer = n.kubelet.prepare(DRIVER, [(key["namespace"], key["name"], key["uid"])])[key["uid"]]
    assert answer.error == "", answer.error
    assert list((n.base / "cdi").glob("*.json"))

    rig.guard.owner_back(OWNER)  # the owner returns
    assert not list((n.base / "cdi").glob("*.json")), "the spec is unlinked when the twins turn Unhealthy"
    n.host.step()
    assert n.taints()[d0] == {(NOT_LENDABLE_TAINT, "NoSchedule"), (OWNER_RETURNED_TAINT, "NoExecute")}
    assert n.taints()[d1] == {(NOT_LENDABLE_TAINT, "NoSchedule")}
    assert not list((n.base / "cdi").glob("*.json")), "the claim's CDI spec is gone at the return"
    assert "not-lent" in n.kubelet.prepare(DRIVER, [(key["namespace"], key["name"], key["uid"])])[key["uid"]].error
    health = {d: s for _, d, s, _ in n.kubelet.wait_health(DRIVER, lambda h: len(h) == 4)}
    assert health[d0] == 2  # UNHEALTHY while the return is under way

    assert n.kubelet.unprepare(DRIVER, [(key["namespace"], key["name"], key["uid"])]) == {key["uid"]: ""}
    n.host.step()
    assert n.taints()[d0] == {(NOT_LENDABLE_TAINT, "NoSchedule")}, "eviction done: NoExecute lifted"


def test_build_agent_in_dra_mode_needs_the_api_and_serves_no_device_plugin(tmp_path: Path) -> None:
    config = AgentConfig(node_name=NODE, mode=AgentMode.DRA, device_plugin_dir=tmp_path / "dp")
    with pytest.raises(PermanentError, match="no Kubernetes API for DRA"):
        build_agent(config, node=NODE, kube=FakeKube(), backend=make_rig(tmp_path, start=False).backend)
