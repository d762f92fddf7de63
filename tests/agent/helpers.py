"""Builders shared by the agent tests: pods, pod-resources rows, an agent on fakes."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.agent.service import Agent, RuntimeServiceFactory, TwinHostFactory
from spotgpu.core import keys
from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.clock import ManualClock
from spotgpu.core.config import AgentConfig, EvictionConfig, LendingConfig, LendPolicyKind
from spotgpu.core.configfile import Seconds
from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE, DeviceID, NodeName, to_spot_id
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.ports.kube import ContainerInfo, PodEvent, PodEventType, PodInfo
from spotgpu.ports.node import GpuDevice, LendStore, ReleaseCheck
from spotgpu.testing.fakes import (
    FakeAttributor,
    FakeGpuBackend,
    FakeGuard,
    FakeKube,
    FakePodResources,
    FakeTasks,
    fake_devices,
)

NODE = NodeName("gpu-node-1")
OWNER = ContainerRef("dev", "devbox", "main")


def pod(
    ref: PodRef,
    containers: Sequence[tuple[str, str | None]] = (("main", None),),
    *,
    annotations: dict[str, str] | None = None,
    deleting: bool = False,
) -> PodInfo:
    return PodInfo(
        ref,
        uid=f"uid-{ref.name}",
        node=NODE,
        phase="Running",
        annotations=annotations or {},
        containers=tuple(ContainerInfo(n, cid) for n, cid in containers),
        deleting=deleting,
    )


def shadow_pod(ref: PodRef, devices: Sequence[str], *, labels: dict[str, str] | None = None) -> PodInfo:
    """A ShadowPod as the scheduler creates it (``labels`` overrides its label: forgeries)."""
    return dataclasses.replace(
        pod(
            ref,
            (("main", f"cid-{ref.name}"),),
            annotations={
                keys.POD_DEVICE_TYPE: "shadow",
                keys.ASSIGNED_DEVICES: json.dumps({"nvidia.com/gpu": list(devices)}),
            },
        ),
        labels={keys.SHADOW_POD_LABEL: "true"} if labels is None else labels,
    )


def gpu_alloc(owner: ContainerRef, devices: Sequence[str]) -> AllocatedDevices:
    return AllocatedDevices(owner.pod_ref, owner.name, NVIDIA_GPU_RESOURCE, tuple(DeviceID(d) for d in devices))


def spot_alloc(pod_ref: PodRef, container: str, real_devices: Sequence[str]) -> AllocatedDevices:
    return AllocatedDevices(pod_ref, container, SPOT_GPU_RESOURCE, tuple(to_spot_id(d) for d in real_devices))


def cri_labels(pod_ref: PodRef, container: str) -> dict[str, str]:
    return {
        keys.LABEL_POD_NAMESPACE: pod_ref.namespace or "",
        keys.LABEL_POD_NAME: pod_ref.name,
        keys.LABEL_CONTAINER_NAME: container,
        keys.LABEL_CRI_KIND: "container",
    }


@dataclass
class Rig:
    """An agent on fakes with a manual clock; one owner ``OWNER`` holding GPUs 0 and 1."""

    agent: Agent
    clock: ManualClock
    kube: FakeKube
    guard: FakeGuard
    tasks: FakeTasks
    podres: FakePodResources
    backend: FakeGpuBackend
    devices: list[GpuDevice]
    attributor: FakeAttributor
    allocations: list[AllocatedDevices] = field(default_factory=list)

    @property
    def d(self) -> list[DeviceID]:
        return [d.id for d in self.devices]

    def add_pod(self, info: PodInfo) -> None:
        """The API gets the pod and the agent's pod cache the watch event (no watch thread here)."""
        self.kube.add_pod(info)
        self.agent.on_pod_event(PodEvent(PodEventType.ADDED, info))

    def add_spot(self, name: str, devices: Sequence[str], container_id: str, namespace: str = "spot") -> PodRef:
        ref = PodRef(namespace, name)
        self.add_pod(pod(ref, (("worker", container_id),)))
        self.tasks.add(container_id, cri_labels(ref, "worker"))
        self.allocations.append(spot_alloc(ref, "worker", devices))
        self.podres.set(self.allocations)
        return ref

    def add_shadow(self, devices: Sequence[str], name: str = "shadow-1") -> ContainerRef:
        """An authentic ShadowPod (the scheduler's: its namespace, label and annotation) that the
        kubelet admitted holding ``devices``."""
        ref = PodRef(keys.DEFAULT_SHADOW_NAMESPACE, name)
        info = shadow_pod(ref, devices)
        self.add_pod(info)
        holder = ContainerRef(ref.namespace, ref.name, "main")
        self.allocations.append(gpu_alloc(holder, devices))
        self.podres.set(self.allocations)
        return holder

    def remove_pod(self, ref: PodRef) -> None:
        self.allocations = [a for a in self.allocations if a.pod != ref]
        self.podres.set(self.allocations)

    def cycle(self, advance: float = 0.0) -> None:
        self.clock.advance(advance)
        self.agent.detect_once()


def make_rig(
    tmp_path: Path,
    *,
    gpus: int = 4,
    max_inactive: float = 60.0,
    guard: FakeGuard | None = None,
    start: bool = True,
    plugin: bool = False,
    replicas: int = 1,
    shared: int = 0,
    store: LendStore | None = None,
    runtime_service: RuntimeServiceFactory | None = None,
    owner_record: Path | None = None,
    lending: LendingConfig | None = None,
    eviction: EvictionConfig | None = None,
    tasks: FakeTasks | None = None,
    release_check: ReleaseCheck | None = None,
    debug_address: str = "127.0.0.1:0",
    twin_host: TwinHostFactory | None = None,
) -> Rig:
    devices = fake_devices(gpus)
    clock = ManualClock(start=1000.0)
    kube = FakeKube([pod(OWNER.pod_ref, (("main", "owner-cid"),))])
    guard = guard or FakeGuard()
    tasks = tasks or FakeTasks()
    tasks.add("owner-cid", cri_labels(OWNER.pod_ref, "main"), pid=4242)
    allocations = [gpu_alloc(OWNER, [devices[0].id, devices[1].id])]
    podres = FakePodResources(allocations)
    backend = FakeGpuBackend(devices)
    attributor = FakeAttributor()
    config = AgentConfig(
        node_name=NODE,
        detect_interval=Seconds(10.0),
        max_inactive_time=Seconds(max_inactive),
        device_plugin_dir=tmp_path / "device-plugins",
        metrics_address="127.0.0.1:0",
        debug_address=debug_address,
        runtime_socket=tmp_path / "agent.sock",
        twin_replicas=replicas,
        shared_replicas=shared,
        lending=lending or LendingConfig(LendPolicyKind.TIMER),  # the rig lends at the first judgement
        eviction=eviction or EvictionConfig(),
    )
    agent = Agent(
        config,
        node=NODE,
        kube=kube,
        backend=backend,
        tasks=tasks,
        pod_resources=podres,
        guard_factory=lambda handler: _attach(guard, handler),
        clock=clock,
        metrics=AgentMetrics(),
        serve_device_plugin=plugin,
        attributor=attributor,
        store=store,
        runtime_service=runtime_service,
        owner_record=owner_record,
        release_check=release_check,
        twin_host=twin_host,
    )
    rig = Rig(agent, clock, kube, guard, tasks, podres, backend, devices, attributor, allocations)
    if start:
        agent.start(serve_metrics=False, loops=False)
    return rig


def _attach(guard: FakeGuard, handler: object) -> FakeGuard:
    guard.handler = handler  # type: ignore[assignment]
    return guard


def mount_namespace_fds() -> set[int]:
    """This process's fds that name a mount namespace (``mnt:[...]``)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("mnt:["):
                found.add(int(name))
        except OSError:
            continue  # the listing's own fd, closed by now
    return found
