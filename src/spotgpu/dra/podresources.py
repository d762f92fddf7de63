"""The node's device assignments with DRA claims: spot containers holding our devices by claim.

The agent learns who uses each GPU from pod-resources (:class:`~spotgpu.ports.node.PodResourcesPort`):
in device-plugin mode a spot container holds twin IDs of the spot resource. In DRA mode it
holds our devices through a claim instead, which pod-resources v1 reports per container as
``dynamic_resources`` (driver, pool, device). :class:`DraPodResources` reports each of those
(our driver, this node's pool, a device name of a twin of a GPU the node has) as the twin it
stands for, so the agent's MappingCache, eviction plan and kills are those of device-plugin
mode, unchanged: on the owner's return the spot containers using the GPU through DRA are killed
through containerd before the owner is released.

Side effects: gRPC calls to the kubelet's pod-resources socket (``List``, and
``GetAllocatableResources`` to learn the node's GPUs, cached until a device name is not found).
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from spotgpu.adapters.kubelet import LOCAL_CHANNEL_OPTIONS, pod_assignment, rpc_error
from spotgpu.adapters.proto import podresources_v1_pb2 as pr
from spotgpu.adapters.proto import podresources_v1_pb2_grpc as pr_grpc
from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import DeviceID, NodeName, ResourceName, replica_id, shared_resource_of, to_spot_id
from spotgpu.core.refs import PodRef
from spotgpu.dra.claim import DriverName
from spotgpu.dra.slices import device_name

log = logging.getLogger(__name__)

TwinTable = dict[str, tuple[ResourceName, DeviceID]]
"""Device name -> (spot resource, twin ID)."""


def twin_table(reals: builtins.list[DeviceID], spot: ResourceName, shared_replicas: int) -> TwinTable:
    """The device names our slices give the twins of ``reals`` (exclusive and shared replicas)."""
    table: TwinTable = {}
    known = set(reals)
    for real in reals:
        try:
            twins = [(spot, to_spot_id(real))]
            twins += [(shared_resource_of(spot), replica_id(real, i, known)) for i in range(shared_replicas)]
        except ValidationError:
            continue  # no twin: never published
        for resource, twin in twins:
            table[device_name(twin)] = (resource, twin)
    return table


def dra_rows(
    response: pr.ListPodResourcesResponse,
    driver: DriverName,
    node: NodeName,
    table: Callable[[str], tuple[ResourceName, DeviceID] | None],
) -> builtins.list[AllocatedDevices]:
    """One row per (container, twin) a container holds through a claim of our driver in our pool."""
    rows: builtins.list[AllocatedDevices] = []
    for pod in response.pod_resources:
        try:
            ref = PodRef(pod.namespace, pod.name)
        except ValidationError:
            continue
        for container in pod.containers:
            held: dict[ResourceName, builtins.list[DeviceID]] = {}
            for dynamic in container.dynamic_resources:
                for res in dynamic.claim_resources:
                    if res.driver_name != driver or res.pool_name != node:
                        continue
                    found = table(res.device_name)
                    if found is None:
                        log.warning(
                            "pod-resources: %s/%s holds unknown device %s", pod.namespace, pod.name, res.device_name
                        )
                        continue
                    held.setdefault(found[0], []).append(found[1])
            rows.extend(AllocatedDevices(ref, container.name, r, tuple(ids)) for r, ids in sorted(held.items()))
    return rows


class DraPodResources:
    """:class:`~spotgpu.ports.node.PodResourcesPort` over pod-resources v1, DRA claims included."""

    def __init__(
        self,
        socket: Path,
        *,
        driver: DriverName,
        node: NodeName,
        gpu_resource: ResourceName,
        spot_resource: ResourceName,
        shared_replicas: int = 0,
        timeout: float = 5.0,
    ) -> None:
        self.socket = socket
        self._driver = driver
        self._node = node
        self._gpu = gpu_resource
        self._spot = spot_resource
        self._replicas = shared_replicas
        self.timeout = timeout
        self._channel = grpc.insecure_channel(f"unix://{socket}", options=LOCAL_CHANNEL_OPTIONS)
        self._stub = pr_grpc.PodResourcesListerStub(self._channel)
        self._lock = threading.Lock()
        self._table: TwinTable | None = None

    def close(self) -> None:
        self._channel.close()

    def _twins(self, refresh: bool) -> TwinTable:
        with self._lock:
            if self._table is None or refresh:
                try:
                    answer = self._stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=self.timeout)
                except grpc.RpcError as exc:
                    raise rpc_error(f"pod-resources GetAllocatableResources on {self.socket}", exc) from None
                reals = [DeviceID(i) for d in answer.devices if d.resource_name == self._gpu for i in d.device_ids]
                self._table = twin_table(reals, self._spot, self._replicas)
            return self._table

    def _lookup(self, name: str) -> tuple[ResourceName, DeviceID] | None:
        found = self._twins(False).get(name)
        return found if found is not None else self._twins(True).get(name)

    def list(self, timeout: float | None = None) -> builtins.list[AllocatedDevices]:
        try:
            response = self._stub.List(
                pr.ListPodResourcesRequest(), timeout=timeout or self.timeout, wait_for_ready=True
            )
        except grpc.RpcError as exc:
            raise rpc_error(f"pod-resources List on {self.socket}", exc) from None
        rows: builtins.list[AllocatedDevices] = []
        for pod in response.pod_resources:
            assignment = pod_assignment(pod)
            try:
                ref = PodRef(assignment.namespace, assignment.name)
            except ValidationError:
                continue
            for container in assignment.containers:
                rows.extend(AllocatedDevices(ref, container.name, g.resource, g.ids) for g in container.devices)
        return rows + dra_rows(response, self._driver, self._node, self._lookup)


__all__ = ["DraPodResources", "TwinTable", "dra_rows", "twin_table"]
