"""The owner-return model: the forecast is never negative, moves with the evidence, stays
bounded whatever an owner does, and survives the lending record; the backoff and the
predictive verdict."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from spotgpu.core.config import PredictiveConfig
from spotgpu.core.idle_forecast import (
    BINS,
    EDGES,
    EMPTY_HISTORY,
    NO_BACKOFF,
    Backoff,
    IdleHistory,
    Refusal,
    after_loan,
    bin_of,
    decode_history,
    encode_history,
    judge,
    observe,
    remainder,
)

CONFIG = PredictiveConfig()
durations = st.floats(min_value=0, max_value=4e6, allow_nan=False)
histories = st.lists(durations, max_size=60).map(
    lambda ds: _history(ds, CONFIG.memory),
)


def _history(ds: list[float], memory: float) -> IdleHistory:
    h = EMPTY_HISTORY
    for d in ds:
        h = observe(h, d, memory)
    return h


def test_bins_cover_every_duration() -> None:
    assert EDGES[0] == 0 and len(EDGES) == BINS + 1
    for d in (0.0, 59.99, 60.0, 84.9, 85.0, 3600.0, EDGES[-1], 1e12):
        b = bin_of(d)
        assert 0 <= b < BINS
        assert EDGES[b] <= d and (d < EDGES[b + 1] or b == BINS - 1)


def test_a_new_owner_gets_about_the_prior_mean() -> None:
    f = remainder(EMPTY_HISTORY, CONFIG, 120)
    assert abs(f.expected - CONFIG.prior_mean) < 0.1 * CONFIG.prior_mean  # exponential: memoryless
    assert 0 < f.p20 < f.expected


def test_short_idle_periods_lower_the_forecast_and_outlasting_them_raises_it() -> None:
    short = _history([300.0] * 10, CONFIG.memory)
    assert remainder(short, CONFIG, 120).expected < remainder(EMPTY_HISTORY, CONFIG, 120).expected / 2
    assert remainder(short, CONFIG, 600).expected > remainder(short, CONFIG, 120).expected


@given(histories, st.floats(min_value=0, max_value=5e6, allow_nan=False))
def test_the_forecast_is_never_negative(history: IdleHistory, elapsed: float) -> None:
    f = remainder(history, CONFIG, elapsed)
    assert f.expected >= 0 and f.p20 >= 0
    assert math.isfinite(f.expected) and math.isfinite(f.p20)


@given(histories, st.floats(min_value=0, max_value=1e6), st.floats(min_value=0, max_value=4e6), st.floats(0, 4e6))
def test_a_longer_observed_idle_period_never_lowers_the_forecast(
    history: IdleHistory, elapsed: float, a: float, b: float
) -> None:
    """Monotone in the evidence: of two observations beyond ``elapsed``'s bin, the longer one
    gives the larger (or equal) forecast, expected and p20 alike."""
    lo, hi = sorted((a, b))
    if bin_of(lo) <= bin_of(elapsed):
        return
    shorter, longer = observe(history, lo, CONFIG.memory), observe(history, hi, CONFIG.memory)
    f_short, f_long = remainder(shorter, CONFIG, elapsed), remainder(longer, CONFIG, elapsed)
    assert f_long.expected >= f_short.expected - 1e-6
    assert f_long.p20 >= f_short.p20 - 1e-6


@given(st.lists(durations, min_size=1, max_size=300), st.floats(min_value=1, max_value=100))
def test_the_state_stays_bounded_whatever_the_owner_does(ds: list[float], memory: float) -> None:
    h = _history(ds, memory)
    assert len(h.counts) == BINS
    assert all(0 <= c <= memory + 1e-9 for c in h.counts)
    assert sum(h.counts) <= memory + 1e-9
    assert len(json.dumps(encode_history(h, NO_BACKOFF))) < 2000


@given(
    histories,
    st.floats(min_value=0, max_value=50, allow_nan=False),
    st.floats(min_value=0, max_value=1e7, allow_nan=False),
    st.floats(min_value=-2e9, max_value=2e9, allow_nan=False),
)
def test_the_learned_state_round_trips_through_the_record(
    history: IdleHistory, strikes: float, at: float, offset: float
) -> None:
    backoff = Backoff(strikes, at) if strikes else NO_BACKOFF
    raw = json.loads(json.dumps(encode_history(history, backoff, time_offset=offset)))
    again, back = decode_history(raw, time_offset=offset)
    assert again == history
    assert back.strikes == backoff.strikes
    assert math.isclose(back.at, backoff.at, abs_tol=1e-6 * max(1.0, abs(offset)))


def test_quick_returns_back_off_and_the_backoff_decays() -> None:
    b = after_loan(NO_BACKOFF, loan=60, now=1000, config=CONFIG)
    b = after_loan(b, loan=60, now=1000, config=CONFIG)
    assert b.strikes == 2
    assert b.extra_wait(1000, CONFIG) == 2 * CONFIG.backoff_step
    assert b.extra_wait(1000 + CONFIG.backoff_half_life, CONFIG) == CONFIG.backoff_step
    long_loan = after_loan(b, loan=CONFIG.quick_return + 1, now=1000, config=CONFIG)
    assert long_loan.strikes == 1  # a loan that lasted halves the strikes
    capped = Backoff(1000.0, 0.0)
    assert capped.extra_wait(0, CONFIG) == CONFIG.backoff_max


def test_verdicts_name_the_reason_and_when_to_ask_again() -> None:
    gate = 120.0
    assert judge(EMPTY_HISTORY, NO_BACKOFF, idle_start=0, now=gate, gate=gate, config=CONFIG).refusal is None
    short = _history([300.0] * 10, CONFIG.memory)
    v = judge(short, NO_BACKOFF, idle_start=0, now=gate, gate=gate, config=CONFIG)
    assert v.refusal is Refusal.FORECAST and gate < v.retry_at < math.inf
    assert judge(short, NO_BACKOFF, idle_start=0, now=v.retry_at, gate=gate, config=CONFIG).refusal is None
    struck = Backoff(2.0, 0.0)
    v = judge(EMPTY_HISTORY, struck, idle_start=0, now=gate, gate=gate, config=CONFIG)
    assert v.refusal is Refusal.BACKOFF and v.retry_at >= gate + struck.extra_wait(v.retry_at, CONFIG)


@settings(max_examples=60)
@given(histories, st.floats(min_value=0, max_value=5), st.floats(min_value=120, max_value=2e5))
def test_a_refusal_always_names_a_later_time(history: IdleHistory, strikes: float, now: float) -> None:
    """Judging again is never due at once (the simulator schedules its next poll then)."""
    backoff = Backoff(strikes, 0.0) if strikes else NO_BACKOFF
    v = judge(history, backoff, idle_start=0, now=now, gate=120, config=CONFIG)
    assert v.refusal is None or v.retry_at > now
