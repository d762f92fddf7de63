"""Victim selection: which spot gangs a pending reserved gang evicts, and where it then goes.

Pure decision code; no side effects beyond the session state it is given (changes made through a
:class:`~spotgpu.scheduler.framework.Statement`, so the caller commits or discards them).

For one reserved task needing ``k`` GPUs, candidate nodes come from the preemption index in
order: nodes whose reclaimable GPUs carry only low-priority spot work first, then those with more
GPUs free without new victims. At most ``preemptCandidateNodes`` feasible nodes are evaluated
(a node where no new victim is needed ends the search at once). On a node:

* usable GPUs are healthy and unallocated or held by a ShadowPod from an earlier cycle (never a
  reserved owner's), and not nominated for another pod;
* GPUs are freed in *release units*. A pod's resources are immutable, so a ShadowPod releases
  all its GPUs or none: its usable GPUs form one unit, freed only once every spot gang using
  *any* of its GPUs (usable or not) is gone. An unallocated GPU, or one whose ShadowPod is
  already being deleted, is a unit of its own, freed once its own users are gone;
* a unit whose users are all already being evicted, or that has none, costs nothing (victims
  already being evicted count as freed: no eviction storm); a unit with a user placed in this
  cycle, or one the preemptor may not evict, cannot be freed;
* otherwise the victims are a set of gangs of least total victim score, then fewest gangs, that
  frees enough units (:func:`_cheapest_cover`: exact; units sharing gangs are searched together,
  independent groups are combined by a knapsack over the GPU count);
* the node with the lowest total victim score wins (then fewer victims, then index order).

Whole gangs are evicted: a victim's pods on other nodes go too (and those GPUs then count as
freed for the remaining tasks of the same preemptor). The nominated GPUs' ShadowPod is then
*draining* (:class:`~spotgpu.scheduler.state.ShadowState`): no new spot work may use any of its
GPUs, and it is deleted once its users are gone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from spotgpu.scheduler.mirrors import GPUState, JobState, NodeState, ShadowState, TaskState
from spotgpu.scheduler.session import Session
from spotgpu.scheduler.statement import Statement


@dataclass(slots=True)
class TaskPlan:
    """Where one preempting task goes and whom it evicts."""

    node: NodeState
    gpus: list[GPUState]
    victims: list[JobState]
    waiting: list[TaskState]
    cost: float


@dataclass(slots=True)
class GangPreemption:
    """The outcome for a whole preempting gang. When ``possible``, ``statement`` holds the changes."""

    job: JobState
    possible: bool
    statement: Statement
    victims: list[JobState]
    waiting: list[TaskState]
    nominated: list[TaskState]
    reason: str = ""


class _Costs:
    """Per-preemptor caches: victim scores and eviction permissions (fixed within a plan)."""

    __slots__ = ("allowed", "preemptor", "scores", "session")

    def __init__(self, session: Session, preemptor: JobState) -> None:
        self.session = session
        self.preemptor = preemptor
        self.allowed: dict[JobState, bool] = {}
        self.scores: dict[JobState, float] = {}

    def may_evict(self, job: JobState) -> bool:
        ok = self.allowed.get(job)
        if ok is None:
            ok = self.allowed[job] = self.session.may_evict(self.preemptor, job)
        return ok

    def score(self, job: JobState) -> float:
        score = self.scores.get(job)
        if score is None:
            score = self.scores[job] = self.session.victim_score(job)
        return score


class _Unit:
    """GPUs that are freed together: one GPU, or every usable GPU of one ShadowPod.

    ``mask`` has a bit per spot gang that must be evicted for the unit to be freed (its live
    users, on any GPU of the ShadowPod); ``waiting`` are users already being evicted.
    """

    __slots__ = ("gpus", "mask", "waiting")

    def __init__(self, mask: int, waiting: list[TaskState]) -> None:
        self.mask = mask
        self.waiting = waiting
        self.gpus: list[GPUState] = []


def _unit(costs: _Costs, gpus: list[GPUState], bits: dict[JobState, int]) -> _Unit | None:
    """The release unit of ``gpus`` (all of one ShadowPod, or one GPU).

    None if it cannot be freed: a user was placed in this cycle, or the preemptor may not evict it.
    """
    mask = 0
    waiting: list[TaskState] = []
    allowed = costs.allowed
    for g in gpus:
        for u in g.users:
            if u.tentative:
                return None  # placed in this cycle: not in the cluster yet, nothing to evict
            if u.evicting:
                waiting.append(u)
                continue
            j = u.job
            ok = allowed.get(j)
            if ok is None:
                ok = costs.may_evict(j)
            if not ok:
                return None
            bit = bits.get(j)
            if bit is None:
                bit = bits[j] = 1 << len(bits)
            mask |= bit
    return _Unit(mask, waiting)


def _evaluate(costs: _Costs, task: TaskState, ns: NodeState) -> TaskPlan | None:
    """The cheapest way to free ``task.gpus`` GPUs on ``ns`` for ``task``, or None.

    A GPU is usable when it is healthy, not nominated for another pod, and unallocated or held
    by a ShadowPod from an earlier cycle. It is freed with its *release unit*: an unallocated GPU
    (or one whose ShadowPod is already being deleted) once its own spot users are gone; a GPU of
    a ShadowPod only once the whole ShadowPod can be deleted, i.e. once every spot user of any of
    its GPUs (usable or not) is gone. Units without live users cost nothing.
    """
    k = task.gpus
    free_now: list[GPUState] = []
    freeing: list[GPUState] = []
    zero_waiting: list[TaskState] = []
    costly: list[_Unit] = []
    bits: dict[JobState, int] = {}
    units: dict[ShadowState | GPUState, _Unit | None] = {}
    for g in ns.gpus:
        nominee = g.nominee
        if (nominee is not None and nominee is not task) or not g.healthy:
            continue
        shadow = g.shadow
        if g.owner is not None and (shadow is None or shadow.new):
            continue  # a reserved owner's GPU, or one lent through a ShadowPod created in this cycle
        key: ShadowState | GPUState
        if shadow is not None and not shadow.deleting:
            key, members = shadow, shadow.devices  # released whole
        elif g.users:
            key, members = g, [g]
        else:
            # nobody uses it: free now if unallocated, else once its ShadowPod (being deleted) is gone
            (free_now if g.owner is None else freeing).append(g)
            continue
        if key in units:
            unit = units[key]  # an earlier GPU of the same ShadowPod
        else:
            unit = units[key] = _unit(costs, members, bits)
            if unit is not None and unit.mask:
                costly.append(unit)
            elif unit is not None:
                zero_waiting.extend(unit.waiting)
        if unit is None:
            continue
        if unit.mask:
            unit.gpus.append(g)
        else:
            freeing.append(g)
    zero = free_now + freeing  # free now first, then those still being freed
    if len(zero) >= k:
        chosen = zero[:k]
        if not zero_waiting:
            return TaskPlan(ns, chosen, [], [], 0.0)
        return TaskPlan(ns, chosen, [], _waiting_for(chosen, units), 0.0)
    need = k - len(zero)
    if sum(len(u.gpus) for u in costly) < need:
        return None
    jobs = list(bits)  # bit i is jobs[i]
    scores = [costs.score(j) for j in jobs]
    victims_mask = _cheapest_cover(costly, need, scores)
    freed_units = [u for u in costly if not u.mask & ~victims_mask]
    chosen = zero + [g for u in freed_units for g in u.gpus][:need]
    waiting = list(zero_waiting)
    for u in freed_units:
        waiting.extend(u.waiting)
    ordered = sorted((j for i, j in enumerate(jobs) if victims_mask >> i & 1), key=lambda j: (costs.score(j), j.ref))
    return TaskPlan(ns, chosen, ordered, _dedup(waiting), sum(costs.score(j) for j in ordered))


def _waiting_for(chosen: list[GPUState], units: dict[ShadowState | GPUState, _Unit | None]) -> list[TaskState]:
    """Users already being evicted that the chosen zero-cost GPUs wait for (on their whole unit)."""
    out: list[TaskState] = []
    seen: set[ShadowState | GPUState] = set()
    for g in chosen:
        key: ShadowState | GPUState = g.shadow if g.shadow is not None and not g.shadow.deleting else g
        unit = units.get(key)
        if unit is not None and key not in seen:
            seen.add(key)
            out.extend(unit.waiting)
    return _dedup(out)


def _dedup(tasks: list[TaskState]) -> list[TaskState]:
    return list(dict.fromkeys(tasks)) if len(tasks) > 1 else tasks


_Choice = tuple[float, int, int]
"""(total victim score, victims, victim mask): smaller is better (cost first, then fewer gangs)."""

_ENUMERATE_UNITS: Final = 12
"""Intertwined units (sharing gangs) up to this many are searched exhaustively (2^n subsets);
larger tangles (rare: shared spot spread over many GPUs) fall back to a greedy order."""


def _cheapest_cover(units: list[_Unit], need: int, scores: list[float]) -> int:
    """The victim set (bit mask) of least total score, then fewest gangs, freeing >= ``need`` GPUs.

    Exact for the sizes a node has: units that share no gang form independent components; each
    component's options (for every number of GPUs it can free, the cheapest victim set doing
    so) come from enumerating its unit subsets, and one option per component is then combined
    by a small knapsack over the GPU count (``need`` <= GPUs per node). A victim set frees every
    unit whose gangs it contains, so taking the union of some units' gangs covers all optimal
    sets. The caller guarantees that all units together free at least ``need`` GPUs.
    """
    total = sum(len(u.gpus) for u in units)
    if total - min(len(u.gpus) for u in units) < need:
        mask = 0  # every unit is needed
        for u in units:
            mask |= u.mask
        return mask
    # components: units linked by a shared gang
    comps: list[tuple[int, list[_Unit]]] = []
    for u in units:
        mask, members = u.mask, [u]
        rest = []
        for cm, cu in comps:
            if cm & mask:
                mask |= cm
                members.extend(cu)
            else:
                rest.append((cm, cu))
        rest.append((mask, members))
        comps = rest
    cost_cache: dict[int, _Choice] = {}

    def choice(mask: int) -> _Choice:
        c = cost_cache.get(mask)
        if c is None:
            total_score = 0.0
            n = 0
            m, i = mask, 0
            while m:
                if m & 1:
                    total_score += scores[i]
                    n += 1
                m >>= 1
                i += 1
            c = cost_cache[mask] = (total_score, n, mask)
        return c

    # best[g]: cheapest combination freeing g GPUs (capped at need) over the components so far
    best: list[_Choice | None] = [None] * (need + 1)
    best[0] = (0.0, 0, 0)
    for _, members in comps:
        options = _component_options(members, need, choice)
        merged = list(best)
        for have, base in enumerate(best):
            if base is None:
                continue
            for gain, opt in options.items():
                target = min(need, have + gain)
                cand = (base[0] + opt[0], base[1] + opt[1], base[2] | opt[2])
                cur = merged[target]
                if cur is None or cand[:2] < cur[:2]:
                    merged[target] = cand
        best = merged
    final = best[need]
    assert final is not None, "the units free fewer GPUs than needed"
    return final[2]


def _component_options(members: list[_Unit], need: int, choice: Callable[[int], _Choice]) -> dict[int, _Choice]:
    """For each number of GPUs (capped at ``need``) the component can free, its cheapest victim set."""
    options: dict[int, _Choice] = {}

    def offer(mask: int) -> None:
        gain = min(need, sum(len(u.gpus) for u in members if not u.mask & ~mask))
        c = choice(mask)
        cur = options.get(gain)
        if cur is None or c[:2] < cur[:2]:
            options[gain] = c

    if len(members) == 1:
        offer(members[0].mask)
    elif len(members) <= _ENUMERATE_UNITS:
        seen: set[int] = set()
        masks = [0]
        for u in members:  # the unions of every subset of the members' gang sets
            masks += [m | u.mask for m in masks]
        for mask in masks[1:]:
            if mask not in seen:
                seen.add(mask)
                offer(mask)
    else:
        mask = 0
        for u in sorted(members, key=lambda u: choice(u.mask)[:2]):
            mask |= u.mask
            offer(mask)
    return options


_Cache = dict[NodeState, tuple[int, int, TaskPlan | None]]


def plan_task(session: Session, task: TaskState, cache: _Cache | None = None) -> TaskPlan | str:
    """The cheapest victim set for one pending reserved task, or why there is none.

    ``cache`` (per preempting gang) keeps node evaluations for the gang's later tasks; an entry is
    used only while the node is unchanged (its version) and for the same GPU count, and never for
    a node holding GPUs nominated for the task being planned.
    """
    state = session.state
    shape = task.shape
    k = task.gpus
    best: TaskPlan | None = None
    limit = session.config.preempt_candidate_nodes
    feasible = 0
    examined = 0
    seen: set[NodeState] = set()
    nom = task.nomination
    candidates: list[NodeState] = [nom[0]] if nom is not None and nom[0].node.schedulable else []
    costs = _Costs(session, task.job)
    own_node = nom[0] if nom is not None else None

    def consider(ns: NodeState) -> bool:
        """Evaluate ``ns``; True when the search can stop."""
        nonlocal best, feasible, examined
        examined += 1
        hit = cache.get(ns) if cache is not None and ns is not own_node else None
        if hit is not None and hit[0] == ns.version and hit[1] == k:
            plan = hit[2]
        else:
            plan = _evaluate(costs, task, ns)
            if cache is not None and ns is not own_node:
                cache[ns] = (ns.version, k, plan)
        if plan is None:
            return examined >= limit * 8
        feasible += 1
        if best is None or (plan.cost, len(plan.victims), plan.node.order) < (
            best.cost,
            len(best.victims),
            best.node.order,
        ):
            best = plan
        return plan.cost == 0.0 or feasible >= limit or examined >= limit * 8

    for ns in candidates:
        seen.add(ns)
        if consider(ns):
            break
    else:
        for key in state.preempt_keys():
            if key.resource != shape.resource or -key.neg_available < k:
                continue
            if shape.pool is not None and key.pool != shape.pool:
                continue
            stop = False
            for ns in state.pindex[key]:
                if ns in seen:
                    continue
                if consider(ns):
                    stop = True
                    break
            if stop:
                break
    if best is None:
        return f"no node has {k} x {shape.resource} that evicting spot gangs could free"
    return best


def preempt_gang(session: Session, job: JobState) -> GangPreemption:
    """Plan evictions and nominations for every task ``job`` still needs, all or nothing.

    On success the changes are applied to the session state through the returned statement, which
    the caller commits (decisions) or discards (undo). On failure nothing is left changed.
    """
    stmt = Statement(session)
    need = job.group.min_member - job.ready
    victims: list[JobState] = []
    waiting: list[TaskState] = []
    nominated: list[TaskState] = []
    problems: list[str] = []
    pending = job.pending()
    cache: _Cache = {}
    for i, task in enumerate(pending):
        if len(nominated) >= need:
            break
        admit = session.admit_status(task)
        problem = None if admit.ok else admit.reason
        if problem is None:
            plan = plan_task(session, task, cache)
            if isinstance(plan, str):
                problem = plan
            else:
                for victim in plan.victims:
                    message = (
                        f"preempted by reserved PodGroup {job.ref} (priority {job.priority}): "
                        f"{task.ref.name} needs {task.gpus} GPUs on {plan.node.name}"
                    )
                    stmt.evict_job(victim, job, message)
                    victims.append(victim)
                waiting.extend(plan.waiting)
                stmt.nominate(task, plan.node, plan.gpus)
                nominated.append(task)
                continue
        if problem not in problems:
            problems.append(problem)
        if len(nominated) + len(pending) - i - 1 < need:
            break
    if len(nominated) >= need:
        return GangPreemption(job, True, stmt, victims, waiting, nominated)
    stmt.discard()
    return GangPreemption(job, False, stmt, [], [], [], "; ".join(problems) or "no pending pods")


__all__ = ["GangPreemption", "TaskPlan", "plan_task", "preempt_gang"]
