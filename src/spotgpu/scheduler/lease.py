"""Minimum leases and idle forecasts: which lent GPUs a spot task may use, and which fit it best.

Pure functions; no side effects. A spot gang may declare ``min_lease`` (it should only run on
GPUs expected to stay available at least that long) and ``checkpoint_interval``. The node agent
forecasts, per lent twin, how long its owner stays idle (:class:`~spotgpu.scheduler.model.IdleForecast`:
``expected`` and the conservative ``p20``, exceeded with 80% probability).

* **Coverage** (hard): a task with ``min_lease > 0`` uses a lent GPU only if its ``p20`` covers
  the lease. Unallocated and ShadowPod-held GPUs have no owner to return: their remainder is
  infinite, they always cover. A lent GPU without a (valid) forecast does not cover: unknown is
  never better than a known remainder.
* **Fit** (preference): the task's *want* is ``max(min_lease, checkpoint_interval)`` (a lease
  shorter than the checkpoint interval loses all work since the last checkpoint). Among lent GPUs
  the one whose ``p20`` covers the want most tightly goes first (best fit): long jobs go to
  long-idle owners, short ones to flappy owners, and the long idle periods stay for the jobs that
  need them. A task that wants nothing (both 0) ignores forecasts: placement is as without them.

Node classes carry forecasts quantised into the log-scale buckets :data:`BOUNDS` (a class per
exact remainder would make every lending node its own class). Class filters are optimistic (a
bucket *may* cover when its upper bound exceeds the lease), class scores use the buckets, and the
device picker decides on the exact ``p20``, so a task never lands on a GPU that does not cover.
"""

from __future__ import annotations

import bisect
import math
from typing import Final

BOUNDS: Final = (0, 60, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 57600, 86400)
"""Lower bounds (seconds) of the forecast buckets; the last one is open-ended."""

UNKNOWN: Final = -1
"""The bucket of a GPU without a forecast (or whose forecast is not used in this cycle)."""


def bucket(seconds: float) -> int:
    """The bucket of a remainder of ``seconds`` (>= 0)."""
    return bisect.bisect_right(BOUNDS, seconds) - 1


def upper(b: int) -> float:
    """Exclusive upper bound of bucket ``b`` (infinite for the last)."""
    return float(BOUNDS[b + 1]) if b + 1 < len(BOUNDS) else math.inf


def may_cover(b: int, lease: float) -> bool:
    """Whether a GPU in bucket ``b`` might cover ``lease`` (optimistic, for class filters)."""
    return b != UNKNOWN and upper(b) > lease


def covers(p20: int, lease: float) -> bool:
    """The exact rule: a known ``p20`` (>= 0) covers ``lease``; unknown (-1) covers no lease."""
    return p20 >= 0 and p20 >= lease


def coverable(lent_leases: tuple[int, ...], lease: float) -> int:
    """How many of a class's known-forecast lent twins might cover ``lease`` (``lease`` > 0)."""
    return sum(1 for b in lent_leases if may_cover(b, lease))


def fit_score(lent_leases: tuple[int, ...], want: float) -> float:
    """0..100: how tightly the class's best lent twin covers ``want`` (100: same bucket; 0: none known)."""
    if not lent_leases:
        return 0.0
    target = bucket(want)
    i = bisect.bisect_left(lent_leases, target)
    if i == len(lent_leases):
        return 0.0
    return 100.0 * (1 - (lent_leases[i] - target) / len(BOUNDS))


def fit_key(p20: int, want: float) -> tuple[int, float]:
    """Order of lent GPUs for a task wanting ``want`` s: covering ones by surplus, then the rest."""
    if p20 >= 0 and p20 >= want:
        return (0, p20 - want)
    return (1, 0.0)


__all__ = ["BOUNDS", "UNKNOWN", "bucket", "coverable", "covers", "fit_key", "fit_score", "may_cover", "upper"]
