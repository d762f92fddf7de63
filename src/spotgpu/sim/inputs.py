"""What a scenario feeds the simulation, as the summary and the report describe it.

Pure: no I/O. :class:`StreamUse` records how a job stream used its trace (whether ``load`` had
to replay the same trace jobs, and how often); :func:`scenario_summary` is the summary's
``scenario`` section (sizes, offered loads, the latency tables, warnings).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from spotgpu.sim.scenario import JobSpec, Scenario, Workload


@dataclasses.dataclass(frozen=True, slots=True)
class StreamUse:
    """How a job stream used its trace: ``jobs`` submitted from ``distinct`` trace jobs, a trace
    job at most ``max_uses`` times (more than once: ``load`` needed more windows than the trace
    has, so the same trace jobs are replayed)."""

    key: str
    """``spotJobs[0]``, ``reservedJobs[1]``, ..."""
    name: str
    load: float | None
    jobs: int
    distinct: int
    max_uses: int

    def warning(self) -> str | None:
        if self.max_uses <= 1:
            return None
        asked = f"load {self.load:g}" if self.load is not None else "its scale"
        return (
            f"{self.key} ({self.name}): {asked} replays the same trace jobs up to {self.max_uses} times "
            f"({self.jobs} jobs from {self.distinct} distinct trace jobs); the trace is shorter than the load needs"
        )


LATENCY_MODEL: Final = (
    "sampled: each occurrence of a measured latency is drawn with the run's seeded generator from its table of "
    "benchmark quantiles (linear between them, clamped outside); owner holds and start-up delays are model output"
)


def scenario_summary(s: Scenario, w: Workload) -> dict[str, object]:
    """What the report says about the input (sizes, offered load)."""
    gpus = s.cluster.nodes * s.cluster.gpus_per_node
    owner_gpus = sum(o.trace.gpus for o in w.owners)
    active = sum(o.trace.gpus * o.trace.active_seconds(s.duration) for o in w.owners)
    spot = [j for j in w.jobs if j.spot]
    reserved = [j for j in w.jobs if not j.spot]

    def offered(jobs: list[JobSpec]) -> float:
        return sum(j.gpus * max(0.0, min(j.duration, s.duration - j.arrival)) for j in jobs) / (gpus * s.duration)

    return {
        "name": s.name,
        "description": s.description,
        "seed": s.seed,
        "simulated_hours": s.duration / 3600,
        "nodes": s.cluster.nodes,
        "gpus": gpus,
        "owners": len(w.owners),
        "owner_gpus": owner_gpus,
        "unallocated_gpus": gpus - owner_gpus,
        "owner_active_fraction": active / (owner_gpus * s.duration) if owner_gpus else 0.0,
        "spot_jobs": len(spot),
        "reserved_jobs": len(reserved),
        "spot_offered_load": offered(spot),
        "reserved_offered_load": offered(reserved),
        "checkpoint_interval_s": s.checkpoint_interval,
        "schedule_period_s": s.latencies.period(s.cluster.nodes),
        "latency_model": LATENCY_MODEL,
        "latencies": s.latencies.describe(),
        "job_streams": [
            {
                "stream": u.key,
                "name": u.name,
                "jobs": u.jobs,
                "distinct_trace_jobs": u.distinct,
                "max_uses_of_a_trace_job": u.max_uses,
            }
            for u in w.streams
        ],
        "warnings": [text for u in w.streams if (text := u.warning()) is not None],
        "owner_groups": [
            {"name": g.name, "source": g.source, "nodes": n, "gpus_per_owner": g.gpus_per_owner}
            for g, n in zip(s.owners, s.group_nodes(), strict=True)
        ],
    }


__all__ = ["LATENCY_MODEL", "StreamUse", "scenario_summary"]
