"""The snapshot's consistency checks: placements it cannot hold together are left out.

Pure: the translated nodes, pods and ShadowPods in, the ones kept (and GPUs' owners and twin
health adjusted) out, every pod left out reported through ``skip``; no I/O. Used by
:func:`spotgpu.kube.snapshot.build_snapshot` after translating the objects one by one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from spotgpu.core.ids import DeviceID
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import GPU_MILLI, Health
from spotgpu.kube.nodestate import SpotUse
from spotgpu.scheduler.model import Node, Pod, ShadowPod

SkipFn = Callable[[str, str, str], None]
"""Reports one object left out: (kind, key, reason)."""


def reported_use(use: Mapping[DeviceID, SpotUse], pod: PodRef) -> tuple[DeviceID, ...]:
    """The GPUs the agent reports ``pod`` using (sorted), or ``()``."""
    return tuple(sorted(d for d, u in use.items() if pod in u.pods))


def check_spot_use(
    nodes: list[Node],
    pods: list[Pod],
    spot_use: Mapping[str, Mapping[DeviceID, SpotUse]],
    skip: SkipFn,
) -> tuple[list[Node], list[Pod]]:
    """Leave out placed spot pods the snapshot could not hold together, and report GPUs whose
    shared replicas are all taken as Unhealthy twins (module docstring).

    Pods the agent reports on a GPU come first (they really run there), then the rest in
    creation order; each is kept when its GPUs can still take it: an exclusive pod needs GPUs
    without users, a shared one GPUs without an exclusive user and with its milli left.
    """
    placed = [p for p in pods if p.placed and p.request.is_spot]

    def reported(p: Pod) -> bool:
        use = spot_use.get(p.node or "", {})
        return any(p.ref in use.get(d, SpotUse()).pods for d in p.devices)

    exclusive: set[tuple[str, DeviceID]] = set()
    milli: dict[tuple[str, DeviceID], int] = {}
    users: dict[tuple[str, DeviceID], int] = {}
    left_out: set[PodRef] = set()
    for pod in sorted(placed, key=lambda p: (not reported(p), p.created_at, p.ref)):
        assert pod.node is not None
        slots = [(pod.node, d) for d in pod.devices]
        shared = pod.request.is_shared
        clash = next(
            (
                d
                for n, d in slots
                if (n, d) in exclusive
                or (not shared and users.get((n, d), 0))
                or (shared and milli.get((n, d), 0) + pod.request.milli > GPU_MILLI)
            ),
            None,
        )
        if clash is not None:
            left_out.add(pod.ref)
            skip(
                "Pod",
                pod.ref.format(),
                f"its {'shared' if shared else 'exclusive'} use of GPU {clash} on {pod.node} contradicts the "
                f"spot pods already there (the kubelet allocated another GPU than the scheduler assigned)",
            )
            continue
        for slot in slots:
            users[slot] = users.get(slot, 0) + 1
            if shared:
                milli[slot] = milli.get(slot, 0) + pod.request.milli
            else:
                exclusive.add(slot)
    full = {
        (name, d)
        for name, use in spot_use.items()
        for d, u in use.items()
        if u.replicas and max(users.get((name, d), 0), len(u.pods)) >= u.replicas
    }
    if full:
        nodes = [
            dataclasses.replace(
                n,
                gpus=tuple(
                    dataclasses.replace(g, twin=Health.UNHEALTHY) if (n.name, g.id) in full else g for g in n.gpus
                ),
            )
            if any((n.name, g.id) in full for g in n.gpus)
            else n
            for n in nodes
        ]
    return nodes, [p for p in pods if p.ref not in left_out]


def claim_devices(
    nodes: list[Node], pods: list[Pod], shadows: list[ShadowPod], skip: SkipFn
) -> tuple[list[Node], list[Pod], list[ShadowPod]]:
    """Make the GPUs' owners agree with what the scheduler itself placed; leave out placements
    the snapshot cannot hold (a node left out, a GPU its node does not report).

    The agent reports owners from the kubelet's allocations, so right after a ShadowPod or a
    reserved pod was placed its GPUs still show as unallocated: such a GPU gets the holder as
    owner (the kubelet is about to allocate it). A holder whose GPU the agent reports held by
    somebody else lost a race (say with a pod of another scheduler) and is left out.
    """
    claims: dict[tuple[str, DeviceID], ContainerRef] = {}
    kept_shadows: list[ShadowPod] = []
    kept_pods: list[Pod] = []
    owners: dict[tuple[str, DeviceID], ContainerRef | None] = {(n.name, g.id): g.owner for n in nodes for g in n.gpus}
    node_names = {n.name for n in nodes}

    def known(kind: str, ref: PodRef, node: str | None, devices: tuple[DeviceID, ...]) -> bool:
        # a placed pod on a node left out (no agent, malformed state) or on a GPU its node does not
        # report would make the whole snapshot invalid: leave that one pod out instead
        if node is None:
            return True
        if node not in node_names:
            skip(kind, ref.format(), f"placed on node {node}, which is not in the snapshot")
            return False
        unknown = [d for d in devices if (node, d) not in owners]
        if unknown:
            skip(kind, ref.format(), f"uses {', '.join(unknown)}, which node {node} does not report")
            return False
        return True

    def claim(kind: str, ref: PodRef, node: str, devices: tuple[DeviceID, ...], holder: ContainerRef) -> bool:
        for device in devices:
            current = owners.get((node, device))
            if current is not None and current != holder:
                skip(kind, ref.format(), f"GPU {device} on {node} is held by {current}, not {holder}")
                return False
        for device in devices:
            if owners.get((node, device), holder) is None:
                claims[(node, device)] = holder
        return True

    for shadow in shadows:
        if not known("ShadowPod", shadow.ref, shadow.node, shadow.devices):
            continue
        if shadow.deleting or claim("ShadowPod", shadow.ref, shadow.node, shadow.devices, shadow.container_ref):
            kept_shadows.append(shadow)
    for pod in pods:
        if not known("Pod", pod.ref, pod.node, pod.devices):
            continue
        if pod.node is None or pod.request.is_spot or claim("Pod", pod.ref, pod.node, pod.devices, pod.container_ref):
            kept_pods.append(pod)
    if not claims:
        return nodes, kept_pods, kept_shadows
    new_nodes = [
        dataclasses.replace(
            n,
            gpus=tuple(
                dataclasses.replace(g, owner=claims[(n.name, g.id)]) if (n.name, g.id) in claims else g for g in n.gpus
            ),
        )
        for n in nodes
    ]
    return new_nodes, kept_pods, kept_shadows


__all__ = ["SkipFn", "check_spot_use", "claim_devices", "reported_use"]
