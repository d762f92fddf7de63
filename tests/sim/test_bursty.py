"""The ``bursty`` owner source (inference pods and developers that come and go every few minutes)
and the embedded bursty scenario."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotgpu.core.configfile import ConfigError, from_mapping
from spotgpu.sim.inputs import scenario_summary
from spotgpu.sim.runner import simulate
from spotgpu.sim.scenario import build_workload, scenario_argument
from spotgpu.sim.workloads import OWNER_SOURCES, OwnerRequest, OwnerTrace
from spotgpu.sim.workloads.bursty import BurstyConfig

DAY = 86400.0
HOUR = 3600.0


def owners(config: BurstyConfig, count: int = 4, horizon: float = 2 * DAY, seed: str = "1") -> list[OwnerTrace]:
    return OWNER_SOURCES.get("bursty").build(config, OwnerRequest("grp", count, 2, horizon, seed, Path(".")))


def _gaps(trace: OwnerTrace) -> list[float]:
    return [b[0] - a[1] for a, b in zip(trace.active, trace.active[1:], strict=False)]


def test_inference_pods_flap_all_day_within_the_configured_phases() -> None:
    traces = owners(BurstyConfig(kind="inference"))
    for trace in traces:
        spans = trace.active
        assert len(spans) > 2 * 24 * 60 / 10 * 0.8  # about one busy phase every 6 minutes, day and night
        inner = spans[1:-1]  # the first and last are cut by the run's start and end
        assert all(60 - 1 <= e - s <= 300 + 1 for s, e in inner)
        assert all(60 - 1 <= g <= 300 + 1 for g in _gaps(trace))
        busy = trace.active_seconds(2 * DAY) / (2 * DAY)
        assert 0.35 < busy < 0.65
    assert len({t.active for t in traces}) == len(traces)  # each pod its own cycle


def test_developers_work_in_short_sessions_by_day_and_go_home() -> None:
    config = BurstyConfig(kind="developer", long_break_probability=0.2)
    traces = owners(config, count=8, horizon=8 * DAY)  # Monday to the next Monday
    for trace in traces:
        gaps = _gaps(trace)
        sessions = [e - s for s, e in trace.active]
        assert all(d <= 300 + 1 for d in sessions)
        assert sum(1 for d in sessions if d >= 60 - 1) >= 0.95 * len(sessions)  # shorter: cut by lunch or leaving
        assert any(g >= 15 * 60 - 1 for g in gaps if g < 6 * HOUR)  # longer breaks within a day
        assert any(g >= 12 * HOUR for g in gaps)  # nights
        assert max(gaps) >= 2 * DAY  # the weekend (day 0 is a Monday)
        for s, _ in trace.active:
            assert (s // DAY) % 7 < 5  # workdays only
            assert 5 * HOUR < s % DAY < 22 * HOUR  # arrive 9:00 and leave 18:00, jitter 30 min
        lunch_start, lunch_end = config.lunch, config.lunch + config.lunch_length
        for s, e in trace.active:
            assert not (s % DAY < lunch_end and e % DAY > lunch_start and s % DAY >= lunch_start)


def test_same_seed_same_owners_other_seed_other_owners() -> None:
    config = BurstyConfig(kind="developer")
    assert owners(config) == owners(config)
    assert owners(config) != owners(config, seed="2")


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["inference", "developer"]),
    st.integers(30, 600),
    st.integers(0, 600),
    st.integers(30, 600),
    st.integers(0, 600),
    st.integers(0, 10**6).map(str),
)
def test_any_parameters_give_valid_owners(
    kind: str, busy_min: int, busy_extra: int, idle_min: int, idle_extra: int, seed: str
) -> None:
    config = from_mapping(
        BurstyConfig,
        {
            "kind": kind,
            "busyMin": busy_min,
            "busyMax": busy_min + busy_extra,
            "idleMin": idle_min,
            "idleMax": idle_min + idle_extra,
        },
    )
    for trace in owners(config, count=2, horizon=DAY, seed=seed):  # OwnerTrace checks sorted, disjoint, in range
        assert all(0 <= s < e <= DAY for s, e in trace.active)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"kind": "batch"}, r"^bursty.kind: 'batch' is not one of 'inference', 'developer'"),
        ({"busyMin": "6m"}, r"^bursty: busyMin: must be greater than zero and at most busyMax"),
        ({"idleMin": 0}, r"^bursty: idleMin: must be greater than zero"),
        ({"longBreakProbability": 2}, r"^bursty: longBreakProbability: a probability must be within 0..1"),
        ({"leave": "8h"}, r"^bursty: leave: must be after arrive"),
        ({"workdays": [7]}, r"^bursty: workdays: days are 0"),
    ],
)
def test_bad_settings_name_the_key(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_mapping(BurstyConfig, section, "bursty")


def test_embedded_bursty_scenario_runs_small() -> None:
    """The embedded scenario, shrunk: flappy owners are lent and come back within minutes, so the
    2-minute policy evicts far more often than the 30-minute one, and the recommended policy less
    than the 2-minute one."""
    s = scenario_argument("bursty").resized(nodes=6, duration=12 * HOUR)
    w = build_workload(s)
    sources = {g["name"]: g["source"] for g in scenario_summary(s, w)["owner_groups"]}  # type: ignore[attr-defined]
    assert sources == {"serving": "bursty", "devs": "bursty"}
    chosen = [p for p in s.policies if p.name in {"lowpower-2m", "lowpower-30m", "auto-predictive"}]
    summary = simulate(s, chosen, workers=1).summary()
    fast, slow, recommended = summary["policies"]  # type: ignore[misc]
    assert fast["owner_returns_while_lent"] > 5 * max(1, slow["owner_returns_while_lent"])
    assert recommended["recommended"] and recommended["evictions_total"] < fast["evictions_total"]
