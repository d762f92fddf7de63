"""Latencies as seeded distributions over the benchmarks' quantiles (spotgpu.sim.latency)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core.configfile import ConfigError
from spotgpu.sim import defaults
from spotgpu.sim.latency import Latencies, Latency, quantiles_from_result
from spotgpu.sim.metrics import percentile
from spotgpu.sim.scenario import build_workload, parse_scenario
from spotgpu.sim.simulation import Simulation

TABLE = Latency(((0.5, 10.0), (0.9, 20.0), (0.99, 50.0)), "test")


def test_inverse_cdf_is_linear_between_rows_and_clamped_outside() -> None:
    assert TABLE.at(0.0) == TABLE.at(0.5) == pytest.approx(0.010)
    assert TABLE.at(0.7) == pytest.approx(0.015)
    assert TABLE.at(0.945) == pytest.approx(0.035)
    assert TABLE.at(0.999) == TABLE.at(1.0) == TABLE.upper == pytest.approx(0.050)
    assert TABLE.median == pytest.approx(0.010)


def test_draws_reproduce_the_table_and_repeat_per_seed() -> None:
    rng = random.Random("7:latencies")
    draws = [TABLE.sample(rng) * 1000 for _ in range(20000)]
    assert percentile(draws, 50) == pytest.approx(10.0, rel=0.02)
    assert 0.48 < sum(1 for d in draws if d == pytest.approx(10.0)) / len(draws) < 0.52  # the median's atom
    assert percentile(draws, 90) == pytest.approx(20.0, rel=0.03)
    assert percentile(draws, 99) == pytest.approx(50.0, rel=0.05)
    assert max(draws) <= 50.0
    again = random.Random("7:latencies")
    assert [TABLE.sample(again) * 1000 for _ in range(20000)] == draws


def test_a_constant_draws_nothing() -> None:
    rng = random.Random(1)
    state = rng.getstate()
    assert Latency.constant(0.008).sample(rng) == pytest.approx(0.008)
    lat = Latencies(kill_first_task=Latency.constant(0.008), kill_extra_task=Latency.constant(0.001))
    assert lat.kill(3, rng) == pytest.approx(0.010)
    assert rng.getstate() == state


def test_kill_reads_both_terms_at_one_quantile() -> None:
    """The fit: killFirstTask + 7 x killExtraTask reproduces node-e2e's 8-container eviction p50 and p99."""
    lat = Latencies()
    assert lat.kill_first_task.at(0.5) + 7 * lat.kill_extra_task.at(0.5) == pytest.approx(5.24e-3, abs=1e-5)
    assert lat.kill_first_task.at(0.99) + 7 * lat.kill_extra_task.at(0.99) == pytest.approx(11.97e-3, abs=2e-5)
    rng = random.Random(3)
    u = random.Random(3).random()
    assert lat.kill(8, rng) == pytest.approx(lat.kill_first_task.at(u) + 7 * lat.kill_extra_task.at(u))
    draws = [lat.kill(8, rng) for _ in range(2000)]
    assert min(draws) >= 5.24e-3 - 1e-5 and max(draws) <= lat.kill_upper(8) + 1e-12
    assert lat.kill(0, rng) == 0.0


def test_defaults_name_their_source() -> None:
    for name in ("GUARD_SIGNAL", "KILL_FIRST_TASK", "KILL_EXTRA_TASK", "GUARD_RELEASE", "SPOT_START", "RESERVED_START"):
        measured: defaults.Measured = getattr(defaults, name)
        assert measured.source and Latency.of(measured).quantiles_ms == measured.quantiles_ms
    described = Latencies().describe()
    assert set(described) == {
        "guardSignal",
        "killFirstTask",
        "killExtraTask",
        "guardRelease",
        "spotStart",
        "reservedStart",
    }
    signal = {
        "quantiles_ms": [list(row) for row in defaults.GUARD_SIGNAL.quantiles_ms],
        "source": defaults.GUARD_SIGNAL.source,
    }
    assert described["guardSignal"] == signal


def _with_latencies(latencies: dict[str, Any]) -> Any:
    return parse_scenario({"name": "t", "latencies": latencies}).latencies


def test_scenario_spells_a_latency_as_a_duration_or_a_table() -> None:
    lat = _with_latencies(
        {"killFirstTask": "8ms", "spotStart": {"quantilesMs": [[0.5, 100], [0.99, 200]], "source": "my run"}}
    )
    assert lat.kill_first_task.fixed and lat.kill_first_task.upper == pytest.approx(0.008)
    assert lat.spot_start == Latency(((0.5, 100.0), (0.99, 200.0)), "my run")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("fast", r"^latencies.killFirstTask: 'fast' is not a duration"),
        ({"quantilesMs": []}, r"^latencies.killFirstTask: quantilesMs: give at least one"),
        ({"quantilesMs": [[0.5]]}, r"^latencies.killFirstTask: quantilesMs\[0\]: expected \[quantile, ms\]"),
        ({"quantilesMs": [[1.5, 3]]}, r"quantilesMs\[0\]: quantile within 0..1"),
        ({"quantilesMs": [[0.5, 3], [0.9, 2]]}, r"quantilesMs\[1\]: quantiles must rise and values must not fall"),
        ({"quantilesMs": [[0.5, 3], [0.5, 4]]}, r"quantilesMs\[1\]: quantiles must rise"),
        ({"quantiles": [[0.5, 3]]}, r"quantiles: unknown key; did you mean 'quantilesMs'"),
    ],
)
def test_bad_latency_tables_name_the_key(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _with_latencies({"killFirstTask": value})


def test_quantiles_from_a_benchmark_result_in_either_spelling() -> None:
    assert quantiles_from_result({"eviction_ms_p50": 23.4, "eviction_ms_p99": 40.3, "x": 1}, "eviction_ms") == (
        (0.5, 23.4),
        (0.99, 40.3),
    )
    guard = {"details": {"owner_back_ms": {"p50": 0.16, "p99": 1.94, "n": 200}}}
    assert quantiles_from_result(guard, "owner_back_ms") == ((0.5, 0.16), (0.99, 1.94))
    with pytest.raises(ConfigError, match="no spot_start_ms_pNN"):
        quantiles_from_result({"eviction_ms_p50": 1.0}, "spot_start_ms")


@given(
    st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1e4)), min_size=1, max_size=6),
    st.floats(0, 1),
    st.floats(0, 1),
)
def test_any_table_draws_within_its_range_and_monotone(rows: list[tuple[float, float]], u: float, v: float) -> None:
    qs = sorted({q for q, _ in rows})
    values = sorted(ms for _, ms in rows)[: len(qs)]
    table = Latency(tuple(zip(qs, values, strict=True)))
    lo, hi = sorted((u, v))
    assert values[0] / 1000 - 1e-12 <= table.at(lo) <= table.at(hi) + 1e-12
    assert table.at(hi) <= table.upper + 1e-12


def test_owner_holds_spread_from_the_draws() -> None:
    """Twenty returns that each kill one spot task: with the benchmark tables the holds differ
    (the spread is model output); with constants they are all the same."""
    active = [{"start": f"{h * 2 + 1}h", "end": f"{h * 2 + 1}h30m"} for h in range(20)]
    data: dict[str, Any] = {
        "name": "t",
        "seed": 3,
        "duration": "41h",
        "cluster": {"nodes": 1, "gpusPerNode": 8},
        "owners": [
            {
                "name": "dev",
                "source": "inline",
                "nodes": 1,
                "gpusPerOwner": 8,
                "inline": {"owners": [{"active": active}]},
            }
        ],
        "spotJobs": [
            {
                "name": "long",
                "source": "inline",
                "inline": {"jobs": [{"arrival": "0s", "duration": "100h", "gpus": 8, "priority": "spotlow"}]},
            }
        ],
        "policies": [{"name": "lend", "maxInactiveTime": "2m"}],
    }

    def holds(scenario_data: dict[str, Any]) -> list[float]:
        s = parse_scenario(scenario_data)
        sim = Simulation(s, build_workload(s), s.policies[0])
        sim.run()
        return sim.metrics.returns.holds_ms

    sampled = holds(data)
    assert len(sampled) == 20 and len(set(sampled)) > 5
    fixed = holds({**data, "latencies": dict.fromkeys(("guardSignal", "killFirstTask", "guardRelease"), "1ms")})
    assert fixed == [pytest.approx(3.0, abs=1e-6)] * 20
    assert holds(data) == sampled
