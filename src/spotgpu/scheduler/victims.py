"""Victim selection: which spot gangs a pending reserved gang evicts, and where it then goes.

Pure decision code; no side effects beyond the session state it is given (changes made through a
:class:`~spotgpu.scheduler.framework.Statement`, so the caller commits or discards them).

For one reserved task needing ``k`` GPUs, candidate nodes come from the preemption index in
order: nodes whose reclaimable GPUs carry only low-priority spot work first, then those with more
GPUs free without new victims. At most ``preemptCandidateNodes`` feasible nodes are evaluated
(a node where no new victim is needed ends the search at once). On a node:

* usable GPUs are healthy and unallocated or held by a ShadowPod (never a reserved owner's), and
  not nominated for another pod;
* a GPU whose users are all already being evicted, or that has none, costs nothing (victims
  already being evicted count as freed: no eviction storm);
* a GPU with live spot users is freed only if every one of their gangs is evicted. Candidate gangs
  are taken in ascending ``victim score / GPUs it frees on this node`` until enough GPUs are
  freed; then, highest score first, any gang not needed is given back, so the set is minimal;
* the node with the lowest total victim score wins (then fewer victims, then index order).

Whole gangs are evicted: a victim's pods on other nodes go too (and those GPUs then count as
freed for the remaining tasks of the same preemptor).
"""

from __future__ import annotations

from dataclasses import dataclass

from spotgpu.scheduler.framework import Session, Statement
from spotgpu.scheduler.state import GPUState, JobState, NodeState, TaskState


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


def _evaluate(costs: _Costs, task: TaskState, ns: NodeState) -> TaskPlan | None:
    k = task.gpus
    free_now: list[GPUState] = []
    freeing: list[GPUState] = []
    costly: list[tuple[GPUState, set[JobState]]] = []
    allowed = costs.allowed
    for g in ns.gpus:
        nominee = g.nominee
        if (nominee is not None and nominee is not task) or not g.healthy:
            continue
        shadow = g.shadow
        if g.owner is not None and (shadow is None or shadow.new):
            continue  # a reserved owner's GPU, or one lent through a ShadowPod created in this cycle
        if g.live == 0:
            (free_now if g.owner is None and not g.users else freeing).append(g)
            continue
        jobs: set[JobState] = set()
        for u in g.users:
            if u.tentative:
                break  # placed in this cycle: not in the cluster yet, nothing to evict
            if not u.evicting:
                j = u.job
                ok = allowed.get(j)
                if ok is None:
                    ok = costs.may_evict(j)
                if not ok:
                    break
                jobs.add(j)
        else:
            costly.append((g, jobs))
    zero = free_now + freeing  # free now first, then those still being freed
    if len(zero) + len(costly) < k:
        return None
    if len(zero) >= k:
        chosen = zero[:k]
        return TaskPlan(ns, chosen, [], [u for g in chosen for u in g.users if u.evicting], 0.0)
    waiting = [u for g in freeing for u in g.users if u.evicting]
    need = k - len(zero)
    credit: dict[JobState, float] = {}
    for _, jobs in costly:
        share = 1.0 / len(jobs)
        for j in jobs:
            credit[j] = credit.get(j, 0.0) + share
    scores = {j: costs.score(j) for j in credit}
    order = sorted(credit, key=lambda j: (scores[j] / credit[j], scores[j], j.ref))
    victims: set[JobState] = set()
    freed: list[GPUState] = []
    for j in order:
        victims.add(j)
        freed = [g for g, jobs in costly if jobs <= victims]
        if len(freed) >= need:
            break
    else:
        return None
    if len(victims) > 1:
        for j in sorted(victims, key=lambda j: (-scores[j], j.ref)):
            rest = victims - {j}
            without = [g for g, jobs in costly if jobs <= rest]
            if len(without) >= need:
                victims = rest
                freed = without
    chosen = zero + freed[:need]
    ordered = sorted(victims, key=lambda j: (scores[j], j.ref))
    return TaskPlan(ns, chosen, ordered, waiting, sum(scores[j] for j in ordered))


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
        problem = session.admit_problem(task)
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
