"""Owners from a synthetic developer-machine pattern: work-day cycles, configurable.

Pure: no I/O; randomness from a generator seeded per owner (``seed:group:index``). Decides
when each dev-machine owner uses its GPUs.

The pattern, per owner and per day (every figure is a key of :class:`DevMachineConfig`):

* Work days (``workdays``, Monday = 0; day 0 of the simulation is ``firstWeekday``) the owner
  comes in with probability ``1 - absentProbability``; on other days with
  ``weekendProbability`` (then for a shorter day, ``weekendHours``).
* Arrival and departure are normal around ``arrive`` / ``leave`` (standard deviations
  ``arriveJitter`` / ``leaveJitter``); each owner's whole day is shifted by a fixed
  per-owner offset drawn uniformly in ``+-timezoneSpread/2`` (teams across time zones).
* While in, the owner alternates GPU sessions (exponential, mean ``sessionMean``) and breaks
  (exponential, mean ``breakMean``), and stops for lunch (``lunch``, ``lunchLength``).
* On leaving, with probability ``overnightProbability`` a run is left going on the GPUs for an
  exponential time with mean ``overnightMean`` (capped at 20 h; it merges with the next
  day's work if it runs into it).

Times are rounded to whole seconds. The defaults describe a typical office team and are an
assumption, not a measurement; fit them to your own telemetry.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Final

from spotgpu.core.configfile import ConfigError, Seconds, camel
from spotgpu.sim.workloads.base import OWNER_SOURCES, OwnerRequest, OwnerTrace, check_work_week, merge_intervals

NAME: Final = "devmachine"
DAY: Final = 86400.0
HOUR: Final = 3600.0


_ARRIVE: Final = Seconds(9.0 * HOUR)
_ARRIVE_JITTER: Final = Seconds(0.75 * HOUR)
_LEAVE: Final = Seconds(18.5 * HOUR)
_LEAVE_JITTER: Final = Seconds(1.0 * HOUR)
_SESSION_MEAN: Final = Seconds(50 * 60.0)
_BREAK_MEAN: Final = Seconds(15 * 60.0)
_LUNCH: Final = Seconds(12.5 * HOUR)
_LUNCH_LENGTH: Final = Seconds(45 * 60.0)
_OVERNIGHT_MEAN: Final = Seconds(4 * HOUR)
_WEEKEND_HOURS: Final = Seconds(4 * HOUR)
_TIMEZONE_SPREAD: Final = Seconds(0.0)


@dataclasses.dataclass(frozen=True, slots=True)
class DevMachineConfig:
    """Scenario section ``devmachine:`` of an owner group."""

    workdays: tuple[int, ...] = (0, 1, 2, 3, 4)
    first_weekday: int = 0
    arrive: Seconds = _ARRIVE
    arrive_jitter: Seconds = _ARRIVE_JITTER
    leave: Seconds = _LEAVE
    leave_jitter: Seconds = _LEAVE_JITTER
    session_mean: Seconds = _SESSION_MEAN
    break_mean: Seconds = _BREAK_MEAN
    lunch: Seconds = _LUNCH
    lunch_length: Seconds = _LUNCH_LENGTH
    overnight_probability: float = 0.25
    overnight_mean: Seconds = _OVERNIGHT_MEAN
    absent_probability: float = 0.05
    weekend_probability: float = 0.1
    weekend_hours: Seconds = _WEEKEND_HOURS
    timezone_spread: Seconds = _TIMEZONE_SPREAD

    def __post_init__(self) -> None:
        check_work_week(self, ("overnight_probability", "absent_probability", "weekend_probability"))
        for name in ("session_mean", "break_mean", "overnight_mean"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{camel(name)}: must be greater than zero")


def owner_day_intervals(
    config: DevMachineConfig, rng: random.Random, day: int, shift: float
) -> list[tuple[float, float]]:
    """Active intervals of one owner on simulated day ``day`` (absolute seconds, unsorted)."""
    weekday = (config.first_weekday + day) % 7
    base = day * DAY + shift
    if weekday in config.workdays:
        if rng.random() < config.absent_probability:
            return []
        arrive = rng.gauss(config.arrive, config.arrive_jitter)
        leave = max(arrive + 1800.0, rng.gauss(config.leave, config.leave_jitter))
    else:
        if rng.random() >= config.weekend_probability:
            return []
        arrive = rng.gauss(config.arrive + 2 * HOUR, config.arrive_jitter)
        leave = arrive + config.weekend_hours
    lunch_start, lunch_end = config.lunch, config.lunch + config.lunch_length
    out: list[tuple[float, float]] = []
    t = arrive + rng.expovariate(1.0 / config.break_mean) / 2  # settle in
    while t < leave:
        end = min(leave, t + rng.expovariate(1.0 / config.session_mean))
        if t < lunch_end and end > lunch_start and arrive < lunch_start < leave:
            if t < lunch_start:
                out.append((t, lunch_start))
            t = max(end, lunch_end)
            continue
        out.append((t, end))
        t = end + rng.expovariate(1.0 / config.break_mean)
    if rng.random() < config.overnight_probability:
        out.append((leave, leave + min(rng.expovariate(1.0 / config.overnight_mean), 20 * HOUR)))
    return [(round(base + s), round(base + e)) for s, e in out if e > s]


class DevMachineOwners:
    """The ``devmachine`` owner source (see the module docstring)."""

    config_type = DevMachineConfig

    def build(self, config: DevMachineConfig, request: OwnerRequest) -> list[OwnerTrace]:
        days = int(request.horizon // DAY) + 2  # one day before (overnight runs) and the last one
        owners = []
        for index in range(request.count):
            rng = random.Random(f"{request.seed}:{request.group}:{index}")
            shift = (rng.random() - 0.5) * config.timezone_spread
            spans: list[tuple[float, float]] = []
            for day in range(-1, days):
                spans.extend(owner_day_intervals(config, rng, day, shift))
            active = merge_intervals(spans, request.horizon)
            owners.append(OwnerTrace(f"{request.group}-{index:05d}", request.gpus_per_owner, active, NAME))
        return owners


OWNER_SOURCES.register(NAME, DevMachineOwners())

__all__ = ["NAME", "DevMachineConfig", "DevMachineOwners", "owner_day_intervals"]
