"""Spot plugin: where spot tasks may run, which GPUs they take, and which spot gangs to evict.

Pure decision code; no side effects.

Placement. A spot task only uses twins that are Healthy on healthy GPUs not nominated for a
preemptor, of three kinds: unallocated (a ShadowPod will hold the real GPU), already held by a
ShadowPod, or allocated to an idle owner on a node whose annotation allows lending. Exclusive spot
takes whole unused twins; shared spot takes ``milli`` of one twin that no exclusive user holds.

Strategy (node annotation ``platform.k8s.io/spot-prefer``): on ``idle`` nodes unallocated GPUs are
used first and exclusive tasks prefer these nodes; on ``lowpower`` nodes lent idle GPUs are used
first and shared tasks prefer these nodes. Node class score: 100 for a strategy match, plus up to
50 for how much of the request the node's preferred kind of GPU covers.

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

from typing import Final

from spotgpu.core.types import GPU_MILLI, DurationPolicy, NodeStrategy, SpotPriority
from spotgpu.scheduler.framework import PLUGINS, Session
from spotgpu.scheduler.state import GPUState, JobState, Lend, NodeClass, NodeState, TaskKind, TaskShape, TaskState

NAME: Final = "spot"

MAX_SPOT_PRIORITY: Final = max(p.value_int for p in SpotPriority)

# Order in which a node's kinds of lendable GPU are used, per strategy (lower first).
_RANK: Final = {
    NodeStrategy.IDLE: {Lend.SHADOW: 0, Lend.NEW_SHADOW: 1, Lend.LENT: 2},
    NodeStrategy.LOWPOWER: {Lend.LENT: 0, Lend.SHADOW: 1, Lend.NEW_SHADOW: 2},
}


class SpotPlugin:
    def __init__(self, session: Session) -> None:
        self.weights = session.config.victim
        self.now = session.now
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
    def class_problem(self, shape: TaskShape, cls: NodeClass) -> str | None:
        if shape.kind is TaskKind.EXCLUSIVE:
            if cls.spot_free < shape.gpus:
                return f"have fewer than {shape.gpus} lendable spot GPUs (Healthy twins)"
        elif shape.kind is TaskKind.SHARED and cls.spot_free < 1 and not any(p >= shape.milli for p in cls.partials):
            return f"have no lendable spot GPU with {shape.milli} milli left"
        return None

    def class_score(self, shape: TaskShape, cls: NodeClass) -> float:
        if shape.kind is TaskKind.RESERVED:
            return 0.0
        idle = cls.strategy is NodeStrategy.IDLE
        preferred = cls.spot_unallocated if idle else cls.spot_lent
        if shape.kind is TaskKind.EXCLUSIVE:
            match = 100.0 if idle else 0.0
            return match + 50.0 * min(shape.gpus, preferred) / shape.gpus
        match = 0.0 if idle else 100.0
        fits_partial = any(p >= shape.milli for p in cls.partials)
        return match + (50.0 if fits_partial or preferred else 0.0)

    def handles(self, kind: TaskKind) -> bool:
        return kind is not TaskKind.RESERVED

    def pick_devices(self, task: TaskState, node: NodeState) -> list[GPUState] | None:
        rank = _RANK[node.node.strategy]
        if task.kind is TaskKind.EXCLUSIVE:
            fresh = [g for g in node.gpus if not g.users and g.lend()]
            if len(fresh) < task.gpus:
                return None
            fresh.sort(key=lambda g: (rank[g.lend()], g.index))
            return fresh[: task.gpus]
        best: tuple[int, int, int] | None = None
        chosen: GPUState | None = None
        for g in node.gpus:
            lend = g.lend()
            if not lend:
                continue
            if g.users:
                if g.exclusive or GPU_MILLI - g.used_milli < task.milli:
                    continue
                key = (0, GPU_MILLI - g.used_milli, rank[lend])
            else:
                key = (1, rank[lend], g.index)
            if best is None or key < best:
                best, chosen = key, g
        return [chosen] if chosen is not None else None

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
