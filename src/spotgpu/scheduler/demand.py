"""The ``auto`` strategy's demand rule: does a cycle's pending demand fit the unallocated room?

Pure functions over the cycle's state; no side effects. The one home of the rule that decides,
per cycle and pool, which lent GPUs of ``auto`` nodes a spot task tries first
(:class:`~spotgpu.scheduler.mirrors.AutoLent`; docs/scheduler.md, "Strategies"). Judged once, on
the snapshot as the cycle opens:

* **demand**: the GPU milli that the snapshot's pending pods request, by their PodGroup's pool
  (``None``: any pool): spot pods (1000 per whole twin, a shared pod's milli), and reserved pods
  not yet nominated (they take unallocated GPUs first, or preempt the spot work on them);
* **room**: the spot room on the unallocated and ShadowPod-held GPUs of the schedulable nodes
  (:attr:`~spotgpu.scheduler.rules.NodeSummary.unallocated_milli`), by node pool;
* a partial snapshot adds what it left out (:class:`~spotgpu.scheduler.model.SpotOutside`), so
  the answer is the full snapshot's;
* the demand of pool ``p`` **fits** when it is at most the room of pool ``p``; the demand of
  gangs without a pool fits when the whole demand is at most the whole room.

When it fits, the unallocated GPUs can serve the queue: spot tasks take them first and lent
owner GPUs only when no unallocated GPU fits (a lent GPU costs an eviction when its owner
returns, an unallocated one none). When it does not, part of the queue waits or goes to lent
GPUs anyway; lent GPUs whose owner's idle forecast covers the task's want then go first, which
keeps unallocated GPUs whole for the gangs and reserved work that need them.
"""

from __future__ import annotations

from spotgpu.scheduler.state import ClusterState

Pools = dict[str | None, int]


def pending(state: ClusterState) -> Pools:
    """The pending pods' requests in milli, by PodGroup pool (with the snapshot's outside part):
    every pending spot pod, and every pending reserved pod without a nomination."""
    out: Pools = {}
    outside = state.spot_outside
    if outside is not None:
        out.update(outside.pending)
    for task in state.tasks.values():
        if task.node is None and (task.job.spot or task.nomination is None):
            pool = task.job.group.pool
            out[pool] = out.get(pool, 0) + task.request_milli
    return out


def room(state: ClusterState) -> Pools:
    """The spot room on unallocated GPUs in milli, by node pool (with the snapshot's outside part)."""
    out: Pools = {}
    outside = state.spot_outside
    if outside is not None:
        out.update(outside.room)
    for ns in state.nodes.values():
        if ns.room:
            pool = ns.node.pool
            out[pool] = out.get(pool, 0) + ns.room
    return out


def fits(demand: Pools, space: Pools, pool: str | None) -> bool:
    """Whether the demand of gangs of ``pool`` fits the room they may use (see the module docstring)."""
    if pool is None:
        return sum(demand.values()) <= sum(space.values())
    return demand.get(pool, 0) <= space.get(pool, 0)


class Pressure:
    """The rule's answers for one cycle, judged on the state as the cycle opens (see the module
    docstring). Judged only when some ``auto`` node has lent capacity then: lent capacity never
    grows within a cycle, so otherwise no spot task ever asks."""

    __slots__ = ("_answers", "_demand", "_room")

    def __init__(self, state: ClusterState) -> None:
        judged = bool(state.auto_lent_nodes)
        self._demand: Pools = pending(state) if judged else {}
        self._room: Pools = room(state) if judged else {}
        self._answers: dict[str | None, bool] = {}

    def fits(self, pool: str | None) -> bool:
        """Whether this cycle's pending demand of ``pool`` fits the unallocated room."""
        answer = self._answers.get(pool)
        if answer is None:
            answer = self._answers[pool] = fits(self._demand, self._room, pool)
        return answer


__all__ = ["Pools", "Pressure", "fits", "pending", "room"]
