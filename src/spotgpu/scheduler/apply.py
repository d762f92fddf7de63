"""The model-level applier: what a cycle's decisions do to the snapshot they were made from.

Pure; no I/O, no clock (``now`` is an argument). The one statement of each decision's effect on
the model, shared by the tests (:func:`apply_result`, to run cycles in a row), the simulator
(which checks every cycle's decisions with it before acting them out with its latencies) and the
Kubernetes applier's test (which applies the same result through the API and compares the
snapshot built from the API objects with this one):

* ``Evict``: the pod is gone (``evicted="gone"``; a reserved pod's GPUs become unallocated) or
  marked as being evicted (``"evicting"``, the in-between state);
* ``DeleteShadowPod``: the ShadowPod is gone (its GPUs unallocated) or marked deleting;
* ``ClearNomination`` / ``Nominate``: the pod's nomination is dropped / recorded;
* ``CreateShadowPod``: a ShadowPod created at ``now`` holds the devices (their owner);
* ``Bind``: the pod is placed on the node and devices, started at ``now``, its nomination gone;
  a reserved pod's container becomes its GPUs' owner and their twins Unhealthy (the owner is
  starting); a spot pod's devices keep their owner, which must be the bind's device owner;
* ``PodGroupStatus``: the PodGroup's phase.

Decisions that name something the snapshot does not have (an unknown pod, a device not on the
bind's node, a spot bind whose device owner is not the GPU's owner, a status for an unknown
PodGroup) raise :class:`ApplyError`. The applier does not judge the decisions otherwise (two
users on one twin, a reserved pod onto a ShadowPod's GPU): the snapshot check of the next cycle
and the simulator's invariant checker do.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from spotgpu.core.ids import DeviceID, NodeName
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import Health
from spotgpu.scheduler.decisions import (
    Bind,
    ClearNomination,
    CreateShadowPod,
    CycleResult,
    DeleteShadowPod,
    Evict,
    Nominate,
    PodGroupStatus,
)
from spotgpu.scheduler.model import GPU, Nomination, Pod, PodGroup, ShadowPod, Snapshot

Evicted = Literal["gone", "evicting"]


class ApplyError(ValueError):
    """A decision names something its snapshot does not have; the message says what."""


class ModelApplier:
    """Applies decisions, one at a time or a whole :class:`CycleResult`, to a snapshot's model."""

    def __init__(self, snapshot: Snapshot, now: float, *, evicted: Evicted = "gone") -> None:
        if evicted not in ("gone", "evicting"):
            raise ValueError(f"evicted must be 'gone' or 'evicting', got {evicted!r}")
        self.base = snapshot
        self.now = now
        self.gone = evicted == "gone"
        self.pods: dict[PodRef, Pod] = {p.ref: p for p in snapshot.pods}
        self.shadows: dict[PodRef, ShadowPod] = {s.ref: s for s in snapshot.shadows}
        self.groups: dict[PodRef, PodGroup] = {g.ref: g for g in snapshot.groups}
        self.gpus: dict[NodeName, dict[DeviceID, GPU]] = {n.name: {g.id: g for g in n.gpus} for n in snapshot.nodes}
        self.owners: dict[DeviceID, ContainerRef | None] = {}
        """Devices whose owner changed, and the new owner."""
        self.twins: dict[DeviceID, Health] = {}

    # -- one decision each ------------------------------------------------------------------------
    def evict(self, d: Evict) -> None:
        pod = self.pods.get(d.pod)
        if pod is None:
            raise ApplyError(f"the scheduler evicted unknown pod {d.pod}")
        if self.gone:
            del self.pods[d.pod]
            if not pod.request.is_spot:
                self.owners.update(dict.fromkeys(pod.devices))
        else:
            self.pods[d.pod] = dataclasses.replace(pod, evicting=True)

    def delete_shadow(self, d: DeleteShadowPod) -> None:
        shadow = self.shadows.get(d.pod)
        if shadow is None:
            raise ApplyError(f"the scheduler deleted unknown ShadowPod {d.pod}")
        if self.gone:
            del self.shadows[d.pod]
            self.owners.update(dict.fromkeys(shadow.devices))
        else:
            self.shadows[d.pod] = dataclasses.replace(shadow, deleting=True)

    def clear_nomination(self, d: ClearNomination) -> None:
        pod = self.pods.get(d.pod)
        if pod is not None:  # an evicted pod may be gone already
            self.pods[d.pod] = dataclasses.replace(pod, nominated=None)

    def nominate(self, d: Nominate) -> None:
        pod = self.pods.get(d.pod)
        if pod is None:
            raise ApplyError(f"nomination of unknown pod {d.pod}")
        self._devices(f"nomination of {d.pod}", d.node, d.devices)
        self.pods[d.pod] = dataclasses.replace(pod, nominated=Nomination(d.node, d.devices))

    def create_shadow(self, d: CreateShadowPod) -> None:
        self._devices(f"ShadowPod {d.pod}", d.node, d.devices, verb="names")
        self.shadows[d.pod] = ShadowPod(d.pod, d.node, d.devices, d.container, d.group, created_at=self.now)
        self.owners.update(dict.fromkeys(d.devices, d.container_ref))

    def bind(self, d: Bind) -> None:
        pod = self.pods.get(d.pod)
        if pod is None or pod.node is not None:
            raise ApplyError(f"bind of {d.pod}, which is not a pending pod")
        gpus = self._devices(f"bind of {d.pod}", d.node, d.devices, verb="to")
        if d.spot:
            owners = d.owner_map()
            for gpu in gpus:
                held = self.owners.get(gpu.id, gpu.owner)  # an entry (even None) is the newer owner
                if owners.get(gpu.id) != held:
                    raise ApplyError(f"bind of {d.pod}: device owner {owners.get(gpu.id)} for {gpu.id}, held by {held}")
        else:
            self.owners.update(dict.fromkeys(d.devices, pod.container_ref))
            self.twins.update(dict.fromkeys(d.devices, Health.UNHEALTHY))
        self.pods[d.pod] = dataclasses.replace(pod, node=d.node, devices=d.devices, start_time=self.now, nominated=None)

    def status(self, d: PodGroupStatus) -> None:
        group = self.groups.get(d.group)
        if group is None:
            raise ApplyError(f"status for unknown PodGroup {d.group}")
        self.groups[d.group] = dataclasses.replace(group, phase=d.phase)

    def _devices(self, who: str, node: NodeName, devices: tuple[DeviceID, ...], verb: str = "names") -> list[GPU]:
        gpus = self.gpus.get(node)
        if gpus is None:
            raise ApplyError(f"{who} names node {node}, which is not in the snapshot")
        out = []
        for device in devices:
            gpu = gpus.get(device)
            if gpu is None:
                what = "to device" if verb == "to" else "names device"
                raise ApplyError(f"{who} {what} {device}, not on {node}")
            out.append(gpu)
        return out

    # -- a whole cycle -----------------------------------------------------------------------------
    def apply(self, result: CycleResult) -> ModelApplier:
        """Apply every decision of ``result`` in :meth:`CycleResult.decisions` order; returns self."""
        for d in result.evictions:
            self.evict(d)
        for deletion in result.shadow_deletions:
            self.delete_shadow(deletion)
        for clear in result.cleared_nominations:
            self.clear_nomination(clear)
        for nom in result.nominations:
            self.nominate(nom)
        for create in result.shadow_creations:
            self.create_shadow(create)
        for bind in result.binds:
            self.bind(bind)
        for status in result.statuses:
            self.status(status)
        return self

    def snapshot(self) -> Snapshot:
        """The model as it now is (unchanged nodes are the snapshot's own objects)."""
        nodes = []
        owners, twins = self.owners, self.twins
        for node in self.base.nodes:
            if any(g.id in owners or g.id in twins for g in node.gpus):
                gpus = tuple(
                    dataclasses.replace(g, owner=owners.get(g.id, g.owner), twin=twins.get(g.id, g.twin))
                    for g in node.gpus
                )
                nodes.append(dataclasses.replace(node, gpus=gpus))
            else:
                nodes.append(node)
        return Snapshot(
            tuple(nodes),
            self.base.queues,
            tuple(self.groups.values()),
            tuple(self.pods.values()),
            tuple(self.shadows.values()),
            self.base.victim_scale,
            self.base.spot_outside,
        )


def apply_result(snapshot: Snapshot, result: CycleResult, now: float, *, evicted: str = "gone") -> Snapshot:
    """The snapshot after every decision of ``result`` took effect (see the module docstring).

    ``evicted="gone"`` removes evicted pods and deleted ShadowPods (their GPUs become free);
    ``evicted="evicting"`` keeps them, marked as being evicted / deleted (the in-between state).
    """
    if evicted not in ("gone", "evicting"):
        raise ValueError(f"evicted must be 'gone' or 'evicting', got {evicted!r}")
    mode: Evicted = "gone" if evicted == "gone" else "evicting"
    return ModelApplier(snapshot, now, evicted=mode).apply(result).snapshot()


__all__ = ["ApplyError", "Evicted", "ModelApplier", "apply_result"]
