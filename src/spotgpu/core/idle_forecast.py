"""How long an owner's idle periods last: a bounded, learned survival model, and the backoff.

Pure; no I/O, no clock reads (every function takes ``now`` or a duration). Used by the lending
state machine (:mod:`spotgpu.core.lending`) in the agent and in the simulator alike.

**The model** (:class:`IdleHistory`) is an empirical distribution of idle durations on a fixed
histogram: :data:`EDGES` splits 0 s .. about 32 days into :data:`BINS` bins (one below a minute,
then widths growing by a factor of sqrt(2)); durations beyond the last edge count in the last
bin. Each observed idle period (from the owner's last activity to its return) scales the older
counts by ``1 - 1/memory`` and adds one to its bin, so the state is :data:`BINS` numbers, each at
most ``memory``, whatever the owner's history: bounded in size and in value, and recent
behaviour weighs most. A new owner starts from a prior: an exponential distribution of mean
``priorMean`` worth ``priorWeight`` observations, added (never decayed) to the counts. Within a
bin the durations are taken as uniform.

**The forecast** for an owner idle for ``elapsed`` seconds (:func:`remainder`) is the rest of
its idle period given that it outlasted ``elapsed``: ``expected = E[D - elapsed | D > elapsed]``
and ``p20``, the 20th percentile of ``D - elapsed`` given ``D > elapsed`` (80% of such periods last
at least that much longer); both are at least 0. Evidence acts monotonically: for observed
durations ``d <= d'`` in bins above ``elapsed``'s, observing ``d'`` never gives a smaller
forecast than observing ``d`` (the same mass moves further out), which the property tests check.
(No such rule can hold for every ``d``: a period that ended just after ``elapsed`` rightly
lowers the forecast more than one that ended before ``elapsed``, which says nothing about it.)

**The backoff** (:class:`Backoff`): a loan that ended sooner than ``quickReturn`` adds a strike;
strikes halve every ``backoffHalfLife`` and at each loan that lasted longer. Under the
predictive policy an owner must have been idle ``maxInactiveTime + min(backoffMax,
strikes * backoffStep)`` before it is lent again.

:func:`judge` combines them into the predictive policy's verdict, with the earliest time it can
change without new evidence (so a caller need not ask again before then: the simulator skips the
polls in between, the agent's polls in between are no-ops).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from spotgpu.core.config import PredictiveConfig
from spotgpu.core.errors import ValidationError

EDGES: Final[tuple[float, ...]] = (0.0, *(60.0 * 2 ** (k / 2) for k in range(32)))
"""Bin edges in seconds: 0, 60, 85, 120, ... 2.78e6 (32 days)."""
BINS: Final = len(EDGES) - 1
_MIDS: Final = tuple((EDGES[i] + EDGES[i + 1]) / 2 for i in range(BINS))
_WIDTHS: Final = tuple(EDGES[i + 1] - EDGES[i] for i in range(BINS))
P20: Final = 0.2
_BISECT_STEPS: Final = 40
_STEPS: Final = 8
"""Candidate idle times per bin when :func:`judge` looks for the next time to judge."""


def bin_of(duration: float) -> int:
    """The bin ``duration`` falls in (the last one for anything beyond the last edge)."""
    if duration < EDGES[1]:
        return 0
    k = math.floor(2 * math.log2(duration / 60.0)) + 1
    k = min(max(k, 1), BINS - 1)
    # floating-point guard: the bin is [EDGES[k], EDGES[k + 1])
    while k > 1 and duration < EDGES[k]:
        k -= 1
    while k < BINS - 1 and duration >= EDGES[k + 1]:
        k += 1
    return k


@dataclass(frozen=True, slots=True)
class IdleHistory:
    """Decayed counts of observed idle durations per bin (see module docstring)."""

    counts: tuple[float, ...] = (0.0,) * BINS
    observed: int = 0
    """Idle periods observed in all (for diagnostics; the counts carry the weight)."""

    def __post_init__(self) -> None:
        if len(self.counts) != BINS:
            raise ValidationError(f"an idle history has {BINS} bins, got {len(self.counts)}")
        if any(not (math.isfinite(c) and c >= 0) for c in self.counts):
            raise ValidationError("idle history counts must be finite and not negative")

    @property
    def empty(self) -> bool:
        return self.observed == 0


EMPTY_HISTORY: Final = IdleHistory()


def observe(history: IdleHistory, duration: float, memory: float) -> IdleHistory:
    """``history`` after one more idle period of ``duration`` seconds."""
    keep = 1.0 - 1.0 / memory
    counts = [c * keep for c in history.counts]
    counts[bin_of(max(0.0, duration))] += 1.0
    return IdleHistory(tuple(counts), history.observed + 1)


@functools.lru_cache(maxsize=64)
def prior_masses(mean: float, weight: float) -> tuple[float, ...]:
    """An exponential of ``mean`` seconds worth ``weight`` observations, per bin (the tail
    beyond the last edge in the last bin)."""
    survival = [math.exp(-e / mean) for e in EDGES]
    masses = [weight * (survival[i] - survival[i + 1]) for i in range(BINS)]
    masses[-1] += weight * survival[-1]
    return tuple(masses)


@dataclass(frozen=True, slots=True)
class Forecast:
    """The predicted rest of an idle period, in seconds."""

    expected: float
    p20: float
    """80% of such idle periods last at least this much longer."""


class _Curve:
    """Survival ``S(x)`` (mass of durations above ``x``) and ``T(x) = E[(D - x)+]`` (times the
    mass) of prior + history, durations uniform within each bin; suffix sums make each O(1)."""

    __slots__ = ("masses", "sums", "totals")

    def __init__(self, history: IdleHistory, config: PredictiveConfig) -> None:
        prior = prior_masses(float(config.prior_mean), float(config.prior_weight))
        self.masses = [c + p for c, p in zip(history.counts, prior, strict=True)]
        self.totals = [0.0] * (BINS + 1)
        self.sums = [0.0] * (BINS + 1)
        for j in range(BINS - 1, -1, -1):
            self.totals[j] = self.totals[j + 1] + self.masses[j]
            self.sums[j] = self.sums[j + 1] + self.masses[j] * _MIDS[j]

    def survival(self, x: float, i: int) -> float:
        return self.totals[i + 1] + self.masses[i] * (EDGES[i + 1] - x) / _WIDTHS[i]

    def expected(self, x: float) -> float:
        """``E[D - x | D > x]`` (0 when no duration exceeds ``x``)."""
        if x >= EDGES[-1]:
            return 0.0
        i = bin_of(x)
        part = (EDGES[i + 1] - x) / _WIDTHS[i]
        mass = self.totals[i + 1] + self.masses[i] * part
        if mass <= 0:
            return 0.0
        tail = self.sums[i + 1] - x * self.totals[i + 1] + self.masses[i] * part * (EDGES[i + 1] - x) / 2
        return max(0.0, tail / mass)

    def quantile(self, x: float, q: float) -> float:
        """The least ``r >= 0`` with ``P(D - x <= r | D > x) >= q`` (0 when no duration exceeds ``x``)."""
        if x >= EDGES[-1]:
            return 0.0
        i = bin_of(x)
        target = (1.0 - q) * self.survival(x, i)
        if target <= 0:
            return 0.0
        for j in range(i, BINS):
            if self.totals[j + 1] <= target:
                m = self.masses[j]
                at = EDGES[j + 1] - (target - self.totals[j + 1]) * _WIDTHS[j] / m if m > 0 else EDGES[j + 1]
                return max(0.0, at - x)
        return 0.0


@functools.lru_cache(maxsize=256)
def _curve(history: IdleHistory, config: PredictiveConfig) -> _Curve:
    """The (immutable) curve of one history: a lent owner's forecast is asked for every cycle."""
    return _Curve(history, config)


def remainder(history: IdleHistory, config: PredictiveConfig, elapsed: float) -> Forecast:
    """The forecast for an owner idle for ``elapsed`` seconds (see module docstring)."""
    curve = _curve(history, config)
    elapsed = max(0.0, elapsed)
    return Forecast(curve.expected(elapsed), curve.quantile(elapsed, P20))


@dataclass(frozen=True, slots=True)
class Backoff:
    """Strikes against an owner (loans that ended quickly), as of ``at`` (the caller's time base)."""

    strikes: float = 0.0
    at: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.strikes) and self.strikes >= 0) or not math.isfinite(self.at):
            raise ValidationError("backoff strikes must be finite and not negative")

    def strikes_at(self, now: float, half_life: float) -> float:
        return self.strikes * math.pow(2.0, -max(0.0, now - self.at) / half_life)

    def extra_wait(self, now: float, config: PredictiveConfig) -> float:
        """Seconds of idle time the strikes add to ``maxInactiveTime`` at ``now``."""
        if self.strikes <= 0:
            return 0.0
        return min(
            float(config.backoff_max), float(config.backoff_step) * self.strikes_at(now, config.backoff_half_life)
        )


NO_BACKOFF: Final = Backoff()


def after_loan(backoff: Backoff, loan: float, now: float, config: PredictiveConfig) -> Backoff:
    """The backoff after a loan of ``loan`` seconds that ended at ``now`` with the owner's return."""
    strikes = backoff.strikes_at(now, config.backoff_half_life)
    strikes = strikes + 1.0 if loan < config.quick_return else strikes / 2.0
    return Backoff(0.0 if strikes < 1e-3 else strikes, now)


class Refusal(StrEnum):
    """Why an idle owner is not lent (the ``reason`` of the not-lent metric)."""

    UNGUARDED = "unguarded"
    """The return guard does not cover it (``unguardedPolicy: refuse``)."""
    FORECAST = "forecast"
    """Its expected idle remainder is below ``minExpectedIdle``."""
    BACKOFF = "backoff"
    """Its recent loans ended quickly: it must stay idle longer first."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The predictive policy's answer: lend now (``refusal`` None) or not before ``retry_at``."""

    refusal: Refusal | None
    retry_at: float = 0.0
    """Earliest time the answer can change without new evidence (``inf``: not by waiting)."""


def _backoff_ready(idle_start: float, gate: float, backoff: Backoff, config: PredictiveConfig) -> float:
    """The least idle time ``e >= gate`` with ``e >= gate + extra_wait(idle_start + e)``."""
    lo, hi = gate, gate + float(config.backoff_max)
    if lo >= gate + backoff.extra_wait(idle_start + lo, config):
        return lo
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) / 2
        if mid >= gate + backoff.extra_wait(idle_start + mid, config):
            hi = mid
        else:
            lo = mid
    return hi


def judge(
    history: IdleHistory, backoff: Backoff, *, idle_start: float, now: float, gate: float, config: PredictiveConfig
) -> Verdict:
    """May an owner idle since ``idle_start`` be lent at ``now`` (``now - idle_start >= gate``)?

    Yes when the backoff's wait is over and the forecast's ``expected`` reaches
    ``minExpectedIdle`` (and its ``p20`` reaches ``minLikelyIdle``, when set). Otherwise the
    verdict names the first reason and when to judge again: the first of the candidate idle
    times (each bin's lower edge and :data:`_STEPS` points within it, from ``now`` on, about 5%
    of the idle time apart) at which all hold if no evidence arrives (``inf`` if none does).
    Asking again before then is pointless by definition (the state machine does not); the answer
    may err late by one candidate step, never early."""
    curve = _curve(history, config)
    need, likely = float(config.min_expected_idle), float(config.min_likely_idle)

    def promising(e: float) -> bool:
        return curve.expected(e) >= need and (likely <= 0 or curve.quantile(e, P20) >= likely)

    ready = _backoff_ready(idle_start, gate, backoff, config)
    elapsed = max(0.0, now - idle_start)
    if not promising(elapsed):
        refusal = Refusal.FORECAST
    elif elapsed < ready:
        refusal = Refusal.BACKOFF
    else:
        return Verdict(None)
    for j in range(bin_of(elapsed), BINS):
        for k in range(_STEPS):
            e = EDGES[j] + _WIDTHS[j] * k / _STEPS
            if e > elapsed and e >= ready and promising(e):
                return Verdict(refusal, idle_start + e)
    return Verdict(refusal, math.inf)


# --- persistence (JSON-ready values; the agent's lending record holds them) -----------------------


def encode_history(history: IdleHistory, backoff: Backoff, *, time_offset: float = 0.0) -> dict[str, Any]:
    """``{"idle": [counts], "observed": n, "strikes": s, "struckAt": t}``; ``struckAt`` is
    ``backoff.at + time_offset`` (the agent stores wall-clock seconds)."""
    out: dict[str, Any] = {"idle": list(history.counts), "observed": history.observed}
    if backoff.strikes > 0:
        out["strikes"] = backoff.strikes
        out["struckAt"] = backoff.at + time_offset
    return out


def decode_history(raw: Mapping[str, Any], *, time_offset: float = 0.0) -> tuple[IdleHistory, Backoff]:
    """The inverse of :func:`encode_history`; raises :class:`ValidationError` naming what is wrong."""
    counts, observed = raw.get("idle"), raw.get("observed", 0)
    if not isinstance(counts, list) or len(counts) != BINS:
        raise ValidationError(f"idle must be a list of {BINS} numbers")
    if not all(isinstance(c, int | float) and not isinstance(c, bool) for c in counts):
        raise ValidationError("idle must hold numbers")
    if not isinstance(observed, int) or isinstance(observed, bool) or observed < 0:
        raise ValidationError("observed must be a non-negative integer")
    history = IdleHistory(tuple(float(c) for c in counts), observed)
    strikes, at = raw.get("strikes", 0.0), raw.get("struckAt", 0.0)
    for name, value in (("strikes", strikes), ("struckAt", at)):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValidationError(f"{name} must be a number")
    backoff = Backoff(float(strikes), float(at) - time_offset) if strikes else NO_BACKOFF
    return history, backoff


__all__ = [
    "BINS",
    "EDGES",
    "EMPTY_HISTORY",
    "NO_BACKOFF",
    "Backoff",
    "Forecast",
    "IdleHistory",
    "Refusal",
    "Verdict",
    "after_loan",
    "bin_of",
    "decode_history",
    "encode_history",
    "judge",
    "observe",
    "prior_masses",
    "remainder",
]
