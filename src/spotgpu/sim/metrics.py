"""What one simulated policy measured, and the summary figures derived from it.

Pure accounting; no I/O, no clock. :class:`Metrics` is told about every change by the
simulation (GPU category moves, evictions, holds, job starts and ends) and integrates
GPU-time per :class:`~spotgpu.sim.model.Category` between events. :func:`summarize` turns it
into the per-policy JSON entry (keys documented in docs/simulator.md).

The win of lending is :func:`useful_gain_gpu_hours`: useful spot GPU-hours (spot GPU-hours
minus those lost to evictions) over the baseline's, the same workload without lending. Not
``reclaimed_gpu_hours``: that counts spot work on lent GPUs, wasted work included, and work a
lending policy merely moved off unallocated GPUs.

Percentiles use linear interpolation between closest ranks (numpy's default); an empty sample
gives 0.0.

Waiting times (``spot_wait_s_*``, ``reserved_wait_s_*``) are over every submitted job: a job
not started by the end of the run is *censored* there (its wait counts as end - submit, a
lower bound of its true wait), and ``*_wait_censored`` says how many were. Counting started
jobs only (``*_wait_started_s_*``, also given) would make a policy that starts more of the
queue look worse.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from spotgpu.core.types import EvictionReason
from spotgpu.sim.model import CATEGORY_NAMES, Category

HOUR = 3600.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass(slots=True)
class GpuTime:
    """GPU-time per :class:`~spotgpu.sim.model.Category` (and lent GPU-time), integrated between
    changes, and the time series the allocation plot draws."""

    total_gpus: int
    counts: list[int] = field(default_factory=list)
    gpu_seconds: list[float] = field(default_factory=list)
    lent_gpus: int = 0
    lent_gpu_seconds: float = 0.0
    last_t: float = 0.0
    samples: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.counts = [0] * len(Category)
        self.counts[Category.FREE] = self.total_gpus
        self.gpu_seconds = [0.0] * len(Category)

    def advance(self, now: float) -> None:
        """Integrate the current counts from the last change to ``now``."""
        dt = now - self.last_t
        if dt > 0:
            counts = self.counts
            secs = self.gpu_seconds
            for i in range(len(counts)):
                if counts[i]:
                    secs[i] += counts[i] * dt
            self.lent_gpu_seconds += self.lent_gpus * dt
            self.last_t = now

    def move(self, old: Category, new: Category) -> None:
        self.counts[old] -= 1
        self.counts[new] += 1

    def sample(self, now: float) -> None:
        self.samples.append((now, tuple(self.counts)))


@dataclass(slots=True)
class SpotWork:
    """Spot GPU-seconds not lost (completed, checkpointed before an eviction, running at the end),
    lost to evictions, and the part of the useful ones saved by checkpoints."""

    useful: float = 0.0
    wasted: float = 0.0
    checkpointed: float = 0.0


@dataclass(slots=True)
class JobTimes:
    """Waits (arrival to first start; never started: censored at the end) and completion times."""

    spot_waits: list[float] = field(default_factory=list)
    """Arrival to first start, of started spot jobs."""
    spot_waits_censored: list[float] = field(default_factory=list)
    """Arrival to the end of the run, of spot jobs never started."""
    spot_jcts: list[float] = field(default_factory=list)
    reserved_waits: list[float] = field(default_factory=list)
    reserved_waits_censored: list[float] = field(default_factory=list)
    reserved_jcts: list[float] = field(default_factory=list)

    def censor(self, spot: bool, waited: float) -> None:
        """A job never started: its wait so far, censored at the end of the run."""
        (self.spot_waits_censored if spot else self.reserved_waits_censored).append(waited)


@dataclass(slots=True)
class Returns:
    """Loans, owners' returns (holds, exposures) and evictions by reason."""

    loans: int = 0
    while_lent: int = 0
    """Owners coming back to lent GPUs."""
    with_eviction: int = 0
    """Those with spot work on their GPUs."""
    holds_ms: list[float] = field(default_factory=list)
    exposures_ms: list[float] = field(default_factory=list)
    evictions: Counter[str] = field(default_factory=Counter)
    evicted_pods: Counter[str] = field(default_factory=Counter)

    def eviction(self, reason: EvictionReason, pods: int) -> None:
        self.evictions[reason.value] += 1
        self.evicted_pods[reason.value] += pods


@dataclass(slots=True)
class CycleStats:
    """Scheduling cycles run and skipped, binds, and the snapshots' sizes (nodes, PodGroups)."""

    run: int = 0
    skipped: int = 0
    binds: int = 0
    snapshot_nodes: int = 0
    snapshot_groups: int = 0


@dataclass(slots=True)
class Metrics:
    """Counters and integrals of one policy run, grouped."""

    time: GpuTime
    spot: SpotWork = field(default_factory=SpotWork)
    jobs: JobTimes = field(default_factory=JobTimes)
    returns: Returns = field(default_factory=Returns)
    cycles: CycleStats = field(default_factory=CycleStats)

    @classmethod
    def of(cls, total_gpus: int) -> Metrics:
        return cls(GpuTime(total_gpus))


def useful_gain_gpu_hours(useful_spot_gpu_hours: float, baseline_useful_spot_gpu_hours: float) -> float:
    """What lending wins: the useful spot GPU-hours (``spot - wasted``: completed, checkpointed or
    still running at the end) minus the baseline's, the same workload without lending (0 for the
    baseline itself; negative when a policy serves less useful spot work than not lending)."""
    return round(useful_spot_gpu_hours - baseline_useful_spot_gpu_hours, 6)


MIN_GAIN_GPU_HOURS: Final = 1.0
"""A best gain below one GPU-hour is no gain to compare with: with equal placements, policies
differ by the sampled start latencies alone (fractions of a GPU-second per job)."""


def share_of_best(gain: float, best: float) -> float | None:
    """``gain`` as a fraction of the largest gain of the run; None when no policy gains at least
    :data:`MIN_GAIN_GPU_HOURS`."""
    return round(gain / best, 4) if best >= MIN_GAIN_GPU_HOURS else None


def _h(seconds: float) -> float:
    return round(seconds / HOUR, 6)


def _waits(kind: str, started: list[float], censored: list[float]) -> dict[str, object]:
    every = started + censored
    return {
        f"{kind}_wait_s_p50": round(percentile(every, 50), 3),
        f"{kind}_wait_s_p99": round(percentile(every, 99), 3),
        f"{kind}_wait_censored": len(censored),
        f"{kind}_wait_started_s_p50": round(percentile(started, 50), 3),
        f"{kind}_wait_started_s_p99": round(percentile(started, 99), 3),
    }


def summarize(metrics: Metrics, horizon: float) -> dict[str, object]:
    """The per-policy figures (everything except the policy's own settings)."""
    t, w, j, m = metrics.time, metrics.spot, metrics.jobs, metrics.returns
    secs = t.gpu_seconds
    total = t.total_gpus * horizon
    spot_s = secs[Category.SPOT_UNALLOCATED] + secs[Category.SPOT_LENT] + secs[Category.SPOT_EXPOSED]
    busy = spot_s + secs[Category.RESERVED] + secs[Category.OWNER_ACTIVE]
    allocated = total - secs[Category.FREE]
    return {
        "reclaimed_gpu_hours": _h(secs[Category.SPOT_LENT]),
        "spot_gpu_hours": _h(spot_s),
        "spot_unallocated_gpu_hours": _h(secs[Category.SPOT_UNALLOCATED]),
        "useful_spot_gpu_hours": _h(w.useful),
        "wasted_spot_gpu_hours": _h(w.wasted),
        "checkpointed_spot_gpu_hours": _h(w.checkpointed),
        "lent_gpu_hours": _h(t.lent_gpu_seconds),
        "loans": m.loans,
        "evictions": {r.value: m.evictions.get(r.value, 0) for r in EvictionReason if m.evictions.get(r.value)},
        "evictions_total": sum(m.evictions.values()),
        "evicted_pods": sum(m.evicted_pods.values()),
        "owner_returns_while_lent": m.while_lent,
        "owner_returns_with_eviction": m.with_eviction,
        "owner_hold_ms_p50": round(percentile(m.holds_ms, 50), 4),
        "owner_hold_ms_p99": round(percentile(m.holds_ms, 99), 4),
        "owner_hold_ms_max": round(max(m.holds_ms, default=0.0), 4),
        "owner_exposed_ms_max": round(max(m.exposures_ms, default=0.0), 4),
        "owner_exposures": len(m.exposures_ms),
        **_waits("spot", j.spot_waits, j.spot_waits_censored),
        "spot_jct_s_p50": round(percentile(j.spot_jcts, 50), 3),
        "spot_jct_s_p99": round(percentile(j.spot_jcts, 99), 3),
        **_waits("reserved", j.reserved_waits, j.reserved_waits_censored),
        "gpu_allocation_rate": round(allocated / total, 6) if total else 0.0,
        "gpu_busy_rate": round(busy / total, 6) if total else 0.0,
        "gpu_hours_by_category": {name: _h(secs[i]) for i, name in enumerate(CATEGORY_NAMES)},
    }


__all__ = [
    "CycleStats",
    "GpuTime",
    "JobTimes",
    "MIN_GAIN_GPU_HOURS",
    "Metrics",
    "Returns",
    "SpotWork",
    "percentile",
    "share_of_best",
    "summarize",
    "useful_gain_gpu_hours",
]
