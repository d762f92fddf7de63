"""Latencies as seeded distributions over measured quantiles, and the scenario's latency section.

Pure: no I/O; randomness only from the ``random.Random`` a caller passes (the simulation's
seeded generator), so a run stays a function of its scenario and seed.

A :class:`Latency` is a table of ``(quantile, milliseconds)`` rows, the quantiles a benchmark
reports (:data:`spotgpu.sim.defaults.GUARD_SIGNAL` and friends, each naming its source). A draw
takes ``u`` uniform in ``[0, 1)`` and reads the table's inverse CDF at ``u``: linear between
two rows; below the lowest row its value, above the highest row its value (the model invents
no tail the benchmark did not measure: with p50 and p99 rows, half the draws are the median,
1% the p99). A table of one row is a constant and draws nothing. In a scenario a latency is a
duration (``killFirstTask: 8ms``, a constant) or a table::

    latencies:
      killFirstTask: {quantilesMs: [[0.5, 5.5], [0.99, 15.6]], source: "my bench run"}
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Mapping
from typing import Final

from spotgpu.core.configfile import ConfigError, Seconds, camel, parse_duration
from spotgpu.sim import defaults


@dataclasses.dataclass(frozen=True, slots=True)
class Latency:
    """A latency distribution: ``(quantile in 0..1, ms)`` rows, quantiles rising, values not falling."""

    quantiles_ms: tuple[tuple[float, ...], ...]
    source: str = ""

    def __post_init__(self) -> None:
        rows = self.quantiles_ms
        if not rows:
            raise ConfigError("quantilesMs: give at least one [quantile, ms] row")
        for i, row in enumerate(rows):
            if len(row) != 2 or not all(math.isfinite(x) for x in row):
                raise ConfigError(f"quantilesMs[{i}]: expected [quantile, ms], got {list(row)}")
            q, ms = row
            if not 0.0 <= q <= 1.0 or ms < 0:
                raise ConfigError(f"quantilesMs[{i}]: quantile within 0..1 and ms >= 0, got {list(row)}")
            if i and (q <= rows[i - 1][0] or ms < rows[i - 1][1]):
                raise ConfigError(f"quantilesMs[{i}]: quantiles must rise and values must not fall, got {list(row)}")

    @classmethod
    def from_config_scalar(cls, value: object, key: str) -> Latency:
        """A plain duration in a scenario (``8ms``, ``0``): a constant."""
        return cls.constant(parse_duration(value, key), "scenario")

    @classmethod
    def constant(cls, seconds: float, source: str = "") -> Latency:
        return cls(((0.5, seconds * 1000.0),), source)

    @classmethod
    def of(cls, measured: defaults.Measured) -> Latency:
        return cls(measured.quantiles_ms, measured.source)

    @property
    def fixed(self) -> bool:
        return len(self.quantiles_ms) == 1

    def at(self, u: float) -> float:
        """The value (seconds) at quantile ``u``: the inverse CDF, linear between rows, clamped outside."""
        rows = self.quantiles_ms
        if u <= rows[0][0]:
            return rows[0][1] / 1000.0
        for (q0, v0), (q1, v1) in itertools.pairwise(rows):
            if u <= q1:  # the fraction first: (v1 - v0) * (u - q0) can round up for tiny quantiles
                return (v0 + (v1 - v0) * min(1.0, (u - q0) / (q1 - q0))) / 1000.0
        return rows[-1][1] / 1000.0

    def sample(self, rng: random.Random) -> float:
        """One draw in seconds (a constant draws nothing from ``rng``)."""
        return self.quantiles_ms[0][1] / 1000.0 if self.fixed else self.at(rng.random())

    @property
    def median(self) -> float:
        return self.at(0.5)

    @property
    def upper(self) -> float:
        """The largest value a draw can give (seconds)."""
        return self.quantiles_ms[-1][1] / 1000.0

    def describe(self) -> dict[str, object]:
        return {"quantiles_ms": [list(row) for row in self.quantiles_ms], "source": self.source}


DISTRIBUTED: Final = (
    "guard_signal",
    "kill_first_task",
    "kill_extra_task",
    "guard_release",
    "spot_start",
    "reserved_start",
)
"""The :class:`Latencies` fields that are distributions (the others are settings or assumptions)."""

_GUARD_SIGNAL: Final = Latency.of(defaults.GUARD_SIGNAL)
_KILL_FIRST_TASK: Final = Latency.of(defaults.KILL_FIRST_TASK)
_KILL_EXTRA_TASK: Final = Latency.of(defaults.KILL_EXTRA_TASK)
_GUARD_RELEASE: Final = Latency.of(defaults.GUARD_RELEASE)
_SPOT_START: Final = Latency.of(defaults.SPOT_START)
_RESERVED_START: Final = Latency.of(defaults.RESERVED_START)


@dataclasses.dataclass(frozen=True, slots=True)
class Latencies:
    """Node and control-plane latencies; defaults and their sources in :mod:`spotgpu.sim.defaults`.

    The measured ones (:data:`DISTRIBUTED`) are :class:`Latency` distributions, drawn per event
    by the simulation; the rest are plain durations.
    """

    detect_interval: Seconds = defaults.DETECT_INTERVAL_S
    guard_signal: Latency = _GUARD_SIGNAL
    kill_first_task: Latency = _KILL_FIRST_TASK
    kill_extra_task: Latency = _KILL_EXTRA_TASK
    guard_release: Latency = _GUARD_RELEASE
    fail_open_timeout: Seconds = defaults.FAIL_OPEN_TIMEOUT_S
    schedule_period: Seconds | None = None
    """None: automatic, :func:`spotgpu.sim.defaults.schedule_period` of the cluster size."""
    spot_start: Latency = _SPOT_START
    reserved_start: Latency = _RESERVED_START
    gang_teardown: Seconds = defaults.GANG_TEARDOWN_S
    requeue_delay: Seconds = defaults.REQUEUE_DELAY_S
    shadow_release: Seconds = defaults.SHADOW_RELEASE_S

    def __post_init__(self) -> None:
        if self.detect_interval <= 0:
            raise ConfigError("detectInterval: must be greater than zero")
        if self.schedule_period is not None and self.schedule_period <= 0:
            raise ConfigError("schedulePeriod: must be greater than zero")
        if self.fail_open_timeout <= 0:
            raise ConfigError("failOpenTimeout: must be greater than zero")

    def period(self, nodes: int) -> float:
        """The scheduling period for a cluster of ``nodes`` nodes."""
        return self.schedule_period if self.schedule_period is not None else defaults.schedule_period(nodes)

    def kill(self, tasks: int, rng: random.Random) -> float:
        """One draw of the time to kill ``tasks`` spot tasks of one owner's GPUs (0 when none).

        Both terms are read at the same quantile (one draw): the fit that makes the 8-task
        model match the 8-container benchmark holds at each quantile.
        """
        if tasks <= 0:
            return 0.0
        first, extra = self.kill_first_task, self.kill_extra_task
        u = 0.5 if first.fixed and (extra.fixed or tasks == 1) else rng.random()
        return first.at(u) + (tasks - 1) * extra.at(u)

    def kill_upper(self, tasks: int) -> float:
        """The longest :meth:`kill` can draw for ``tasks`` tasks (the invariant checker's bound)."""
        return 0.0 if tasks <= 0 else self.kill_first_task.upper + (tasks - 1) * self.kill_extra_task.upper

    def describe(self) -> dict[str, object]:
        """The distributions, for the summary (keys as in the scenario file)."""
        return {camel(name): getattr(self, name).describe() for name in DISTRIBUTED}


def quantiles_from_result(result: Mapping[str, object], key: str) -> tuple[tuple[float, float], ...]:
    """``(quantile, ms)`` rows of figure ``key`` in a benchmark's JSON result, for :mod:`defaults`.

    Reads the two spellings our benchmarks use: flat ``<key>_p50``, ``<key>_p99`` (``spotgpu bench
    agent``, ``spotgpu node-e2e``) and nested ``{<key>: {"p50": .., "p99": ..}}``, also under
    ``details`` (``spotgpu bench guard``). Any ``pNN`` or ``pNN.N`` present is taken.
    """
    found: dict[float, float] = {}
    nested = result.get(key)
    details = result.get("details")
    if nested is None and isinstance(details, Mapping):
        nested = details.get(key)
    pairs = list(nested.items()) if isinstance(nested, Mapping) else []
    pairs += [(k.removeprefix(f"{key}_"), v) for k, v in result.items() if k.startswith(f"{key}_p")]
    for name, value in pairs:
        label = str(name)
        if not label.startswith("p") or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        try:
            found[float(label[1:]) / 100.0] = float(value)
        except ValueError:
            continue
    if not found:
        raise ConfigError(f"{key}: no {key}_pNN or {key}.pNN figure in the result")
    return tuple(sorted(found.items()))


__all__ = ["DISTRIBUTED", "Latencies", "Latency", "quantiles_from_result"]
