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
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spotgpu.agent.steer import AssignmentError, parse_assigned_devices
from spotgpu.core import keys
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
from spotgpu.core.mapping_cache import IDLE_SPACE
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.shadow import ShadowCheck, ShadowClaim, check_shadow
from spotgpu.core.types import GPU_MILLI, Health, QueueType, SpotPriority
from spotgpu.kube.leases import parse_idle_forecast, pod_lease
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
from spotgpu.scheduler.model import (
    GPU,
    GPURequest,
    Node,
    Nomination,
    Pod,
    PodGroup,
    PodGroupPhase,
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


@dataclass(frozen=True, slots=True)
class SpotUse:
    """What the agent's node state says about spot use of one real GPU."""

    pods: tuple[PodRef, ...] = ()
    """Spot pods holding its twins (pod-resources: the kubelet's real allocation)."""
    replicas: int = 0
    """Shared replicas the agent serves per GPU (0: none)."""


def parse_node_state(node: str, text: str) -> dict[DeviceID, tuple[ContainerRef | None, Health]]:
    """The agent's ``spotgpu.io/spot-gpu-state``: real device -> (owner or None, twin health)."""
    return {d: (owner, health) for d, (owner, health, _) in _parse_state(node, text).items()}


def _parse_state(node: str, text: str) -> dict[DeviceID, tuple[ContainerRef | None, Health, SpotUse]]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ObjectError(f"node {node}: annotation {keys.NODE_SPOT_GPU_STATE} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ObjectError(f"node {node}: annotation {keys.NODE_SPOT_GPU_STATE} must be a JSON object")
    out: dict[DeviceID, tuple[ContainerRef | None, Health, SpotUse]] = {}
    for raw_id, entry in data.items():
        where = f"node {node}: {keys.NODE_SPOT_GPU_STATE}[{raw_id!r}]"
        try:
            device = validate_device_id(raw_id)
        except ValidationError as exc:
            raise ObjectError(f"{where}: {exc}") from None
        if not isinstance(entry, dict):
            raise ObjectError(f"{where}: must be an object")
        raw_owner = entry.get("owner")
        owner: ContainerRef | None = None
        if raw_owner not in (None, "", IDLE_SPACE.format()):
            try:
                owner = ContainerRef.parse(raw_owner)
            except ValidationError as exc:
                raise ObjectError(f"{where}: owner: {exc}") from None
        try:
            health = Health(entry.get("health", Health.UNHEALTHY.value))
        except ValueError:
            raise ObjectError(f"{where}: health {entry.get('health')!r} is not Healthy or Unhealthy") from None
        raw_pods, replicas = entry.get("pods", []), entry.get("replicas", 0)
        if not isinstance(raw_pods, list) or not all(isinstance(p, str) for p in raw_pods):
            raise ObjectError(f"{where}: pods must be a list of 'namespace/name'")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ObjectError(f"{where}: replicas must be a whole number >= 0")
        try:
            pods = tuple(PodRef.parse(p) for p in raw_pods)
        except ValidationError as exc:
            raise ObjectError(f"{where}: pods: {exc}") from None
        out[device] = (owner, health, SpotUse(pods, replicas))
    return out


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


def build_snapshot(
    *,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    podgroups: Iterable[Mapping[str, Any]],
    queues: Iterable[Mapping[str, Any]],
    priority_classes: Iterable[Mapping[str, Any]] = (),
    config: TranslateConfig | None = None,
) -> SnapshotBuild:
    cfg = config or TranslateConfig()
    skipped: list[Skipped] = []
    forged: list[Skipped] = []
    pod_objects: dict[PodRef, JSON] = {}

    def skip(kind: str, key: str, reason: str) -> None:
        skipped.append(Skipped(kind, key, reason))

    # -- nodes
    snap_nodes: list[Node] = []
    forecasts_ignored = 0
    owners_by_node: dict[str, dict[ContainerRef, list[DeviceID]]] = {}
    spot_use: dict[str, dict[DeviceID, SpotUse]] = {}
    for obj in nodes:
        name = name_of(obj)
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        state = annotations.get(keys.NODE_SPOT_GPU_STATE)
        if state is None:
            continue
        try:
            node_state = _parse_state(name, state)
            lending, strategy = parse_node_annotations(name, annotations)
            gpus = tuple(GPU(d, owner=o, twin=h) for d, (o, h, _) in sorted(node_state.items()))
            forecast, ignored = parse_idle_forecast(name, annotations.get(keys.NODE_IDLE_FORECAST), node_state)
            snap_nodes.append(
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
                forecasts_ignored += ignored.count
                skip("IdleForecast", name, ignored.reason())
        except ValidationError as exc:
            skip("Node", name, str(exc))
            continue
        spot_use[name] = {d: use for d, (_, _, use) in node_state.items()}
        by_owner: dict[ContainerRef, list[DeviceID]] = {}
        for real in gpus:
            if real.owner is not None:
                by_owner.setdefault(real.owner, []).append(real.id)
        owners_by_node[name] = by_owner

    # -- queues
    snap_queues: dict[str, Queue] = {}
    for obj in queues:
        try:
            qv = QueueView.parse(obj)
            snap_queues[qv.name] = Queue(qv.name, qv.type, qv.weight, qv.capacity_milli)
        except ValidationError as exc:
            skip("Queue", name_of(obj), str(exc))

    # -- priority classes and groups
    priority_values = {name_of(pc): int(pc.get("value") or 0) for pc in priority_classes}
    groups: dict[PodRef, PodGroup] = {}
    for obj in podgroups:
        key = f"{namespace_of(obj)}/{name_of(obj)}"
        try:
            gv = PodGroupView.parse(obj)
            queue = snap_queues.get(gv.queue)
            if queue is None:
                skip("PodGroup", key, f"queue {gv.queue!r} does not exist")
                continue
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
            groups[ref] = PodGroup(
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
        except ValidationError as exc:
            skip("PodGroup", key, str(exc))

    # -- pods and shadows
    snap_pods: list[Pod] = []
    shadows: list[ShadowPod] = []
    for obj in pods:
        where = f"pod {namespace_of(obj)}/{name_of(obj)}"
        key = f"{namespace_of(obj)}/{name_of(obj)}"
        if pod_phase(obj) in ("Succeeded", "Failed"):
            continue
        try:
            ref = pod_ref(obj)
            node = (obj.get("spec") or {}).get("nodeName")
            created_at = parse_time((obj.get("metadata") or {}).get("creationTimestamp")) or 0.0
            claim = shadow_claim(obj, cfg.shadow_namespace)
            if claim.claim is ShadowClaim.FORGED:
                forged.append(Skipped("ForgedShadowPod", key, f"{claim.reason}: translated as an ordinary pod"))
            if claim.authentic:
                if not node:
                    skip("ShadowPod", key, "has no node")
                    continue
                containers = (obj.get("spec") or {}).get("containers") or [{}]
                container = str(containers[0].get("name") or "main")
                reported = owners_by_node.get(node, {}).get(ContainerRef(ref.namespace, ref.name, container))
                held = tuple(reported or ())
                if not held:  # just created: the agent does not report it yet
                    held = tuple(validate_device_id(d) for ids in _assigned(obj, where).values() for d in ids)
                raw_group = ((obj.get("metadata") or {}).get("annotations") or {}).get(keys.SHADOW_FOR)
                shadows.append(
                    ShadowPod(
                        ref,
                        NodeName(node),
                        held,
                        container=container,
                        group=PodRef.parse(raw_group) if raw_group else None,
                        created_at=created_at,
                        deleting=is_deleting(obj),
                    )
                )
                pod_objects[ref] = dict(obj)
                continue
            gpu = _gpu_container(obj, cfg, where)
            if gpu is None:
                skip("Pod", key, f"requests neither {SPOT_GPU_RESOURCE} nor {cfg.gpu_resource}")
                continue
            container, resource, count = gpu
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if resource == SPOT_GPU_SHARED_RESOURCE:
                if count != 1 or not annotations.get(keys.SPOT_GPU_MILLI):
                    skip(
                        "Pod",
                        key,
                        f"requests {count} {SPOT_GPU_SHARED_RESOURCE}; a shared spot pod requests exactly 1 "
                        f"and gives its share in {keys.SPOT_GPU_MILLI}",
                    )
                    continue
                request = GPURequest.shared(int(annotations[keys.SPOT_GPU_MILLI]))
            elif resource == SPOT_GPU_RESOURCE and annotations.get(keys.SPOT_GPU_MILLI):
                request = GPURequest.shared(int(annotations[keys.SPOT_GPU_MILLI]))
            elif resource == SPOT_GPU_RESOURCE:
                request = GPURequest.spot(count)
            else:
                request = GPURequest.reserved(count, ResourceName(resource))
            group_name = labels.get(keys.POD_GROUP)
            if group_name is None:
                group_name = ref.name
                queue_name = labels.get(keys.QUEUE, cfg.default_queue)
                queue = snap_queues.get(queue_name)
                if queue is None:
                    skip("Pod", key, f"has no PodGroup and its queue {queue_name!r} does not exist")
                    continue
                gref = PodRef(ref.namespace, group_name)
                if gref not in groups:
                    spot = SpotPriority.SPOTLOW if queue.type is QueueType.SPOT else None
                    min_lease, checkpoint = pod_lease(annotations, where)
                    groups[gref] = PodGroup(
                        gref,
                        queue_name,
                        min_member=1,
                        spot_priority=spot,
                        priority=spot.value_int if spot else 0,
                        created_at=created_at,
                        min_lease=min_lease,
                        checkpoint_interval=checkpoint,
                    )
            elif PodRef(ref.namespace, group_name) not in groups:
                skip("Pod", key, f"its PodGroup {group_name!r} does not exist (yet)")
                continue
            devices: tuple[DeviceID, ...] = ()
            if node:
                assigned = _assigned(obj, where)
                if request.is_spot:
                    used = _reported_use(spot_use.get(node, {}), ref)
                    devices = used or tuple(from_spot_id(d) for d in assigned.get(SPOT_GPU_RESOURCE, ()))
                else:  # what the agent reports it holding; the scheduler's annotation until then
                    owner = ContainerRef(ref.namespace, ref.name, container)
                    devices = tuple(owners_by_node.get(node, {}).get(owner, ()))
                    if not devices and resource in assigned:
                        devices = tuple(validate_device_id(d) for d in assigned[resource])
            snap_pods.append(
                Pod(
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
            )
            pod_objects[ref] = dict(obj)
        except ValidationError as exc:
            skip("Pod", key, str(exc))
        except ValueError as exc:
            skip("Pod", key, f"{where}: {exc}")

    snap_nodes, snap_pods, shadows = _claim_devices(snap_nodes, snap_pods, shadows, skip)
    snap_nodes, snap_pods = _check_spot_use(snap_nodes, snap_pods, spot_use, skip)
    snapshot = Snapshot.of(
        nodes=snap_nodes,
        queues=snap_queues.values(),
        groups=groups.values(),
        pods=snap_pods,
        shadows=shadows,
    )
    return SnapshotBuild(snapshot, tuple(skipped), pod_objects, tuple(forged), forecasts_ignored)


def _reported_use(use: Mapping[DeviceID, SpotUse], pod: PodRef) -> tuple[DeviceID, ...]:
    """The GPUs the agent reports ``pod`` using (sorted), or ``()``."""
    return tuple(sorted(d for d, u in use.items() if pod in u.pods))


def _check_spot_use(
    nodes: list[Node],
    pods: list[Pod],
    spot_use: Mapping[str, Mapping[DeviceID, SpotUse]],
    skip: Callable[[str, str, str], None],
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


def _claim_devices(
    nodes: list[Node], pods: list[Pod], shadows: list[ShadowPod], skip: Callable[[str, str, str], None]
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


__all__ = [
    "Skipped",
    "SnapshotBuild",
    "SpotUse",
    "TranslateConfig",
    "build_snapshot",
    "parse_node_state",
    "shadow_claim",
]
