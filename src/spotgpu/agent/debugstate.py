"""The agent's ``/debug/state`` document and the recent evictions it shows.

Decides nothing and has no side effects: it reads the solver's views (under the solver's own
locks), the guard's and the runtime service's status, and keeps the last
:data:`RECENT_EVICTIONS` evictions in memory. Served by
:meth:`spotgpu.adapters.agent_metrics.AgentMetrics.serve`; times are monotonic seconds.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from typing import Any

from spotgpu.agent.evictor import EvictionOutcome
from spotgpu.agent.solver import Solver
from spotgpu.core.clock import Clock
from spotgpu.core.holders import ReleaseReport
from spotgpu.core.ids import NodeName
from spotgpu.core.refs import ContainerRef
from spotgpu.ports.agent import RuntimeHost
from spotgpu.ports.guard import GuardPort

RECENT_EVICTIONS = 64
"""Evictions kept for ``/debug/state``."""


class EvictionLog:
    """The last :data:`RECENT_EVICTIONS` evictions as JSON data, oldest first; thread-safe."""

    def __init__(self, size: int = RECENT_EVICTIONS) -> None:
        self._entries: deque[dict[str, Any]] = deque(maxlen=size)
        self._lock = threading.Lock()

    def record(self, outcome: EvictionOutcome) -> None:
        plan = outcome.plan
        entry = {
            "owner": plan.owner.format(),
            "reason": plan.reason.value,
            "devices": list(plan.devices),
            "victims": [v.pod.format() for v in plan.victims],
            "containers": list(plan.container_ids),
            "at": plan.at,
            "started_ms": None if outcome.started_at is None else round((outcome.started_at - plan.at) * 1000, 3),
            "tasks_stopped_ms": round(outcome.stop_latency * 1000, 3),
            "released_ms": None if outcome.released_at is None else round((outcome.released_at - plan.at) * 1000, 3),
            "complete_ms": round((outcome.completed_at - plan.at) * 1000, 3),
            "release_check": None if outcome.holders is None else release_check_entry(outcome.holders),
            "failed_tasks": list(outcome.failed_tasks),
            "undeleted_pods": [p.format() for p in outcome.undeleted_pods],
        }
        with self._lock:
            self._entries.append(entry)

    def recent(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._entries)


def release_check_entry(report: ReleaseReport) -> dict[str, Any]:
    """The release check of one eviction as ``/debug/state`` shows it."""
    return {
        "ms": round(report.seconds * 1000, 3),
        "rounds": report.rounds,
        "looked_at": report.looked_at,
        "killed": {v.value: n for v, n in sorted(report.killed.items())},
        "remaining": [h.pid for h in report.remaining],
        "owner_known": report.owner_known,
    }


def guard_state(guard: GuardPort, owners: Iterable[ContainerRef]) -> dict[str, Any]:
    """The guard as the dump shows it: available, attached, and which of ``owners`` it arms and covers."""
    owners = list(owners)
    return {
        "available": guard.available,
        "attached": guard.attached,
        "armed": sorted(o.format() for o in owners if guard.is_armed(o)),
        "covers": sorted(o.format() for o in owners if guard.covers(o)),
    }


def debug_state(
    *,
    node: NodeName,
    recovered: bool,
    solver: Solver,
    guard: GuardPort | None,
    runtime: RuntimeHost | None,
    evictions: EvictionLog,
    clock: Clock,
) -> dict[str, Any]:
    """What the agent believes now, as JSON data: the MappingCache, each owner's lending state,
    each twin's health, the grants, the guard, the runtime service's answers and the recent
    evictions."""
    state = solver.state()
    guard_view = guard_state(guard, state.lend_states) if guard is not None else None
    return {
        "node": node,
        "recovered": recovered,
        "mapping": solver.mapping.snapshot().to_json(),
        "owners": {o.format(): s.value for o, s in sorted(state.lend_states.items())},
        "forecast": {d: {"expected": f.expected, "p20": f.p20} for d, f in sorted(solver.idle_forecasts().items())},
        "twins": {t: h.value for t, h in sorted(solver.twin_health().items())},
        "grants": [
            {"resource": g.resource, "twin": g.twin, "pod": g.pod.format() if g.pod else None} for g in solver.grants()
        ],
        "guard": guard_view,
        "runtime": runtime.status() if runtime is not None else None,
        "evictions": evictions.recent(),
        "monotonic": clock.monotonic(),
    }


__all__ = ["RECENT_EVICTIONS", "EvictionLog", "debug_state", "guard_state", "release_check_entry"]
