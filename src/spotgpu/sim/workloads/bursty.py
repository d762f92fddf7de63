"""Bursty owners that come and go every few minutes: inference pods and developers.

Pure: no I/O; randomness from a generator seeded per owner (``seed:group:index``). Decides
when each owner uses its GPUs. Every figure is a key of :class:`BurstyConfig` (scenario
section ``bursty:``); the defaults are an assumption (a plausible flappy owner), not a
measurement: fit them to your telemetry.

Two kinds (``kind``):

* ``inference``: a serving pod around the clock with a bursty duty cycle: busy phases
  (requests in flight) of ``busyMin``..``busyMax`` and idle phases of ``idleMin``..``idleMax``
  (uniform; defaults 1-5 minutes each), from a random point of its cycle at time 0.
* ``developer``: an interactive user on ``workdays`` (Monday = 0; day 0 of the simulation is
  ``firstWeekday``), in from ``arrive`` to ``leave`` (each normal with standard deviation
  ``dayJitter``), alternating short GPU sessions (``busyMin``..``busyMax``) and short breaks
  (``idleMin``..``idleMax``); after a session the break is a longer one with probability
  ``longBreakProbability`` (``longBreakMin``..``longBreakMax``: a meeting, a coffee), lunch
  at ``lunch`` for ``lunchLength``; away at night and on other days.

Times are rounded to whole seconds. With the lending policies' ``maxInactiveTime`` of minutes,
these owners are lent and come back within minutes: the case that shows how much spot work a
policy wastes on flappy owners.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Final, Literal

from spotgpu.core.configfile import ConfigError, Seconds, camel
from spotgpu.sim.workloads.base import OWNER_SOURCES, OwnerRequest, OwnerTrace, check_work_week, merge_intervals

NAME: Final = "bursty"
DAY: Final = 86400.0
HOUR: Final = 3600.0
MINUTE: Final = 60.0

_ONE_MIN: Final = Seconds(MINUTE)
_FIVE_MIN: Final = Seconds(5 * MINUTE)
_ARRIVE: Final = Seconds(9.0 * HOUR)
_LEAVE: Final = Seconds(18.0 * HOUR)
_DAY_JITTER: Final = Seconds(0.5 * HOUR)
_LUNCH: Final = Seconds(12.5 * HOUR)
_LUNCH_LENGTH: Final = Seconds(45 * MINUTE)
_LONG_BREAK_MIN: Final = Seconds(15 * MINUTE)
_LONG_BREAK_MAX: Final = Seconds(45 * MINUTE)


@dataclasses.dataclass(frozen=True, slots=True)
class BurstyConfig:
    """Scenario section ``bursty:`` of an owner group."""

    kind: Literal["inference", "developer"] = "inference"
    busy_min: Seconds = _ONE_MIN
    busy_max: Seconds = _FIVE_MIN
    idle_min: Seconds = _ONE_MIN
    idle_max: Seconds = _FIVE_MIN
    workdays: tuple[int, ...] = (0, 1, 2, 3, 4)
    first_weekday: int = 0
    arrive: Seconds = _ARRIVE
    leave: Seconds = _LEAVE
    day_jitter: Seconds = _DAY_JITTER
    lunch: Seconds = _LUNCH
    lunch_length: Seconds = _LUNCH_LENGTH
    long_break_probability: float = 0.1
    long_break_min: Seconds = _LONG_BREAK_MIN
    long_break_max: Seconds = _LONG_BREAK_MAX

    def __post_init__(self) -> None:
        for low, high in (("busy_min", "busy_max"), ("idle_min", "idle_max"), ("long_break_min", "long_break_max")):
            lo, hi = getattr(self, low), getattr(self, high)
            if not 0 < lo <= hi:
                raise ConfigError(f"{camel(low)}: must be greater than zero and at most {camel(high)} ({hi:g}s)")
        check_work_week(self, ("long_break_probability",))


def inference_intervals(config: BurstyConfig, rng: random.Random, horizon: float) -> list[tuple[float, float]]:
    """Busy phases of one inference pod over ``[0, horizon)`` (unrounded, sorted)."""
    out: list[tuple[float, float]] = []
    # Start anywhere in a cycle: busy or idle at time 0 in proportion to the mean phases.
    busy_mean = (config.busy_min + config.busy_max) / 2
    idle_mean = (config.idle_min + config.idle_max) / 2
    busy = rng.random() < busy_mean / (busy_mean + idle_mean)
    t = -rng.uniform(0.0, config.busy_max if busy else config.idle_max)
    while t < horizon:
        if busy:
            end = t + rng.uniform(config.busy_min, config.busy_max)
            out.append((t, end))
        else:
            end = t + rng.uniform(config.idle_min, config.idle_max)
        t, busy = end, not busy
    return out


def developer_day(config: BurstyConfig, rng: random.Random, day: int) -> list[tuple[float, float]]:
    """Sessions of one developer on simulated day ``day`` (absolute seconds, unrounded)."""
    if (config.first_weekday + day) % 7 not in config.workdays:
        return []
    arrive = rng.gauss(config.arrive, config.day_jitter)
    leave = max(arrive + HOUR, rng.gauss(config.leave, config.day_jitter))
    lunch_start, lunch_end = config.lunch, config.lunch + config.lunch_length
    out: list[tuple[float, float]] = []
    t = arrive
    while t < leave:
        end = min(leave, t + rng.uniform(config.busy_min, config.busy_max))
        if t < lunch_end and end > lunch_start:
            if t < lunch_start:
                out.append((t, lunch_start))
            t = lunch_end
            continue
        out.append((t, end))
        if rng.random() < config.long_break_probability:
            t = end + rng.uniform(config.long_break_min, config.long_break_max)
        else:
            t = end + rng.uniform(config.idle_min, config.idle_max)
    base = day * DAY
    return [(base + s, base + e) for s, e in out]


class BurstyOwners:
    """The ``bursty`` owner source (see the module docstring)."""

    config_type = BurstyConfig

    def build(self, config: BurstyConfig, request: OwnerRequest) -> list[OwnerTrace]:
        owners = []
        for index in range(request.count):
            rng = random.Random(f"{request.seed}:{request.group}:{index}")
            if config.kind == "inference":
                spans = inference_intervals(config, rng, request.horizon)
            else:
                spans = [s for day in range(int(request.horizon // DAY) + 1) for s in developer_day(config, rng, day)]
            rounded = ((round(s), round(e)) for s, e in spans)
            active = merge_intervals(((float(s), float(e)) for s, e in rounded if e > s), request.horizon)
            origin = f"{NAME}:{config.kind}"
            owners.append(OwnerTrace(f"{request.group}-{index:05d}", request.gpus_per_owner, active, origin))
        return owners


OWNER_SOURCES.register(NAME, BurstyOwners())

__all__ = ["NAME", "BurstyConfig", "BurstyOwners", "developer_day", "inference_intervals"]
