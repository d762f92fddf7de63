"""How long and how much memory a simulation will take, before it starts.

Pure: the figures come from a committed measurement (``docs/results/simulate-5000-nodes.json``
in the source repository: ``spotgpu simulate --nodes 5000 --days 1``, seven policies on two
workers: 641.4 s of policy time over 120,000 node-hours, peak RSS 224 MB; the default scenario's
file, 64 nodes for 72 h, peaks at 59 MB). Run time grows with nodes x hours (cycles and
snapshots), a little faster than linearly on large clusters, and with the scenario's churn
(owners that come and go cost more), so the estimate is a rough lower bound: it is meant to
tell ``--nodes 1000000`` from a coffee break, not to plan a run to the minute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

POLICY_SECONDS_PER_NODE_HOUR: Final = 641.372 / 7 / 120_000
"""One policy's simulation time per node-hour (docs/results/simulate-5000-nodes.json: the
``profile.policies.*.total_s`` sum over seven policies, 5,000 nodes x 24 h)."""

BASE_MB: Final = 59.0
"""A worker's memory before the cluster's size counts (the default scenario's peak RSS)."""

MB_PER_NODE_HOUR: Final = (223.6 - BASE_MB) / (120_000 - 64 * 72)
"""Memory per node-hour of workload (peak RSS 223.6 MB at 5,000 x 24 node-hours against 59.0 MB
at 64 x 72)."""

SLOW_S: Final = 600.0
"""Runs estimated longer than this get a warning before they start."""


@dataclass(frozen=True, slots=True)
class Estimate:
    wall_s: float
    """Wall time: each worker runs its share of the policies one after the other."""
    memory_mb: float
    """All workers together (each holds its own copy of the cluster's state)."""


def estimate(*, nodes: int, hours: float, policies: int, workers: int) -> Estimate:
    node_hours = nodes * hours
    parallel = max(1, min(workers, policies))
    per_policy = POLICY_SECONDS_PER_NODE_HOUR * node_hours
    return Estimate(
        wall_s=per_policy * math.ceil(policies / parallel),
        memory_mb=(BASE_MB + MB_PER_NODE_HOUR * node_hours) * parallel,
    )


__all__ = ["BASE_MB", "MB_PER_NODE_HOUR", "POLICY_SECONDS_PER_NODE_HOUR", "SLOW_S", "Estimate", "estimate"]
