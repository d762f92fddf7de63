"""Per-cycle working state: the snapshot, checked and indexed, with reversible mutations.

No I/O and no clock reads. :meth:`ClusterState.build` checks the whole snapshot (raising
:class:`~spotgpu.scheduler.model.SnapshotError` naming the object) and builds mutable mirrors of
nodes, GPUs, gangs and pods. A cycle mutates only these mirrors, never the snapshot; every
mutation has an exact inverse so that a :class:`~spotgpu.scheduler.framework.Statement` can undo
a gang that did not fit.

The mirrors are in :mod:`spotgpu.scheduler.mirrors`, the rules that read them (lendable, bindable,
reclaimable, the per-node summary) in :mod:`spotgpu.scheduler.rules`. Nodes are indexed by their
:class:`NodeClass`, a summary of everything placement scores depend on (resource, pool, strategy,
lending, free counts, shared remainders, idle-forecast buckets). Nodes of one class are
interchangeable for filtering and scoring, which keeps the cost of finding a node proportional to
the number of distinct classes (hundreds) instead of nodes (thousands). A second index by
:class:`PreemptKey` serves victim search.
"""

from __future__ import annotations

from typing import TypeVar

from spotgpu.core.ids import DeviceID, NodeName, ResourceName
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import GPU_MILLI, NodeStrategy
from spotgpu.scheduler import lease, rules
from spotgpu.scheduler.mirrors import (
    AutoLent,
    GPUState,
    JobState,
    NodeClass,
    NodeState,
    PreemptKey,
    QueueState,
    ShadowState,
    TaskKind,
    TaskShape,
    TaskState,
)
from spotgpu.scheduler.model import (
    GPU,
    Node,
    Pod,
    PodGroup,
    Queue,
    ShadowPod,
    Snapshot,
    SnapshotError,
    SpotOutside,
    VictimScale,
)

_T = TypeVar("_T")


class ClusterState:
    """The indexed, mutable mirror of one snapshot. Build with :meth:`build`."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.nodes: dict[NodeName, NodeState] = {}
        self.queues: dict[str, QueueState] = {}
        self.jobs: dict[PodRef, JobState] = {}
        self.tasks: dict[PodRef, TaskState] = {}
        self.shadows: dict[ContainerRef, ShadowState] = {}
        self.bad_nominations: list[tuple[PodRef, str]] = []
        self.victim_scale: VictimScale | None = None
        """Cluster-wide normalisation maxima for victim scores, when the snapshot is partial."""
        self.spot_outside: SpotOutside | None = None
        """The pending demand and unallocated room a partial snapshot left out (:mod:`.demand`)."""
        # class index: NodeClass -> ordered set of nodes
        self.classes: dict[NodeClass, dict[NodeState, None]] = {}
        self.class_list: list[NodeClass] = []
        """Every class ever created in this cycle, in creation order (the framework extends its cached orders)."""
        self.pindex: dict[PreemptKey, dict[NodeState, None]] = {}
        self._pkeys_sorted: list[PreemptKey] | None = None
        self.auto_lent_nodes = 0
        """``auto`` nodes whose class has lent capacity (spot tasks first try a restricted shape)."""
        self.capacity_epoch = 0
        """Incremented whenever placement capacity may have grown (memoised failures expire)."""
        self._shapes: dict[tuple[object, ...], TaskShape] = {}
        self._lease_wanted = False
        """A pending spot task wants a lease (min_lease or checkpoint_interval)."""
        self.forecasts = False
        """Whether idle forecasts take part in this cycle (a pending spot gang wants a lease and some
        node has forecasts); otherwise every GPU's forecast counts as unknown and is never read."""
        self._interned: dict[tuple[object, ...], NodeClass] = {}

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def build(cls, snapshot: Snapshot, now: float) -> ClusterState:
        """Check ``snapshot`` and index it. Raises :class:`SnapshotError` naming the first bad object."""
        if not isinstance(snapshot, Snapshot):
            raise SnapshotError(f"expected a Snapshot, got {type(snapshot).__name__}")
        state = cls(now)
        scale = snapshot.victim_scale
        if scale is not None and not isinstance(scale, VictimScale):
            raise SnapshotError(f"snapshot victim_scale must be a VictimScale or None, got {type(scale).__name__}")
        state.victim_scale = scale
        outside = snapshot.spot_outside
        if outside is not None and not isinstance(outside, SpotOutside):
            raise SnapshotError(f"snapshot spot_outside must be a SpotOutside or None, got {type(outside).__name__}")
        state.spot_outside = outside
        device_node: dict[DeviceID, NodeName] = {}
        for order, node in enumerate(_typed(snapshot.nodes, Node, "nodes")):
            if node.name in state.nodes:
                raise SnapshotError(f"node {node.name} is listed twice")
            for gpu in node.gpus:
                if not isinstance(gpu, GPU):
                    raise SnapshotError(f"node {node.name}: gpus must be GPU objects, got {type(gpu).__name__}")
                other = device_node.get(gpu.id)
                if other is not None:
                    where = "twice on that node" if other == node.name else f"on node {other} too"
                    raise SnapshotError(f"device {gpu.id} of node {node.name} is listed {where}")
                device_node[gpu.id] = node.name
            state.nodes[node.name] = NodeState(node, order)
        for queue in _typed(snapshot.queues, Queue, "queues"):
            if queue.name in state.queues:
                raise SnapshotError(f"queue {queue.name} is listed twice")
            state.queues[queue.name] = QueueState(queue)
        for group in _typed(snapshot.groups, PodGroup, "groups"):
            if group.ref in state.jobs:
                raise SnapshotError(f"PodGroup {group.ref} is listed twice")
            qs = state.queues.get(group.queue)
            if qs is None:
                raise SnapshotError(f"PodGroup {group.ref}: queue {group.queue!r} is not in the snapshot")
            job = JobState(group, qs)
            state.jobs[group.ref] = job
            qs.jobs.append(job)
        state._build_shadows(snapshot)
        state._build_pods(snapshot)
        state._build_nominations()
        state._build_forecasts()
        for ns in state.nodes.values():
            state.refresh(ns)
        return state

    def _build_shadows(self, snapshot: Snapshot) -> None:
        seen: set[tuple[str | None, str]] = set()
        for shadow in _typed(snapshot.shadows, ShadowPod, "shadows"):
            ref = shadow.ref
            key = (ref.namespace, ref.name)
            if key in seen:
                raise SnapshotError(f"ShadowPod {ref} is listed twice")
            seen.add(key)
            ns, gpus = self._locate(f"ShadowPod {ref}", shadow.node, shadow.devices)
            for g in gpus:
                o = g.owner
                if o is None or o.name != shadow.container or o.pod != ref.name or o.namespace != ref.namespace:
                    raise SnapshotError(
                        f"ShadowPod {ref} lists device {g.id} on {ns.name}, but the GPU's owner is {o or 'nobody'}"
                    )
            owner = gpus[0].owner
            assert owner is not None
            st = ShadowState(ref, owner, ns, shadow.group, shadow.created_at, new=False)
            st.deleting = shadow.deleting
            for g in gpus:
                g.shadow = st
            st.devices = gpus
            self.shadows[owner] = st

    def _build_pods(self, snapshot: Snapshot) -> None:
        jobs = {(ref.namespace, ref.name): job for ref, job in self.jobs.items()}
        for pod in _typed(snapshot.pods, Pod, "pods"):
            if pod.ref in self.tasks:
                raise SnapshotError(f"pod {pod.ref} is listed twice")
            job = jobs.get((pod.ref.namespace, pod.group))
            if job is None:
                raise SnapshotError(f"pod {pod.ref}: its PodGroup {pod.group_ref} is not in the snapshot")
            req = pod.request
            if job.spot != req.is_spot:
                what = "spot" if job.spot else "reserved"
                raise SnapshotError(
                    f"pod {pod.ref} requests {req.resource} but its PodGroup {job.ref} is in {what} queue "
                    f"{job.queue.queue.name!r}; {what} pods request "
                    + ("platform/spot-gpu" if job.spot else "real GPUs, never platform/spot-gpu")
                )
            kind = TaskKind.SHARED if req.is_shared else TaskKind.EXCLUSIVE if req.is_spot else TaskKind.RESERVED
            group = job.group
            if job.spot and (group.min_lease or group.checkpoint_interval):
                want = max(group.min_lease, group.checkpoint_interval)
                shape = self.shape(
                    kind, req.resource, req.gpus, req.milli, group.pool, min_lease=group.min_lease, want=want
                )
                self._lease_wanted = self._lease_wanted or pod.node is None
            else:
                shape = self.shape(kind, req.resource, req.gpus, req.milli, group.pool)
            task = TaskState(pod, job, shape)
            self.tasks[pod.ref] = task
            job.tasks.append(task)
            if pod.node is not None:
                self._place_from_snapshot(task, pod)
        for job in self.jobs.values():
            job.tasks.sort(key=lambda t: (t.pod.created_at, t.ref.name))

    def _place_from_snapshot(self, task: TaskState, pod: Pod) -> None:
        assert pod.node is not None
        ns, gpus = self._locate(f"pod {pod.ref}", pod.node, pod.devices)
        if task.kind is TaskKind.RESERVED:
            if pod.request.resource != ns.node.resource:
                raise SnapshotError(
                    f"pod {pod.ref} holds {pod.request.resource} but node {ns.name} has {ns.node.resource}"
                )
            for g in gpus:
                if g.owner != task.container:
                    raise SnapshotError(
                        f"pod {pod.ref} is placed on device {g.id} of {ns.name}, but the GPU's owner is "
                        f"{g.owner or 'nobody'}, not {task.container}"
                    )
                if g.holder is not None:
                    raise SnapshotError(f"device {g.id} of {ns.name} is held by both {g.holder.ref} and {pod.ref}")
                if g.shadow is not None:
                    raise SnapshotError(f"pod {pod.ref} holds device {g.id}, which ShadowPod {g.shadow.ref} holds")
        else:
            for g in gpus:
                if task.kind is TaskKind.EXCLUSIVE and g.users:
                    raise SnapshotError(
                        f"spot pod {pod.ref} uses device {g.id} of {ns.name} exclusively, but "
                        f"{', '.join(str(u.ref) for u in g.users)} use it too"
                    )
                if g.exclusive:
                    raise SnapshotError(
                        f"spot pod {pod.ref} shares device {g.id} of {ns.name}, which {g.users[0].ref} uses exclusively"
                    )
                if task.kind is TaskKind.SHARED and g.used_milli + task.milli > GPU_MILLI:
                    raise SnapshotError(
                        f"device {g.id} of {ns.name} is shared beyond one GPU: {g.used_milli} milli of "
                        f"{', '.join(str(u.ref) for u in g.users)} plus {task.milli} of {pod.ref}"
                    )
        self._attach(task, ns, gpus)

    def _locate(self, who: str, node: NodeName, devices: tuple[DeviceID, ...]) -> tuple[NodeState, list[GPUState]]:
        """The node and GPUs an object says it holds; SnapshotError naming ``who`` if either is unknown."""
        ns = self.nodes.get(node)
        if ns is None:
            raise SnapshotError(f"{who} is on unknown node {node}")
        gpus = []
        for dev in devices:
            g = ns.by_id.get(dev)
            if g is None:
                raise SnapshotError(f"{who} holds device {dev}, which its node {ns.name} does not have")
            gpus.append(g)
        return ns, gpus

    def _build_nominations(self) -> None:
        for task in self.tasks.values():
            nom = task.pod.nominated
            if nom is None:
                continue
            if task.node is not None:
                self.bad_nominations.append((task.ref, "the pod is placed"))
                continue
            if task.kind is not TaskKind.RESERVED:
                self.bad_nominations.append((task.ref, "only reserved pods are nominated"))
                continue
            ns = self.nodes.get(nom.node)
            if ns is None:
                self.bad_nominations.append((task.ref, f"node {nom.node} is gone"))
                continue
            gpus: list[GPUState] = []
            problem = None
            if len(nom.devices) != task.gpus or len(set(nom.devices)) != len(nom.devices):
                problem = f"it names {len(nom.devices)} devices for a request of {task.gpus}"
            for dev in nom.devices:
                if problem is not None:
                    break
                g = ns.by_id.get(dev)
                if g is None:
                    problem = f"node {ns.name} has no device {dev}"
                elif g.nominee is not None:
                    problem = f"device {dev} is nominated for {g.nominee.ref} as well"
                elif not g.reclaimable():
                    problem = f"device {dev} now belongs to {g.owner}"
                else:
                    gpus.append(g)
            if problem is not None:
                self.bad_nominations.append((task.ref, problem))
                continue
            for g in gpus:
                g.nominee = task
                if g.shadow is not None:
                    g.shadow.nominated += 1
            task.nomination = (ns, gpus)

    def _build_forecasts(self) -> None:
        """Attach idle forecasts to the GPUs, when some pending spot task wants a lease."""
        if not self._lease_wanted:
            return
        for ns in self.nodes.values():
            forecast = ns.node.idle_forecast
            if not forecast:
                continue
            self.forecasts = True
            for g in ns.gpus:
                f = forecast.get(g.id)
                if f is not None:
                    g.p20 = f.p20
                    g.lease = lease.bucket(f.p20)

    # -- helpers ----------------------------------------------------------------------------
    def shape(
        self,
        kind: TaskKind,
        resource: ResourceName,
        gpus: int,
        milli: int,
        pool: str | None,
        *,
        min_lease: float = 0.0,
        want: float = 0.0,
        auto_lent: AutoLent = AutoLent.ALL,
    ) -> TaskShape:
        key = (kind, resource, gpus, milli, pool, min_lease, want, auto_lent)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = TaskShape(kind, resource, gpus, milli, pool, min_lease, want, auto_lent)
        return shape

    def restricted(self, shape: TaskShape, auto_lent: AutoLent) -> TaskShape:
        """``shape`` with the lent GPUs of ``auto`` nodes restricted as ``auto_lent`` says (a spot
        task's first try, :meth:`spotgpu.scheduler.session.Session.find_node`)."""
        return self.shape(
            shape.kind,
            shape.resource,
            shape.gpus,
            shape.milli,
            shape.pool,
            min_lease=shape.min_lease,
            want=shape.want,
            auto_lent=auto_lent,
        )

    # -- primitive mutations (each has an exact inverse) ------------------------------------
    def _attach(self, task: TaskState, ns: NodeState, gpus: list[GPUState]) -> None:
        task.node = ns
        task.devices = gpus
        job = task.job
        if task.kind is TaskKind.RESERVED:
            for g in gpus:
                g.holder = task
                g.owner = task.container
        else:
            for g in gpus:
                g.users.append(task)
                if task.kind is TaskKind.EXCLUSIVE:
                    g.exclusive += 1
                    g.used_milli += GPU_MILLI
                else:
                    g.used_milli += task.milli
                if not task.evicting:
                    g.live += 1
        if not task.evicting:
            job.ready += 1
        job.queue.allocated_milli += task.request_milli

    def _detach(self, task: TaskState) -> None:
        job = task.job
        if task.kind is TaskKind.RESERVED:
            for g in task.devices:
                g.holder = None
                g.owner = None
        else:
            for g in task.devices:
                g.users.remove(task)
                if task.kind is TaskKind.EXCLUSIVE:
                    g.exclusive -= 1
                    g.used_milli -= GPU_MILLI
                else:
                    g.used_milli -= task.milli
                if not task.evicting:
                    g.live -= 1
        if not task.evicting:
            job.ready -= 1
        job.queue.allocated_milli -= task.request_milli
        task.node = None
        task.devices = []

    def place(self, task: TaskState, ns: NodeState, gpus: list[GPUState]) -> None:
        """Place a pending task tentatively (this cycle)."""
        if task.node is not None:
            raise AssertionError(f"{task.ref} is already placed")
        task.tentative = True
        self._attach(task, ns, gpus)
        self.refresh(ns)

    def unplace(self, task: TaskState) -> None:
        ns = task.node
        assert ns is not None and task.tentative
        self._detach(task)
        task.tentative = False
        self.refresh(ns)
        self.capacity_epoch += 1

    def set_evicting(self, task: TaskState, evicting: bool) -> None:
        if task.evicting == evicting:
            raise AssertionError(f"{task.ref}: evicting is already {evicting}")
        ns = task.node
        assert ns is not None
        step = -1 if evicting else 1
        task.evicting = evicting
        task.job.ready += step
        if task.kind is not TaskKind.RESERVED:
            for g in task.devices:
                g.live += step
        self.refresh(ns)

    def nominate(self, task: TaskState, ns: NodeState, gpus: list[GPUState]) -> None:
        for g in gpus:
            if g.nominee is not None:
                raise AssertionError(f"{g.id} is nominated for {g.nominee.ref} already")
            g.nominee = task
            if g.shadow is not None:
                g.shadow.nominated += 1
        task.nomination = (ns, gpus)
        self.refresh(ns)

    def unnominate(self, task: TaskState) -> tuple[NodeState, list[GPUState]] | None:
        nom = task.nomination
        if nom is None:
            return None
        ns, gpus = nom
        for g in gpus:
            g.nominee = None
            if g.shadow is not None:
                g.shadow.nominated -= 1
        task.nomination = None
        self.refresh(ns)
        self.capacity_epoch += 1
        return nom

    def add_shadow(self, shadow: ShadowState, gpus: list[GPUState], *, refresh: bool = True) -> None:
        """``shadow`` (new in this cycle, or already holding GPUs) takes unallocated ``gpus``.

        ``refresh=False`` leaves the node's class to the caller's next change on the node (a
        Reserve plugin: :meth:`place` follows at once and refreshes)."""
        for g in gpus:
            if g.owner is not None or g.shadow is not None:
                raise AssertionError(f"{g.id} is held by {g.owner} already")
            g.owner = shadow.owner
            g.shadow = shadow
        shadow.devices.extend(gpus)
        self.shadows[shadow.owner] = shadow
        if refresh:
            self.refresh(shadow.node)

    def release_from_shadow(self, shadow: ShadowState, gpus: list[GPUState]) -> None:
        """Undo :meth:`add_shadow` for ``gpus``; a ShadowPod left without GPUs is forgotten."""
        for g in gpus:
            if g.shadow is not shadow:
                raise AssertionError(f"{g.id} is not held by {shadow.ref}")
            g.owner = None
            g.shadow = None
            shadow.devices.remove(g)
        if not shadow.devices:
            shadow.nominated = 0
            del self.shadows[shadow.owner]
        self.refresh(shadow.node)
        self.capacity_epoch += 1

    def set_shadow_deleting(self, shadow: ShadowState, deleting: bool) -> None:
        shadow.deleting = deleting
        self.refresh(shadow.node)

    # -- indexes ----------------------------------------------------------------------------
    def refresh(self, ns: NodeState) -> None:
        """Recompute the node's class and preemption key (:func:`spotgpu.scheduler.rules.summarize`)
        and move it in the indexes. Called after every change on the node."""
        ns.version += 1
        node = ns.node
        cls: NodeClass | None = None
        pkey: PreemptKey | None = None
        if node.schedulable:
            lending = node.lending
            free, spot_u, spot_l, partials, lent_partials, leases, top, zero, avail, room = rules.summarize(
                ns.gpus, lending, node.strategy is NodeStrategy.AUTO
            )
            ns.room = room
            key = (
                node.resource,
                node.pool,
                node.strategy,
                lending,
                len(ns.gpus),
                free,
                spot_u,
                spot_l,
                partials,
                lent_partials,
                leases,
            )
            cls = self._interned.get(key)
            if cls is None:
                cls = self._interned[key] = NodeClass(*key)
            if avail:
                pkey = PreemptKey(top, -zero, -avail, node.resource, node.pool)
        if cls is not ns.cls:
            old = ns.cls
            auto = node.strategy is NodeStrategy.AUTO
            if old is not None:
                del self.classes[old][ns]
                if auto and old.auto_lent:
                    self.auto_lent_nodes -= 1
            if cls is not None:
                bucket = self.classes.get(cls)
                if bucket is None:
                    bucket = self.classes[cls] = {}
                    self.class_list.append(cls)
                bucket[ns] = None
                if auto and cls.auto_lent:
                    self.auto_lent_nodes += 1
            ns.cls = cls
        if pkey != ns.pkey:
            if ns.pkey is not None:
                del self.pindex[ns.pkey][ns]
            if pkey is not None:
                pbucket = self.pindex.get(pkey)
                if pbucket is None:
                    pbucket = self.pindex[pkey] = {}
                    self._pkeys_sorted = None
                pbucket[ns] = None
            ns.pkey = pkey

    def dispose(self) -> None:
        """Break the reference cycles between nodes, GPUs, gangs and pods.

        After a cycle the whole state is garbage; without this, the cycles among its ~100k
        objects would wait for Python's cyclic collector (slowing the next cycles, which then
        traverse them). With it, reference counting frees everything at once. The state is
        unusable afterwards.
        """
        for ns in self.nodes.values():
            for g in ns.gpus:
                g.users.clear()
            ns.gpus.clear()
            ns.by_id.clear()
        for job in self.jobs.values():
            job.tasks.clear()
        for task in self.tasks.values():
            task.devices = []
            task.nomination = None
        for queue in self.queues.values():
            queue.jobs.clear()
        for shadow in self.shadows.values():
            shadow.devices.clear()
        self.classes.clear()
        self.pindex.clear()

    def preempt_keys(self) -> list[PreemptKey]:
        """Preemption keys in evaluation order (lowest top priority, most zero-cost GPUs first)."""
        if self._pkeys_sorted is None:
            self._pkeys_sorted = sorted(self.pindex)
        return self._pkeys_sorted


def _typed(items: object, cls: type[_T], what: str) -> tuple[_T, ...]:
    if not isinstance(items, tuple):
        raise SnapshotError(f"snapshot {what} must be a tuple (use Snapshot.of), got {type(items).__name__}")
    for item in items:
        if not isinstance(item, cls):
            raise SnapshotError(f"snapshot {what} must hold {cls.__name__} objects, got {type(item).__name__}")
    return items


__all__ = [
    "ClusterState",
]
