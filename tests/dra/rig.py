"""A DRA node on one machine: the API double, the driver and plugin, and the kubelet double."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.dra.helpers import DRIVER, NODE, Node

from spotgpu.core.ids import DeviceID, ResourceName
from spotgpu.dra.cdi import CdiDir
from spotgpu.dra.checkpoint import Checkpoint
from spotgpu.dra.driver import DraDriver
from spotgpu.dra.plugin import DeviceHealth, DraPlugin
from spotgpu.dra.publisher import SlicePublisher
from spotgpu.dra.slices import TwinState
from spotgpu.kube.client import connect
from spotgpu.kube.dra_port import KubeDraApi
from spotgpu.ports.lookup import Allocation, DeviceNodeSpec
from spotgpu.testing.kubeapi import KubeApiServer
from spotgpu.testing.kubeapi_dra import dra_api
from spotgpu.testing.kubelet_dra import KubeletDraDouble


@dataclass
class Rig:
    base: Path
    api: KubeApiServer
    port: KubeDraApi
    node: Node
    kubelet: KubeletDraDouble
    host_device: str
    plugin: DraPlugin | None = None
    driver: DraDriver | None = None
    allocations: int = 0

    @property
    def cdi_dir(self) -> Path:
        return self.base / "cdi"

    def allocate(self, resource: ResourceName, devices: Sequence[DeviceID]) -> Allocation:
        self.allocations += 1
        return Allocation(
            envs=(("NVIDIA_VISIBLE_DEVICES", ",".join(devices)),),
            devices=(DeviceNodeSpec("/dev/nvidia0", self.host_device, "rw"),),
        )

    def health(self) -> list[DeviceHealth]:
        states = self.node.states()
        return [
            DeviceHealth(NODE, name, states[t.real] is not TwinState.RETURNING, states[t.real].value)
            for name, t in self.node.publication().devices
        ]

    def start_plugin(self) -> DraPlugin:
        cdi = CdiDir(self.cdi_dir, vendor_dirs=[self.base / "vendor-cdi"], vendor_kind="nvidia.com/gpu")
        self.driver = DraDriver(
            self.port,
            self.node.view,
            self.allocate,
            cdi,
            Checkpoint(self.base / "state" / "checkpoint.json"),
            lock_file=self.base / "plugins" / DRIVER / "serialize.lock",
        )
        self.plugin = DraPlugin(
            DRIVER, self.driver, self.health, registry_dir=self.base / "registry", plugins_dir=self.base / "plugins"
        )
        self.plugin.start()
        return self.plugin

    def stop_plugin(self) -> None:
        assert self.plugin is not None
        self.plugin.stop()
        deadline = time.monotonic() + 5
        while self.kubelet.registered(DRIVER) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.plugin = None

    def publisher(self) -> SlicePublisher:
        return SlicePublisher(self.port, DRIVER, NODE, self.node.publication, time.time)

    def put_claim(self, obj: dict[str, Any]) -> tuple[str, str, str]:
        """Store ``obj``; ``(namespace, name, uid)`` as the kubelet names it (the server chose the UID)."""
        meta = self.api.put(obj)["metadata"]
        return meta["namespace"], meta["name"], meta["uid"]

    def spec_files(self) -> list[str]:
        return sorted(p.name for p in self.cdi_dir.glob("*.json")) if self.cdi_dir.exists() else []


@contextmanager
def dra_rig(host_device: str = "/dev/null") -> Iterator[Rig]:
    base = Path(tempfile.mkdtemp(prefix="dra.", dir="/tmp"))  # short: unix socket paths
    api = dra_api().start()
    kubelet = KubeletDraDouble(base / "registry").start()
    rig = Rig(base, api, KubeDraApi(connect(url=api.url)), Node(), kubelet, host_device)
    api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    try:
        yield rig
    finally:
        if rig.plugin is not None:
            rig.plugin.stop()
        kubelet.close()
        api.stop()
        shutil.rmtree(base, ignore_errors=True)
