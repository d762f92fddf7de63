"""Spot plugin: where spot tasks may run, which GPUs they take, the ShadowPods they need, and
which spot gangs to evict.

Pure decision code; no side effects beyond the session state it is given.

Placement. A spot task only uses twins that are Healthy on healthy GPUs not nominated for a
preemptor (:func:`spotgpu.scheduler.rules.lend`), of three kinds: unallocated (a ShadowPod will
hold the real GPU), already held by a ShadowPod, or allocated to an idle owner on a node whose
annotation allows lending. Exclusive spot takes whole unused twins; shared spot takes ``milli`` of
one twin that no exclusive user holds. A task with ``min_lease`` uses a lent GPU only if its idle
forecast's ``p20`` covers the lease, and prefers the lent GPU whose forecast fits its want best
(:mod:`spotgpu.scheduler.lease`).

Strategy (node annotation ``platform.k8s.io/spot-prefer``): on ``idle`` nodes unallocated GPUs are
used first and exclusive tasks prefer these nodes; on ``lowpower`` nodes lent idle GPUs are used
first and shared tasks prefer these nodes. ``auto`` nodes (the default) are ``idle`` nodes whose
lent GPUs a task's first try restricts (:class:`~spotgpu.scheduler.mirrors.AutoLent`, chosen by
the session by :mod:`spotgpu.scheduler.demand`): ``none`` uses none of them; ``covering`` uses
only those whose forecast covers the task's want, and first, as a ``lowpower`` node uses its lent
GPUs. This plugin's filter, score and picker honour the restriction.
Node class score: 100 for a strategy match, plus up to 50 for how much of the request the node's
preferred kind of GPU covers, plus, for tasks that want a lease, up to 100 for the lease fit.

Reserve. When a spot task is placed on unallocated GPUs, a ShadowPod (new in this cycle, one per
gang and node within a statement) takes them; it becomes their device owner and, if the gang is
committed, a ``CreateShadowPod`` decision. Unreserve releases them again.

Victims. A reserved gang may evict spot gangs, never reserved ones. The victim score (lower is
evicted first) is the seed's weighted policy with each factor normalised over the running spot
gangs of the cycle::

    priority_class * priority / 3000 + task_number * tasks / max_tasks
      + task_resource * milli / max_milli + running_duration * d

with ``d = duration / max_duration`` (durationPolicy ``shortest``: the shortest-running is
evicted first, least work lost) or ``1 - duration / max_duration`` (``longest``). When the
snapshot carries a :class:`~spotgpu.scheduler.model.VictimScale` (it leaves running gangs out),
each maximum is the larger of the snapshot's own and the scale's.
"""

from __future__ import annotations

import hashlib
from typing import Final

from spotgpu.core.ids import NodeName
from spotgpu.core.refs import PodRef
from spotgpu.core.types import GPU_MILLI, DurationPolicy, NodeStrategy, SpotPriority
from spotgpu.scheduler import lease
from spotgpu.scheduler.framework import PLUGINS, Placement
from spotgpu.scheduler.mirrors import (
    AutoLent,
    GPUState,
    JobState,
    NodeClass,
    NodeState,
    ShadowState,
    TaskKind,
    TaskShape,
    TaskState,
)
from spotgpu.scheduler.rules import Lend, lend
from spotgpu.scheduler.session import Session
from spotgpu.scheduler.statement import Statement
from spotgpu.scheduler.status import OK, Status

NAME: Final = "spot"

MAX_SPOT_PRIORITY: Final = max(p.value_int for p in SpotPriority)

# Order in which a node's kinds of lendable GPU are used, per strategy (lower first).
_IDLE_RANK: Final = {Lend.SHADOW: 0, Lend.NEW_SHADOW: 1, Lend.LENT: 2}
_RANK: Final = {
    NodeStrategy.AUTO: _IDLE_RANK,
    NodeStrategy.IDLE: _IDLE_RANK,
    NodeStrategy.LOWPOWER: {Lend.LENT: 0, Lend.SHADOW: 1, Lend.NEW_SHADOW: 2},
}
_UNALLOCATED_FIRST: Final = frozenset({NodeStrategy.AUTO, NodeStrategy.IDLE})


def _lent_first(shape: TaskShape, strategy: NodeStrategy) -> bool:
    """Whether ``shape`` uses a node's (usable) lent GPUs before its unallocated ones."""
    if strategy is NodeStrategy.AUTO:
        return shape.auto_lent is AutoLent.COVERING
    return strategy not in _UNALLOCATED_FIRST


def shadow_name(group: PodRef, node: NodeName, first_device: str, now: float) -> str:
    """Deterministic ShadowPod name, a valid DNS subdomain.

    Unique per (gang, node, first device, cycle time): a device has one holder at a time, and the
    time keeps a new ShadowPod from colliding with an earlier one of the same gang still terminating.
    """
    text = f"{group}/{node}/{first_device}/{now!r}"
    digest = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:10]
    return f"{group.name[:200].rstrip('.-')}-shadow-{digest}"


def _partial_fits(shape: TaskShape, cls: NodeClass) -> bool:
    """Some partly used twin of the class may take ``shape.milli`` (lent ones only where allowed)."""
    if not any(p >= shape.milli for p in cls.partials):
        return False
    if shape.auto_lent is AutoLent.ALL or cls.strategy is not NodeStrategy.AUTO:
        return True  # (a restricted try uses no lent partials: their forecasts are not in the class)
    lent = list(cls.lent_partials)
    for p in cls.partials:  # is one of the fitting partials not a lent one?
        if p in lent:
            lent.remove(p)
        elif p >= shape.milli:
            return True
    return False


_NO_FIT: Final = (0, 0.0)


def _fit(g: GPUState, how: Lend, want: float) -> tuple[int, float]:
    """Best-fit order of a lent GPU for a task wanting ``want`` s (others: as if infinite, first)."""
    return lease.fit_key(g.p20, want) if want and how is Lend.LENT else (0, 0.0)


class SpotPlugin:
    def __init__(self, session: Session) -> None:
        self.weights = session.config.victim
        self.now = session.now
        self.state = session.state
        self.shadow_container = session.config.shadow_container
        self.shadow_namespace = session.config.shadow_namespace
        self._scores: dict[JobState, float] = {}
        max_tasks = max_milli = 0
        max_duration = 0.0
        for job in session.state.jobs.values():
            if not job.spot or not job.ready:
                continue
            tasks, milli, duration = self._facts(job)
            max_tasks = max(max_tasks, tasks)
            max_milli = max(max_milli, milli)
            max_duration = max(max_duration, duration)
        scale = session.state.victim_scale
        if scale is not None:
            max_tasks = max(max_tasks, scale.tasks)
            max_milli = max(max_milli, scale.milli)
            if scale.earliest_start is not None:
                max_duration = max(max_duration, self.now - scale.earliest_start)
        self.max_tasks, self.max_milli, self.max_duration = max_tasks, max_milli, max_duration

    # -- placement --------------------------------------------------------------------------
    def class_status(self, shape: TaskShape, cls: NodeClass) -> Status:
        if shape.kind is TaskKind.EXCLUSIVE:
            if cls.spot_free < shape.gpus:
                reason = f"have fewer than {shape.gpus} lendable spot GPUs (Healthy twins)"
                return Status.unresolvable(reason) if cls.gpus < shape.gpus else Status.unschedulable(reason)
            if cls.spot_usable(shape) < shape.gpus:
                return Status.unschedulable(self._lent_reason(shape, cls))
        elif shape.kind is TaskKind.SHARED:
            if cls.spot_free < 1 and not any(p >= shape.milli for p in cls.partials):
                return Status.unschedulable(f"have no lendable spot GPU with {shape.milli} milli left")
            if cls.spot_usable(shape) < 1 and not _partial_fits(shape, cls):
                return Status.unschedulable(self._lent_reason(shape, cls))
        return OK

    @staticmethod
    def _lent_reason(shape: TaskShape, cls: NodeClass) -> str:
        need = shape.gpus or 1
        restricted = cls.strategy is NodeStrategy.AUTO and shape.auto_lent is not AutoLent.ALL
        if shape.min_lease and not restricted:
            return (
                f"have fewer than {need} lendable spot GPUs that are unallocated or whose owner's idle "
                f"forecast (p20) covers minLease {shape.min_lease:g}s"
            )
        if restricted and shape.auto_lent is AutoLent.COVERING:
            return (
                f"have fewer than {need} lendable spot GPUs that are unallocated or whose owner's idle "
                f"forecast (p20) covers {shape.want:g}s (a first try on auto nodes)"
            )
        return f"have fewer than {need} unallocated lendable spot GPUs (lent GPUs of auto nodes come last)"

    def class_score(self, shape: TaskShape, cls: NodeClass) -> float:
        if shape.kind is TaskKind.RESERVED:
            return 0.0
        match_exclusive = cls.strategy in _UNALLOCATED_FIRST
        idle = not _lent_first(shape, cls.strategy)
        lent = cls.lent_usable(shape)
        preferred = cls.spot_unallocated if idle else lent
        if shape.kind is TaskKind.EXCLUSIVE:
            match = 100.0 if match_exclusive else 0.0
            score = match + 50.0 * min(shape.gpus, preferred) / shape.gpus
            takes_lent = (cls.spot_unallocated < shape.gpus) if idle else lent > 0
        else:
            match = 0.0 if match_exclusive else 100.0
            fits_partial = any(p >= shape.milli for p in cls.partials)
            score = match + (50.0 if fits_partial or preferred else 0.0)
            takes_lent = (not fits_partial and not cls.spot_unallocated) if idle else lent > 0
        if shape.want and self.state.forecasts:
            score += self._lease_score(shape, cls, idle, takes_lent)
        return score

    @staticmethod
    def _lease_score(shape: TaskShape, cls: NodeClass, idle: bool, takes_lent: bool) -> float:
        """0..100 for how well the lent twins a task would take fit its want (unknown: 0).

        Classes a task would take no lent twin of score as the task's order on them ranks
        unallocated GPUs: first (100) on idle and auto nodes, last (0) on lowpower nodes and for a
        ``covering`` try on auto nodes."""
        if not takes_lent:
            return 100.0 if idle else 0.0
        return lease.fit_score(cls.lent_leases, shape.want)

    def handles(self, kind: TaskKind) -> bool:
        return kind is not TaskKind.RESERVED

    @staticmethod
    def _usable(shape: TaskShape, node: NodeState, unused_only: bool) -> list[tuple[GPUState, Lend]]:
        """The node's GPUs ``shape`` may use (only those without users if ``unused_only``), each with
        how (:func:`spotgpu.scheduler.rules.lend`, restricted by the lease and, on a first try, by
        the restriction of ``auto`` nodes' lent GPUs)."""
        lending = node.node.lending
        restrict = shape.auto_lent if node.node.strategy is NodeStrategy.AUTO else AutoLent.ALL
        if not shape.min_lease and restrict is AutoLent.ALL:
            if unused_only:
                return [(g, how) for g in node.gpus if not g.users and (how := lend(g, lending))]
            return [(g, how) for g in node.gpus if (how := lend(g, lending))]
        # A covering try needs the want covered (want >= min_lease); otherwise the lease, if any.
        need = shape.want if restrict is AutoLent.COVERING else shape.min_lease
        out = []
        for g in node.gpus:
            if unused_only and g.users:
                continue
            how = lend(g, lending)
            if how is Lend.LENT and (restrict is AutoLent.NONE or (need and not lease.covers(g.p20, need))):
                continue
            if how:
                out.append((g, how))
        return out

    def pick_devices(self, shape: TaskShape, task: TaskState, node: NodeState) -> list[GPUState] | None:
        strategy = node.node.strategy
        rank = _RANK[NodeStrategy.LOWPOWER if _lent_first(shape, strategy) else strategy]
        want = shape.want if self.state.forecasts else 0.0
        if task.kind is TaskKind.EXCLUSIVE:
            fresh = self._usable(shape, node, unused_only=True)
            if len(fresh) < task.gpus:
                return None
            if want:
                fresh.sort(key=lambda e: (rank[e[1]], _fit(e[0], e[1], want), e[0].index))
            else:
                fresh.sort(key=lambda e: (rank[e[1]], e[0].index))
            return [g for g, _ in fresh[: task.gpus]]
        best: tuple[object, ...] | None = None
        chosen: GPUState | None = None
        for g, how in self._usable(shape, node, unused_only=False):
            fit = _fit(g, how, want) if want else _NO_FIT
            if g.users:
                if g.exclusive or GPU_MILLI - g.used_milli < task.milli:
                    continue
                key: tuple[object, ...] = (0, GPU_MILLI - g.used_milli, rank[how], fit)
            else:
                key = (1, rank[how], fit, g.index)
            if best is None or key < best:
                best, chosen = key, g
        return [chosen] if chosen is not None else None

    # -- reserve: ShadowPods for unallocated GPUs ---------------------------------------------
    def reserve(self, stmt: Statement, task: TaskState, placement: Placement) -> Status:
        if task.kind is TaskKind.RESERVED:
            return OK
        needs = [g for g in placement.gpus if g.owner is None]
        if not needs:
            return OK
        ns = placement.node
        job = task.job
        key = (NAME, job.ref, ns.name)
        shadow = stmt.scratch.get(key)
        if not isinstance(shadow, ShadowState):
            now = self.now
            ref = PodRef(
                self.shadow_namespace, shadow_name(job.ref, ns.name, needs[0].id, now)
            )  # scheduler-only namespace
            shadow = ShadowState(ref, ref.container(self.shadow_container), ns, job.ref, now, new=True)
            stmt.scratch[key] = shadow
        self.state.add_shadow(shadow, needs, refresh=False)  # the placement that follows refreshes
        stmt.scratch[(NAME, task.ref)] = needs
        return OK

    def unreserve(self, stmt: Statement, task: TaskState, placement: Placement) -> None:
        needs = stmt.scratch.pop((NAME, task.ref), None)
        if not isinstance(needs, list) or not needs:
            return
        shadow = needs[0].shadow
        assert shadow is not None and shadow.new
        self.state.release_from_shadow(shadow, needs)
        if not shadow.devices:
            stmt.scratch.pop((NAME, task.job.ref, placement.node.name), None)

    # -- victims ----------------------------------------------------------------------------
    def _facts(self, job: JobState) -> tuple[int, int, float]:
        tasks = milli = 0
        start: float | None = None
        for t in job.tasks:
            if t.node is None or t.evicting:
                continue
            tasks += 1
            milli += t.request_milli
            if t.start_time is not None and (start is None or t.start_time < start):
                start = t.start_time
        duration = max(0.0, self.now - start) if start is not None else 0.0
        return tasks, milli, duration

    def victim_score(self, job: JobState) -> float:
        score = self._scores.get(job)
        if score is None:
            w = self.weights
            tasks, milli, duration = self._facts(job)
            d = duration / self.max_duration if self.max_duration else 0.0
            if w.duration_policy is DurationPolicy.LONGEST:
                d = 1.0 - d
            score = (
                w.priority_class * job.priority / MAX_SPOT_PRIORITY
                + (w.task_number * tasks / self.max_tasks if self.max_tasks else 0.0)
                + (w.task_resource * milli / self.max_milli if self.max_milli else 0.0)
                + w.running_duration * d
            )
            self._scores[job] = score
        return score

    def may_evict(self, preemptor: JobState, victim: JobState) -> bool:
        return not preemptor.spot and victim.spot


PLUGINS.register(NAME, SpotPlugin)
