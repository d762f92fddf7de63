"""The scheduler's snapshot of the simulated cluster: built, trimmed, and rebuilt per changed node.

No I/O. Unchanged scheduler objects (``Node``, ``GPU``, ``Pod``, ``PodGroup``, ``ShadowPod``)
are reused from cycle to cycle; a changed node (:attr:`NodeIndex.dirty`) gets its twin health
from the agent's rule (:func:`spotgpu.agent.model.twin_health`, recomputed only when its inputs
changed), a new scheduler object and its index entries from the scheduler's own per-node
summary (:mod:`spotgpu.sim.schedview`).

Trimmed snapshots (:meth:`Snapshots.build` with ``Hooks.trim_snapshots``) hold only the nodes
that can take part in a cycle's decisions and decide exactly as a full snapshot would (see
docs/simulator.md, "Performance and trimmed snapshots"); with ``Hooks.cap_pending`` only the
pending spot gangs that could be placed are offered (:meth:`Snapshots.spot_candidates`).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Mapping
from typing import Final

from spotgpu.agent.model import twin_health
from spotgpu.core.ids import DeviceID
from spotgpu.core.lending import LendState
from spotgpu.core.mapping_cache import IDLE_SPACE, DeviceEntry, MappingSnapshot, Owner, OwnerEntry
from spotgpu.core.refs import ContainerRef
from spotgpu.core.types import GPU_MILLI, Health, NodeStrategy, QueueType
from spotgpu.scheduler import lease
from spotgpu.scheduler.model import (
    GPU,
    NO_FORECAST,
    IdleForecast,
    Node,
    Pod,
    PodGroup,
    Queue,
    ShadowPod,
    Snapshot,
    SpotOutside,
)
from spotgpu.sim.model import JobSim, NodeSim, PodSim, ShadowSim
from spotgpu.sim.schedview import node_summary, node_views
from spotgpu.sim.state import CONTAINER, NodeIndex, PlacedSpot, Run, World

SPOT_QUEUE: Final = "spot"
RESERVED_QUEUE: Final = "reserved"
QUEUES: Final = (Queue(RESERVED_QUEUE, QueueType.RESERVED), Queue(SPOT_QUEUE, QueueType.SPOT))

ForecastFn = Callable[[NodeSim, float], Mapping[DeviceID, IdleForecast]]


class Snapshots:
    """Builds each cycle's snapshot from the model (see module docstring)."""

    __slots__ = ("forecast", "index", "placed", "run", "world")

    def __init__(self, run: Run, world: World, index: NodeIndex, placed: PlacedSpot, forecast: ForecastFn) -> None:
        self.run = run
        self.world = world
        self.index = index
        self.placed = placed
        self.forecast = forecast
        """The agents' idle forecasts per node at a time (what ``spotgpu.io/idle-forecast`` carries)."""

    # --- per-node rebuilds ------------------------------------------------------------------
    def refresh(self) -> None:
        """Rebuild every node changed since the last refresh."""
        for node in self.index.dirty:
            self.rebuild_node(node)
        self.index.dirty.clear()

    def _twin_health(self, node: NodeSim) -> dict[DeviceID, Health]:
        """The agent's twin health for ``node``, recomputed only when its inputs changed."""
        lending = self.run.policy.lending
        key = tuple(
            (g.owner, g.owner_sim.lend if g.owner_sim is not None and lending else None, g.shadow is not None)
            for g in node.gpus
        )
        if key == node.health_key and node.health is not None:
            return node.health
        lend_states: dict[ContainerRef, LendState] = {}
        shadows: set[ContainerRef] = set()
        table: dict[Owner, list[DeviceEntry]] = {}
        for gpu in node.gpus:
            if gpu.owner_sim is not None:
                lend_states[gpu.owner_sim.ref] = gpu.owner_sim.lend if lending else LendState.ACTIVE
            elif gpu.shadow is not None and gpu.owner is not None:
                shadows.add(gpu.owner)
            owner: Owner = gpu.owner if gpu.owner is not None else IDLE_SPACE
            # Twin health depends on owners only; users are left out of this mapping.
            table.setdefault(owner, []).append(DeviceEntry(gpu.id, ()))
        mapping = MappingSnapshot(tuple(OwnerEntry(o, tuple(d)) for o, d in table.items()))
        devices = [self.world.gpu_devices[g.id] for g in node.gpus]
        node.health = twin_health(devices, mapping, lend_states, frozenset(shadows))
        node.health_key = key
        return node.health

    def rebuild_node(self, node: NodeSim) -> None:
        """Refresh a changed node: twin health (the agent's rule), its scheduler object, and its
        indexes from the scheduler's own per-node summary (:mod:`spotgpu.sim.schedview`)."""
        health = self._twin_health(node)
        nominated = self.world.nominated
        lending = self.run.policy.lending
        views = node_views(node, health, nominated)
        summary = node_summary(views, lending)
        objs = []
        kind: list[tuple[object, ...]] = []
        lent = False
        for gpu, view in zip(node.gpus, views, strict=True):
            twin = health[gpu.id]
            obj = gpu.cached
            if obj is None or obj.owner != gpu.owner or obj.twin is not twin:
                obj = gpu.cached = GPU(gpu.id, owner=gpu.owner, twin=twin)
            objs.append(obj)
            held = gpu.owner is not None
            holder = 0 if not held else 1 if gpu.shadow is not None else 2 if gpu.owner_sim is not None else 3
            shadow = view.shadow
            draining = shadow is not None and bool(shadow.deleting or shadow.nominated)
            users = gpu.users
            kind.append(
                (holder, view.twin_ok, gpu.id in nominated, draining, bool(users), sum(u.request.milli for u in users))
            )
            lent = lent or (gpu.owner_sim is not None and gpu.owner_sim.lend is LendState.LENT)
        node.cached = Node(node.name, tuple(objs), lending=lending, strategy=self.run.policy.strategy)
        node.free_twins = summary.spot_unallocated + summary.spot_lent
        node.unallocated = summary.available
        self.index.room += summary.unallocated_milli - node.room
        node.room = summary.unallocated_milli
        node.gpu_states = kind
        node.kind = tuple(sorted(kind))
        node.preempt_key = (summary.top_priority, -summary.zero_cost, -summary.available)
        index = self.index
        (index.spot_room.add if node.free_twins else index.spot_room.discard)(node)
        (index.unalloc_nodes.add if node.unallocated else index.unalloc_nodes.discard)(node)
        (index.real_room.add if summary.free else index.real_room.discard)(node)
        (index.lent_nodes.add if lent and lending else index.lent_nodes.discard)(node)

    # --- scheduler objects ------------------------------------------------------------------
    def _pod_obj(self, pod: PodSim) -> Pod:
        if pod.cached is None:
            job = pod.job
            pod.cached = Pod(
                pod.ref,
                job.spec.name,
                pod.request,
                CONTAINER,
                node=pod.node.name if pod.node is not None else None,
                devices=pod.devices,
                start_time=job.bound_at if pod.node is not None else None,
                evicting=pod.evicting,
                nominated=pod.nominated,
                created_at=job.submitted_at,
            )
        return pod.cached

    def _group_obj(self, job: JobSim) -> PodGroup:
        if job.cached_group is None:
            spec = job.spec
            job.cached_group = PodGroup(
                job.group_ref,
                SPOT_QUEUE if job.spot else RESERVED_QUEUE,
                min_member=len(spec.pod_gpus),
                priority=spec.reserved_priority,
                spot_priority=spec.priority,
                phase=job.pod_phase,
                created_at=job.arrival,
                min_lease=spec.min_lease,
                checkpoint_interval=self.run.scenario.checkpoint_interval if job.spot else 0.0,
            )
        return job.cached_group

    @staticmethod
    def _shadow_obj(shadow: ShadowSim) -> ShadowPod:
        if shadow.cached is None:
            shadow.cached = ShadowPod(
                shadow.ref,
                shadow.node.name,
                tuple(g.id for g in shadow.gpus),
                CONTAINER,
                group=shadow.group,
                created_at=shadow.created_at,
                deleting=shadow.deleting,
            )
        return shadow.cached

    # --- the snapshot -----------------------------------------------------------------------
    def build(self) -> Snapshot | None:
        """The snapshot for a cycle now, or None when no cycle could decide anything.

        Trimmed (the default): the nodes with room for the offered spot pods (the first of each
        node kind, :meth:`first_per_kind`), those with room for pending reserved pods, the
        nodes nominated for them, when a reserved gang still needs victims the first
        ``pods + preemptCandidateNodes`` nodes in the scheduler's documented preemption order
        (lowest top spot priority, most GPUs free without victims, most reclaimable), the nodes
        of ShadowPods due for collection, and every node of a gang running on any of these.
        When a pending spot gang wants a lease (``minLease`` or ``checkpointInterval``), the
        scheduler's node classes carry the forecast buckets of lent twins and its device picker
        checks each lent GPU's exact ``p20`` against the lease, so the kinds carry both
        (:meth:`Forecasts.kind`). Whether forecasts take part in a cycle is a cycle-wide question
        (some node has one) that a trimmed snapshot without lent nodes may answer differently;
        it then has no lent twin to score or pick, so the answer changes nothing. The ``auto``
        strategy's demand rule counts pending spot demand and unallocated room cycle-wide, so a
        trimmed snapshot carries what it leaves out (:meth:`_outside`).
        """
        self.refresh()
        world, index, hooks = self.world, self.index, self.run.hooks
        config = self.run.scenario.scheduler
        now = self.run.engine.now
        forecasts = Forecasts(self.forecast, now, index.lent_nodes)
        pending = list(world.pending.values())
        gc_due = [s for s in world.idle_shadows.values() if now - config.shadow_gc_grace >= s.created_at]
        if not hooks.trim_snapshots:
            if not pending and not gc_due:
                return None
            return self._snapshot_of(list(world.nodes), pending, forecasts, None)
        spot_in = (
            self.spot_candidates(pending)
            if hooks.cap_pending
            else sorted((j for j in pending if j.spot), key=lambda j: (j.arrival, j.spec.name))
        )
        reserved_in = [j for j in pending if not j.spot]
        if not spot_in and not reserved_in and not gc_due:
            return None
        checkpoint = self.run.scenario.checkpoint_interval
        leases = any(j.spot and (checkpoint > 0 or j.spec.min_lease > 0) for j in pending)
        # The exact thresholds the scheduler compares a lent GPU's p20 with: each pending spot
        # gang's minLease and, on auto nodes (their covering try), its want.
        auto = self.run.policy.strategy is NodeStrategy.AUTO
        wants = {max(j.spec.min_lease, checkpoint) for j in pending if j.spot} if auto else set()
        forecasts.thresholds = tuple(
            sorted({j.spec.min_lease for j in pending if j.spot and j.spec.min_lease > 0} | {w for w in wants if w > 0})
        )
        kind_of = forecasts.kind if leases else _plain_kind
        chosen: set[NodeSim] = set()
        if spot_in:
            chosen |= self.first_per_kind(index.spot_room, sum(len(j.pods) for j in spot_in), kind_of)
        if reserved_in:
            reserved_pods = sum(len(j.pods) for j in reserved_in)
            chosen |= self.first_per_kind(index.real_room, reserved_pods, kind_of)
            if any(p.nominated is None for j in reserved_in for p in j.pods):
                # Victim search: the scheduler walks nodes in its preemption order and
                # evaluates at most preemptCandidateNodes feasible ones per task. A task that
                # is already nominated (its victims are going) is settled on its node at zero
                # cost first, so only gangs with un-nominated pods need the candidates.
                budget = reserved_pods + config.preempt_candidate_nodes
                chosen.update(sorted(index.unalloc_nodes, key=lambda n: (n.preempt_key, n.index))[:budget])
        for job in reserved_in:
            for pod in job.pods:
                if pod.nominated is not None:
                    chosen.add(world.nodes_by_name[pod.nominated.node])
        chosen.update(s.node for s in gc_due)
        nodes = self._closure(chosen)
        outside = self._outside(nodes, pending, spot_in)
        return self._snapshot_of(nodes, spot_in + reserved_in, forecasts, outside)

    def _outside(self, nodes: list[NodeSim], pending: list[JobSim], spot_in: list[JobSim]) -> SpotOutside:
        """What the scheduler's ``auto`` demand rule would have counted on the nodes and pending
        spot gangs a trimmed snapshot leaves out (``spotgpu.scheduler.demand``; the simulator has
        no pools: its nodes are in pool ``""``, its gangs in none)."""
        offered = set(spot_in)
        left = sum(
            p.request.gpus * GPU_MILLI + p.request.milli
            for j in pending
            if j.spot and j not in offered
            for p in j.pods
            if p.node is None
        )
        room = self.index.room - sum(n.room for n in nodes)
        return SpotOutside(pending={None: left} if left else {}, room={"": room} if room else {})

    def _snapshot_of(
        self, nodes: list[NodeSim], jobs: list[JobSim], forecasts: Forecasts, outside: SpotOutside | None
    ) -> Snapshot:
        """The snapshot of ``nodes`` (with every pod and ShadowPod on them, and their idle
        forecasts) and pending ``jobs``; ``outside``: what a trimmed one leaves out."""
        # Keyed by the model's objects (identity hashing); every order below is deterministic:
        # nodes by index, their GPUs in order, pending jobs in submission order.
        pods: dict[PodSim, Pod] = {}
        groups: dict[JobSim, PodGroup] = {}
        shadows: dict[ShadowSim, ShadowPod] = {}
        node_objs = []
        for node in nodes:
            node_objs.append(_node_obj(node, forecasts.of(node)))
            for gpu in node.gpus:
                held = gpu.reserved_pod
                if held is not None and held not in pods:
                    pods[held] = self._pod_obj(held)
                    if held.job not in groups:
                        groups[held.job] = self._group_obj(held.job)
                for user in gpu.users:
                    if user not in pods:
                        pods[user] = self._pod_obj(user)
                        if user.job not in groups:
                            groups[user.job] = self._group_obj(user.job)
                shadow = gpu.shadow
                if shadow is not None and shadow not in shadows:
                    shadows[shadow] = self._shadow_obj(shadow)
        for job in jobs:
            groups[job] = self._group_obj(job)
            for pod in job.pods:
                pods[pod] = self._pod_obj(pod)
        stats = self.run.metrics.cycles
        stats.snapshot_nodes += len(node_objs)
        stats.snapshot_groups += len(groups)
        # A trimmed snapshot leaves running spot gangs out: victims are scored as in the full one.
        scale = self.placed.victim_scale() if self.run.hooks.trim_snapshots else None
        return Snapshot(
            tuple(node_objs),
            QUEUES,
            tuple(groups.values()),
            tuple(pods.values()),
            tuple(shadows.values()),
            scale,
            outside,
        )

    # --- trimming ---------------------------------------------------------------------------
    def spot_candidates(self, pending: list[JobSim]) -> list[JobSim]:
        """Pending spot gangs that a cycle could place now.

        A gang needs at least its GPUs in free Healthy twins, and a node with room for its
        largest pod. Gangs of one *class* (same spot priority and pod sizes) are ordered by the
        scheduler by age alone (its job order is priority, nomination, creation time, name), and
        a spot gang frees nothing for the next one, so once one of a class fails the later ones
        fail too; and at most ``free // gpus`` of a class can be placed. Only those oldest ones
        are offered.
        """
        room = self.index.spot_room
        free_total = sum(n.free_twins for n in room)
        free_max = max((n.free_twins for n in room), default=0)
        taken: dict[tuple[object, tuple[int, ...]], int] = {}
        out = []
        for job in sorted((j for j in pending if j.spot), key=lambda j: (j.arrival, j.spec.name)):
            spec = job.spec
            if spec.gpus > free_total or max(spec.pod_gpus) > free_max:
                continue
            key = (spec.priority, spec.pod_gpus)
            n = taken.get(key, 0)
            if n < free_total // spec.gpus:
                taken[key] = n + 1
                out.append(job)
        return out

    @staticmethod
    def first_per_kind(
        candidates: set[NodeSim], cap: int, kind_of: Callable[[NodeSim], tuple[object, ...]]
    ) -> set[NodeSim]:
        """The first ``cap`` candidate nodes (in snapshot order) of each node *kind*.

        A kind (``kind_of``) is the multiset of per-GPU states (holder, twin health, nomination,
        ShadowPod draining or being deleted, users, milli, and in cycles where forecasts can take
        part the forecast bucket of a GPU whose owner is lent): a refinement of the scheduler's
        node class, whose members it tries in snapshot order (a node that changes class during
        the cycle goes to the end of its new class). Each placement moves its node to another
        class, so a cycle with ``cap`` pending pods can reach at most the first ``cap`` nodes of
        a kind.
        """
        kinds: dict[tuple[object, ...], list[NodeSim]] = {}
        for node in candidates:
            kinds.setdefault(kind_of(node), []).append(node)
        chosen: set[NodeSim] = set()
        for members in kinds.values():
            if len(members) > cap:
                members.sort(key=lambda n: n.index)
                del members[cap:]
            chosen.update(members)
        return chosen

    @staticmethod
    def _closure(chosen: set[NodeSim]) -> list[NodeSim]:
        """``chosen`` plus the nodes of every gang with a pod on them (gangs are whole in a snapshot)."""
        out = set(chosen)
        todo = list(chosen)
        seen_jobs: set[int] = set()
        while todo:
            node = todo.pop()
            for gpu in node.gpus:
                for pod in (gpu.reserved_pod, *gpu.users):
                    if pod is None or pod.job.index in seen_jobs:
                        continue
                    seen_jobs.add(pod.job.index)
                    for sibling in pod.job.pods:
                        if sibling.node is not None and sibling.node not in out:
                            out.add(sibling.node)
                            todo.append(sibling.node)
        return sorted(out, key=lambda n: n.index)


class Forecasts:
    """The agents' idle forecasts at one cycle: asked once per node, only of nodes with a lent owner."""

    __slots__ = ("_known", "at", "fn", "lent", "thresholds")

    def __init__(self, fn: ForecastFn, at: float, lent: set[NodeSim]) -> None:
        self.fn = fn
        self.at = at
        self.lent = lent
        self.thresholds: tuple[float, ...] = ()
        """The distinct lease thresholds of the pending spot gangs, ascending: each one's minimum
        lease and its want (``max(minLease, checkpointInterval)``, what the ``auto`` strategy's
        covering try compares with), those above 0."""
        self._known: dict[NodeSim, Mapping[DeviceID, IdleForecast]] = {}

    def of(self, node: NodeSim) -> Mapping[DeviceID, IdleForecast]:
        if node not in self.lent:
            return NO_FORECAST
        known = self._known.get(node)
        if known is None:
            known = self._known[node] = self.fn(node, self.at)
        return known

    def kind(self, node: NodeSim) -> tuple[object, ...]:
        """``node.kind`` with, per GPU, what the scheduler reads of its forecast, when the node has
        forecasts (they change with time, not with a rebuild): the bucket of its ``p20``
        (:func:`spotgpu.scheduler.lease.bucket`, which node classes carry; unknown: -1) and how
        many of the pending gangs' lease thresholds that ``p20`` covers (the device picker's exact
        rule: two nodes of a class whose lent GPUs cover different leases are not interchangeable)."""
        forecast = self.of(node)
        if not forecast:
            return node.kind
        leases = self.thresholds
        last = node.forecast_kind
        if last is not None and last[0] is node.gpu_states and last[1] is forecast and last[2] == leases:
            return last[3]
        out = []
        for state, gpu in zip(node.gpu_states, node.gpus, strict=True):
            f = forecast.get(gpu.id)
            if f is None:
                out.append((*state, lease.UNKNOWN, 0))
            else:
                out.append((*state, lease.bucket(f.p20), bisect.bisect_right(leases, f.p20)))
        out.sort()
        kind = tuple(out)
        node.forecast_kind = (node.gpu_states, forecast, leases, kind)
        return kind


def _plain_kind(node: NodeSim) -> tuple[object, ...]:
    return node.kind


def _node_obj(node: NodeSim, forecast: Mapping[DeviceID, IdleForecast]) -> Node:
    """The scheduler's node object with ``forecast`` (reused while neither changed)."""
    base = node.cached
    assert base is not None
    if not forecast:
        return base
    last = node.forecast_node
    if last is not None and last[0] is base and last[1] == forecast:
        return last[2]
    obj = dataclasses.replace(base, idle_forecast=forecast)
    node.forecast_node = (base, forecast, obj)
    return obj


__all__ = ["QUEUES", "RESERVED_QUEUE", "SPOT_QUEUE", "ForecastFn", "Forecasts", "Snapshots"]
