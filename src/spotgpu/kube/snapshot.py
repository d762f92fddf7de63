"""Translating the informer caches (API JSON) into the scheduler core's :class:`Snapshot`.

Pure: JSON in, a snapshot plus the list of objects left out (and why) out; no I/O, no clock.
No scheduling decision is taken here; this only says what the cluster *is*.

Where each part comes from:

* **Nodes**: every node whose agent publishes ``spotgpu.io/spot-gpu-state`` (nodes without a
  spotgpu agent are not scheduled onto). From that annotation, per real GPU: the owner
  container (``IdleSpace`` = unallocated) and the twin's health; the node's lending settings
  from ``platform.k8s.io/lowpower-spot`` and ``platform.k8s.io/spot-prefer``; schedulable when
  Ready and not cordoned; the pool from the node label named by ``pool_label``; the idle forecast
  per lent twin from ``spotgpu.io/idle-forecast`` (:func:`~spotgpu.kube.leases.parse_idle_forecast`: malformed entries
  are ignored and counted in :attr:`SnapshotBuild.forecasts_ignored`, never fatal).
* A spot gang's ``minLease``/``checkpointInterval`` come from its PodGroup's spec; a lone pod's
  from its annotations ``spotgpu.io/min-lease``/``spotgpu.io/checkpoint-interval``.
* **Queues** and **PodGroups**: the CRDs. A spot PodGroup's ``priorityClassName`` is its spot
  priority; a reserved one's priority is the value of its PriorityClass.
* **Pods** (``schedulerName: spotgpu``, not finished): gang members carry the ``pod-group``
  label; a pod without one gets a PodGroup of its own (``min_member=1``) in the queue its
  ``queue`` label names (or the default queue). The GPU request is the container asking for
  ``platform/spot-gpu``, ``platform/spot-gpu-shared`` (shared spot: exactly 1, with its share
  in ``spotgpu.io/spot-gpu-milli``) or the real GPU resource; on ``platform/spot-gpu``,
  ``spotgpu.io/spot-gpu-milli`` makes it shared too (the agent's legacy ``twinReplicas``).
  A placed spot pod's devices are those the agent reports it using (the node state's ``pods``:
  what the kubelet really allocated, which may differ from what the scheduler assigned), else
  its ``spotgpu.io/assigned-devices`` (twins); a reserved pod's come from the node state's
  owners, and from its assignment only until the agent reports it. Placed spot pods whose use
  of a GPU contradicts another's (possible once
  the kubelet's real choice replaces the assignment: two exclusive users, shared beyond one GPU,
  both kinds) are left out, the ones the agent reports first kept; a GPU whose shared replicas
  (the node state's ``replicas``) are all taken has its twin reported Unhealthy, so no new spot
  pod is placed on it.
* **ShadowPods**: authentic ones only (:func:`spotgpu.core.shadow.check_shadow`: the annotation
  ``pod-device-type: shadow``, the label ``spotgpu.io/shadow-pod`` and the ShadowPod namespace,
  which only the scheduler writes). The GPUs one holds are those the agent's node state reports
  it holding; its ``spotgpu.io/assigned-devices`` only until the agent reports it (right after
  its creation). A pod that claims to be one without all three is *forged*: it is translated as
  the ordinary pod it is, and listed in :attr:`SnapshotBuild.forged_shadows` (the loop counts
  and logs them).

Objects that are malformed, or whose PodGroup or queue is missing, are left out and reported in
:attr:`SnapshotBuild.skipped`; one bad object never stops scheduling for everyone else.

Parts: the agent's node annotation is read by :mod:`spotgpu.kube.nodestate`; placements the
snapshot cannot hold together are left out by :mod:`spotgpu.kube.snapshot_checks`; this module
translates the objects one by one (nodes, queues, PodGroups, pods and ShadowPods).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spotgpu.core import keys
from spotgpu.core.codec import AssignmentError, parse_assigned_devices
from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import (
    NVIDIA_GPU_RESOURCE,
    SPOT_GPU_RESOURCE,
    SPOT_GPU_SHARED_RESOURCE,
    DeviceID,
    NodeName,
    ResourceName,
    from_spot_id,
    validate_device_id,
)
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.shadow import ShadowCheck, ShadowClaim, check_shadow
from spotgpu.core.types import QueueType, SpotPriority
from spotgpu.kube.leases import parse_idle_forecast, pod_lease
from spotgpu.kube.nodestate import SpotUse, parse_spot_state
from spotgpu.kube.objects import (
    container_requests,
    disruption,
    is_deleting,
    node_schedulable,
    pod_phase,
    pod_ref,
    pod_start_time,
)
from spotgpu.kube.resources import ObjectError, PodGroupView, QueueView, name_of, namespace_of, parse_time
from spotgpu.kube.snapshot_checks import SkipFn, check_spot_use, claim_devices, reported_use
from spotgpu.scheduler.decisions import PodGroupPhase
from spotgpu.scheduler.model import (
    GPU,
    GPURequest,
    Node,
    Nomination,
    Pod,
    PodGroup,
    Queue,
    ShadowPod,
    Snapshot,
    parse_node_annotations,
)

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class TranslateConfig:
    gpu_resource: ResourceName = NVIDIA_GPU_RESOURCE
    """The real GPU resource of the nodes (the vendor device plugin's)."""
    default_queue: str = "default"
    """Queue of a spotgpu pod that names no PodGroup and no queue."""
    pool_label: str = "spotgpu.io/pool"
    """Node label whose value is the node's pool (empty when absent)."""
    shadow_namespace: str = keys.DEFAULT_SHADOW_NAMESPACE
    """Where authentic ShadowPods live (the scheduler's ``shadowNamespace``)."""


@dataclass(frozen=True, slots=True)
class Skipped:
    kind: str
    key: str
    reason: str


@dataclass(frozen=True, slots=True)
class SnapshotBuild:
    snapshot: Snapshot
    skipped: tuple[Skipped, ...] = ()
    pod_objects: Mapping[PodRef, JSON] = field(default_factory=dict)
    """The pod JSON behind every snapshot pod and ShadowPod (for applying decisions)."""
    forged_shadows: tuple[Skipped, ...] = ()
    """Pods that claim to be ShadowPods but are not (kind ``ForgedShadowPod``; translated as
    ordinary pods, or left out as such)."""
    forecasts_ignored: int = 0
    """Entries of ``spotgpu.io/idle-forecast`` annotations left out as malformed (see :func:`parse_idle_forecast`)."""


def _assigned(obj: Mapping[str, Any], where: str) -> dict[str, list[str]]:
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(keys.ASSIGNED_DEVICES)
    if not raw:
        return {}
    try:
        return parse_assigned_devices(raw)
    except AssignmentError as exc:
        raise ObjectError(f"{where}: {exc}") from None


def _gpu_container(obj: Mapping[str, Any], cfg: TranslateConfig, where: str) -> tuple[str, str, int] | None:
    """(container, resource, count) of the first container asking for GPUs, or None."""
    for container in (obj.get("spec") or {}).get("containers") or ():
        requests = container_requests(container, f"{where} container {container.get('name')}")
        for resource in (SPOT_GPU_RESOURCE, SPOT_GPU_SHARED_RESOURCE, cfg.gpu_resource):
            if requests.get(resource):
                return str(container.get("name")), resource, requests[resource]
    return None


def _nomination(obj: Mapping[str, Any], where: str) -> Nomination | None:
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(keys.NOMINATED_DEVICES)
    if not raw:
        return None
    try:
        data = json.loads(raw)
        return Nomination(NodeName(str(data["node"])), tuple(validate_device_id(d) for d in data["devices"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ObjectError(f"{where}: annotation {keys.NOMINATED_DEVICES} is malformed: {exc}") from None


def shadow_claim(obj: Mapping[str, Any], shadow_namespace: str = keys.DEFAULT_SHADOW_NAMESPACE) -> ShadowCheck:
    """Whether a pod object is an authentic ShadowPod (:func:`spotgpu.core.shadow.check_shadow`)."""
    meta = obj.get("metadata") or {}
    return check_shadow(
        meta.get("namespace"),
        meta.get("annotations") or {},
        meta.get("labels") or {},
        shadow_namespace=shadow_namespace,
    )


class _LeftOut(Exception):
    """An object the snapshot leaves out: its kind and why (the loop records it as skipped)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@dataclass(slots=True)
class _NodeFacts:
    """The nodes, and what their agents report that the pods' translation needs."""

    nodes: list[Node] = field(default_factory=list)
    owners: dict[str, dict[ContainerRef, list[DeviceID]]] = field(default_factory=dict)
    """Per node, the real GPUs of each owner container."""
    spot_use: dict[str, dict[DeviceID, SpotUse]] = field(default_factory=dict)
    """Per node, the spot use of each real GPU."""
    forecasts_ignored: int = 0


def _translate_node(obj: Mapping[str, Any], state: str, cfg: TranslateConfig, facts: _NodeFacts, skip: SkipFn) -> None:
    """Add one node with a spotgpu agent to ``facts`` (or leave it out, reported)."""
    name = name_of(obj)
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    try:
        node_state = parse_spot_state(name, state)
        lending, strategy = parse_node_annotations(name, annotations)
        gpus = tuple(GPU(d, owner=o, twin=h) for d, (o, h, _) in sorted(node_state.items()))
        forecast, ignored = parse_idle_forecast(name, annotations.get(keys.NODE_IDLE_FORECAST), node_state)
        facts.nodes.append(
            Node(
                NodeName(name),
                gpus,
                resource=cfg.gpu_resource,
                lending=lending,
                strategy=strategy,
                schedulable=node_schedulable(obj),
                pool=str((meta.get("labels") or {}).get(cfg.pool_label, "")),
                idle_forecast=forecast,
            )
        )
        if ignored:
            facts.forecasts_ignored += ignored.count
            skip("IdleForecast", name, ignored.reason())
    except ValidationError as exc:
        skip("Node", name, str(exc))
        return
    facts.spot_use[name] = {d: use for d, (_, _, use) in node_state.items()}
    by_owner: dict[ContainerRef, list[DeviceID]] = {}
    for real in gpus:
        if real.owner is not None:
            by_owner.setdefault(real.owner, []).append(real.id)
    facts.owners[name] = by_owner


def _translate_nodes(nodes: Iterable[Mapping[str, Any]], cfg: TranslateConfig, skip: SkipFn) -> _NodeFacts:
    """Every node whose agent publishes its state; nodes without one are not scheduled onto."""
    facts = _NodeFacts()
    for obj in nodes:
        state = ((obj.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_SPOT_GPU_STATE)
        if state is not None:
            _translate_node(obj, state, cfg, facts, skip)
    return facts


def _translate_queues(queues: Iterable[Mapping[str, Any]], skip: SkipFn) -> dict[str, Queue]:
    out: dict[str, Queue] = {}
    for obj in queues:
        try:
            qv = QueueView.parse(obj)
            out[qv.name] = Queue(qv.name, qv.type, qv.weight, qv.capacity_milli)
        except ValidationError as exc:
            skip("Queue", name_of(obj), str(exc))
    return out


def _translate_group(
    obj: Mapping[str, Any], queues: Mapping[str, Queue], priority_values: Mapping[str, int]
) -> PodGroup:
    """One PodGroup: a spot one's priority class is its spot priority, a reserved one's the value
    of its PriorityClass."""
    gv = PodGroupView.parse(obj)
    queue = queues.get(gv.queue)
    if queue is None:
        raise _LeftOut("PodGroup", f"queue {gv.queue!r} does not exist")
    spot_priority = None
    priority = 0
    if queue.type is QueueType.SPOT:
        spot_priority = SpotPriority.parse(gv.priority_class or SpotPriority.SPOTLOW.value)
        priority = spot_priority.value_int
    elif gv.priority_class:
        priority = priority_values.get(gv.priority_class, 0)
    try:
        phase = PodGroupPhase(gv.phase)
    except ValueError:
        phase = PodGroupPhase.PENDING
    ref = PodRef(gv.namespace, gv.name)
    return PodGroup(
        ref,
        gv.queue,
        min_member=gv.min_member,
        priority=priority,
        spot_priority=spot_priority,
        phase=phase,
        created_at=gv.created_at,
        pool=gv.pool,
        min_lease=gv.min_lease or 0.0,
        checkpoint_interval=gv.checkpoint_interval or 0.0,
    )


def _translate_groups(
    podgroups: Iterable[Mapping[str, Any]],
    queues: Mapping[str, Queue],
    priority_classes: Iterable[Mapping[str, Any]],
    skip: SkipFn,
) -> dict[PodRef, PodGroup]:
    priority_values = {name_of(pc): int(pc.get("value") or 0) for pc in priority_classes}
    groups: dict[PodRef, PodGroup] = {}
    for obj in podgroups:
        key = f"{namespace_of(obj)}/{name_of(obj)}"
        try:
            group = _translate_group(obj, queues, priority_values)
            groups[group.ref] = group
        except _LeftOut as out:
            skip(out.kind, key, out.reason)
        except ValidationError as exc:
            skip("PodGroup", key, str(exc))
    return groups


def _gpu_request(resource: str, count: int, annotations: Mapping[str, str]) -> GPURequest:
    """The GPU request of a pod's GPU container (module docstring: exclusive, shared, reserved)."""
    if resource == SPOT_GPU_SHARED_RESOURCE:
        if count != 1 or not annotations.get(keys.SPOT_GPU_MILLI):
            raise _LeftOut(
                "Pod",
                f"requests {count} {SPOT_GPU_SHARED_RESOURCE}; a shared spot pod requests exactly 1 "
                f"and gives its share in {keys.SPOT_GPU_MILLI}",
            )
        return GPURequest.shared(int(annotations[keys.SPOT_GPU_MILLI]))
    if resource == SPOT_GPU_RESOURCE and annotations.get(keys.SPOT_GPU_MILLI):
        return GPURequest.shared(int(annotations[keys.SPOT_GPU_MILLI]))
    if resource == SPOT_GPU_RESOURCE:
        return GPURequest.spot(count)
    return GPURequest.reserved(count, ResourceName(resource))


class _PodTranslator:
    """Pods and ShadowPods, with the PodGroups of lone pods (module docstring)."""

    def __init__(
        self,
        cfg: TranslateConfig,
        facts: _NodeFacts,
        queues: Mapping[str, Queue],
        groups: dict[PodRef, PodGroup],
        skip: SkipFn,
    ) -> None:
        self.cfg = cfg
        self.facts = facts
        self.queues = queues
        self.groups = groups
        self.skip = skip
        self.pods: list[Pod] = []
        self.shadows: list[ShadowPod] = []
        self.forged: list[Skipped] = []
        self.objects: dict[PodRef, JSON] = {}

    def translate(self, pods: Iterable[Mapping[str, Any]]) -> None:
        for obj in pods:
            where = f"pod {namespace_of(obj)}/{name_of(obj)}"
            key = f"{namespace_of(obj)}/{name_of(obj)}"
            if pod_phase(obj) in ("Succeeded", "Failed"):
                continue
            try:
                self._translate(obj, key, where)
            except _LeftOut as out:
                self.skip(out.kind, key, out.reason)
            except ValidationError as exc:
                self.skip("Pod", key, str(exc))
            except ValueError as exc:
                self.skip("Pod", key, f"{where}: {exc}")

    def _translate(self, obj: Mapping[str, Any], key: str, where: str) -> None:
        ref = pod_ref(obj)
        node = (obj.get("spec") or {}).get("nodeName")
        created_at = parse_time((obj.get("metadata") or {}).get("creationTimestamp")) or 0.0
        claim = shadow_claim(obj, self.cfg.shadow_namespace)
        if claim.claim is ShadowClaim.FORGED:
            self.forged.append(Skipped("ForgedShadowPod", key, f"{claim.reason}: translated as an ordinary pod"))
        if claim.authentic:
            self.shadows.append(self._shadow(obj, ref, node, created_at, where))
        else:
            self.pods.append(self._pod(obj, ref, node, created_at, where))
        self.objects[ref] = dict(obj)

    def _shadow(
        self, obj: Mapping[str, Any], ref: PodRef, node: str | None, created_at: float, where: str
    ) -> ShadowPod:
        """The GPUs a ShadowPod holds: what the agent reports, its assignment until then."""
        if not node:
            raise _LeftOut("ShadowPod", "has no node")
        containers = (obj.get("spec") or {}).get("containers") or [{}]
        container = str(containers[0].get("name") or "main")
        reported = self.facts.owners.get(node, {}).get(ContainerRef(ref.namespace, ref.name, container))
        held = tuple(reported or ())
        if not held:  # just created: the agent does not report it yet
            held = tuple(validate_device_id(d) for ids in _assigned(obj, where).values() for d in ids)
        raw_group = ((obj.get("metadata") or {}).get("annotations") or {}).get(keys.SHADOW_FOR)
        return ShadowPod(
            ref,
            NodeName(node),
            held,
            container=container,
            group=PodRef.parse(raw_group) if raw_group else None,
            created_at=created_at,
            deleting=is_deleting(obj),
        )

    def _pod(self, obj: Mapping[str, Any], ref: PodRef, node: str | None, created_at: float, where: str) -> Pod:
        gpu = _gpu_container(obj, self.cfg, where)
        if gpu is None:
            raise _LeftOut("Pod", f"requests neither {SPOT_GPU_RESOURCE} nor {self.cfg.gpu_resource}")
        container, resource, count = gpu
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        labels = (obj.get("metadata") or {}).get("labels") or {}
        request = _gpu_request(resource, count, annotations)
        group_name = self._group_of(ref, labels, annotations, created_at, where)
        devices: tuple[DeviceID, ...] = ()
        if node:
            devices = self._devices(
                obj, ref, node, request=request, resource=resource, container=container, where=where
            )
        return Pod(
            ref,
            group_name,
            request,
            container=container,
            node=NodeName(node) if node else None,
            devices=devices,
            start_time=pod_start_time(obj),
            evicting=is_deleting(obj) or disruption(obj) is not None,
            nominated=None if node else _nomination(obj, where),
            created_at=created_at,
        )

    def _group_of(
        self, ref: PodRef, labels: Mapping[str, str], annotations: Mapping[str, str], created_at: float, where: str
    ) -> str:
        """The pod's PodGroup name; a lone pod gets a PodGroup of its own in its queue."""
        group_name = labels.get(keys.POD_GROUP)
        if group_name is not None:
            if PodRef(ref.namespace, group_name) not in self.groups:
                raise _LeftOut("Pod", f"its PodGroup {group_name!r} does not exist (yet)")
            return group_name
        queue_name = labels.get(keys.QUEUE, self.cfg.default_queue)
        queue = self.queues.get(queue_name)
        if queue is None:
            raise _LeftOut("Pod", f"has no PodGroup and its queue {queue_name!r} does not exist")
        gref = PodRef(ref.namespace, ref.name)
        if gref not in self.groups:
            spot = SpotPriority.SPOTLOW if queue.type is QueueType.SPOT else None
            min_lease, checkpoint = pod_lease(annotations, where)
            self.groups[gref] = PodGroup(
                gref,
                queue_name,
                min_member=1,
                spot_priority=spot,
                priority=spot.value_int if spot else 0,
                created_at=created_at,
                min_lease=min_lease,
                checkpoint_interval=checkpoint,
            )
        return ref.name

    def _devices(
        self,
        obj: Mapping[str, Any],
        ref: PodRef,
        node: str,
        *,
        request: GPURequest,
        resource: str,
        container: str,
        where: str,
    ) -> tuple[DeviceID, ...]:
        """A placed pod's real GPUs: a spot pod's as the agent reports its use, else its assigned
        twins; a reserved pod's as the agent reports it holding, else its assignment."""
        assigned = _assigned(obj, where)
        if request.is_spot:
            used = reported_use(self.facts.spot_use.get(node, {}), ref)
            return used or tuple(from_spot_id(d) for d in assigned.get(SPOT_GPU_RESOURCE, ()))
        owner = ContainerRef(ref.namespace, ref.name, container)
        devices = tuple(self.facts.owners.get(node, {}).get(owner, ()))
        if not devices and resource in assigned:
            devices = tuple(validate_device_id(d) for d in assigned[resource])
        return devices


def build_snapshot(
    *,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    podgroups: Iterable[Mapping[str, Any]],
    queues: Iterable[Mapping[str, Any]],
    priority_classes: Iterable[Mapping[str, Any]] = (),
    config: TranslateConfig | None = None,
) -> SnapshotBuild:
    """The scheduler's snapshot of the cluster, and what was left out (module docstring)."""
    cfg = config or TranslateConfig()
    skipped: list[Skipped] = []

    def skip(kind: str, key: str, reason: str) -> None:
        skipped.append(Skipped(kind, key, reason))

    facts = _translate_nodes(nodes, cfg, skip)
    snap_queues = _translate_queues(queues, skip)
    groups = _translate_groups(podgroups, snap_queues, priority_classes, skip)
    translated = _PodTranslator(cfg, facts, snap_queues, groups, skip)
    translated.translate(pods)
    snap_nodes, snap_pods, shadows = claim_devices(facts.nodes, translated.pods, translated.shadows, skip)
    snap_nodes, snap_pods = check_spot_use(snap_nodes, snap_pods, facts.spot_use, skip)
    snapshot = Snapshot.of(
        nodes=snap_nodes,
        queues=snap_queues.values(),
        groups=groups.values(),
        pods=snap_pods,
        shadows=shadows,
    )
    return SnapshotBuild(
        snapshot, tuple(skipped), translated.objects, tuple(translated.forged), facts.forecasts_ignored
    )


__all__ = [
    "Skipped",
    "SnapshotBuild",
    "TranslateConfig",
    "build_snapshot",
    "shadow_claim",
]
