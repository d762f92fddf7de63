"""The kubelet's pod-resources API v1 as a protocol-level double over real gRPC on a unix socket.

No kubelet can run on a test machine; :class:`PodResourcesDouble` serves ``List``, ``Get`` and
``GetAllocatableResources`` from a table the test sets, in the real wire format (our .proto,
same method paths and field numbers). Side effects: a gRPC server and its threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from spotgpu.adapters.proto import podresources_v1_pb2 as pr
from spotgpu.adapters.proto import podresources_v1_pb2_grpc as pr_grpc
from spotgpu.testing.grpcserver import Server


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    resource: str
    device_ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One device a container holds through a ResourceClaim (``dynamic_resources``)."""

    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...] = ()
    cpu_ids: tuple[int, ...] = ()
    claims: tuple[ClaimDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class PodResources:
    namespace: str
    name: str
    containers: tuple[ContainerResources, ...] = ()


def _topology(nodes: Sequence[int]) -> pr.TopologyInfo | None:
    return pr.TopologyInfo(nodes=[pr.NUMANode(ID=n) for n in nodes]) if nodes else None


def _pod_message(pod: PodResources) -> pr.PodResources:
    return pr.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=[
            pr.ContainerResources(
                name=c.name,
                cpu_ids=list(c.cpu_ids),
                devices=[
                    pr.ContainerDevices(
                        resource_name=d.resource, device_ids=list(d.device_ids), topology=_topology(d.numa_nodes)
                    )
                    for d in c.devices
                ],
                dynamic_resources=[
                    pr.DynamicResource(
                        claim_name=d.claim_name,
                        claim_namespace=d.claim_namespace,
                        claim_resources=[
                            pr.ClaimResource(
                                cdi_devices=[pr.CDIDevice(name=i) for i in d.cdi_ids],
                                driver_name=d.driver,
                                pool_name=d.pool,
                                device_name=d.device,
                            )
                        ],
                    )
                    for d in c.claims
                ],
            )
            for c in pod.containers
        ],
    )


class PodResourcesDouble(Server):
    """The kubelet's pod-resources API v1 on ``socket`` (see module docstring).

    ``get_enabled=False`` behaves like a kubelet older than 1.34 without the
    ``KubeletPodResourcesGet`` gate: ``Get`` fails and clients must fall back to ``List``.
    """

    def __init__(self, socket: Path, *, get_enabled: bool = True) -> None:
        super().__init__(socket)
        self.get_enabled = get_enabled
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], PodResources] = {}
        self._allocatable: list[ContainerDevices] = []
        self.calls: dict[str, int] = {"List": 0, "Get": 0, "GetAllocatableResources": 0}

    def _add_servicers(self, server: grpc.Server) -> None:
        pr_grpc.add_PodResourcesListerServicer_to_server(_PodResourcesServicer(self), server)

    def set_pods(self, pods: Sequence[PodResources]) -> None:
        with self._lock:
            self._pods = {(p.namespace, p.name): p for p in pods}

    def upsert_pod(self, pod: PodResources) -> None:
        with self._lock:
            self._pods[(pod.namespace, pod.name)] = pod

    def remove_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            self._pods.pop((namespace, name), None)

    def set_allocatable(self, devices: Sequence[ContainerDevices]) -> None:
        with self._lock:
            self._allocatable = list(devices)

    def pods(self) -> list[PodResources]:
        with self._lock:
            return list(self._pods.values())

    def _count(self, method: str) -> None:
        with self._lock:
            self.calls[method] += 1


class _PodResourcesServicer(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, double: PodResourcesDouble) -> None:
        self._d = double

    def List(self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext) -> pr.ListPodResourcesResponse:
        self._d._count("List")
        return pr.ListPodResourcesResponse(pod_resources=[_pod_message(p) for p in self._d.pods()])

    def Get(self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext) -> pr.GetPodResourcesResponse:
        self._d._count("Get")
        if not self._d.get_enabled:
            context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled via feature gate")
        for pod in self._d.pods():
            if pod.namespace == request.pod_namespace and pod.name == request.pod_name:
                return pr.GetPodResourcesResponse(pod_resources=_pod_message(pod))
        context.abort(grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} not found in namespace {request.pod_namespace}")
        raise AssertionError("unreachable")  # abort raises

    def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        self._d._count("GetAllocatableResources")
        with self._d._lock:
            devices = list(self._d._allocatable)
        return pr.AllocatableResourcesResponse(
            devices=[
                pr.ContainerDevices(
                    resource_name=d.resource, device_ids=list(d.device_ids), topology=_topology(d.numa_nodes)
                )
                for d in devices
            ]
        )


__all__ = ["ClaimDevice", "ContainerDevices", "ContainerResources", "PodResources", "PodResourcesDouble"]
