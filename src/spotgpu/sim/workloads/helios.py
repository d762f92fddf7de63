"""Owners from the Helios Earth per-team series (SenseTime, via HeliosArtifact; CC BY 4.0).

Side effect: reads the trace file(s) in :meth:`HeliosOwners.build` (parsed series are cached
per file). Decides which owners are active in each minute.

The data: for each virtual cluster (a team) of SenseTime's cluster Earth, one row per minute
with the team's GPU quota (``total_gpu_num``) and how many of those GPUs run nothing
(``idle_gpu_num``); ``total - idle`` GPUs are busy. Accepted inputs (``trace``):

* ``embedded``: the excerpt shipped with spotgpu (May 2020, teams vc3sl, vc6YE, vc8Sj, vcJLV);
* a folder holding ``<team>/cluster_sequence_vc.csv`` as in HeliosArtifact;
* one CSV file, either HeliosArtifact's per-team ``cluster_sequence_vc.csv`` (one team) or
  the excerpt's format (a ``team`` column).

The model (documented in docs/simulator.md): a team's quota ``Q`` becomes ``Q / gpusPerOwner``
reserved owners (pods of ``gpusPerOwner`` GPUs, e.g. whole 8-GPU nodes). In each minute the
number of *active* owners is ``ceil(busy * owners / Q)``: an owner counts as active when any of
its GPUs would be busy, the conservative choice for lending. When the count goes up, the newly
active owners are drawn uniformly among the inactive ones; when it goes down, the ones that
stop are drawn uniformly among the active ones (a seeded generator per copy, so the choice is
deterministic and neutral: neither favours nor avoids recently lent GPUs).

More owners than one team has are covered by *copies*: copy ``c`` replays team
``teams[c % len(teams)]`` shifted by ``(c // len(teams)) * copyOffset`` (wrapping around the
end of the series), so a large cluster sees many real, differently timed series rather than
one curve repeated. The last copy may be partial (fewer owners, same proportional rule).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Final

from spotgpu.core.configfile import ConfigError, Seconds
from spotgpu.sim.workloads.base import (
    EMBEDDED,
    OWNER_SOURCES,
    OwnerRequest,
    OwnerTrace,
    WorkloadError,
    csv_int,
    csv_rows,
    file_version,
    read_text,
    resolve_path,
)

NAME: Final = "helios"
EMBEDDED_FILE: Final = Path(__file__).resolve().parent.parent / "data" / "helios-earth-2020-05.csv.gz"
EMBEDDED_TEAMS: Final = ("vc6YE", "vc3sl", "vc8Sj", "vcJLV")
SERIES_FILE: Final = "cluster_sequence_vc.csv"

_DEFAULT_COPY_OFFSET: Final = Seconds(86400.0)


@dataclasses.dataclass(frozen=True, slots=True)
class HeliosConfig:
    """Scenario section ``helios:`` of an owner group."""

    trace: str = EMBEDDED
    teams: tuple[str, ...] = EMBEDDED_TEAMS
    start: str = "2020-05-04 00:00:00"
    """The series minute replayed at simulated time 0 (2020-05-04 is a Monday)."""
    copy_offset: Seconds = _DEFAULT_COPY_OFFSET

    def __post_init__(self) -> None:
        if not self.teams:
            raise ConfigError("teams: name at least one team")
        try:
            datetime.fromisoformat(self.start)
        except ValueError:
            raise ConfigError(f"start: {self.start!r} is not a time like '2020-05-04 00:00:00'") from None
        if self.copy_offset < 60:
            raise ConfigError(f"copyOffset: must be at least one minute, got {self.copy_offset:g}s")


@dataclasses.dataclass(frozen=True, slots=True)
class TeamSeries:
    """One team's step function: at minute ``minutes[i]`` (from ``start``) the values change."""

    team: str
    start: datetime
    length: int
    """Minutes covered (the last row's minute + 1)."""
    minutes: tuple[int, ...]
    total: tuple[int, ...]
    busy: tuple[int, ...]

    def quota(self) -> int:
        return max(self.total)

    def index_at(self, minute: int) -> int:
        return bisect.bisect_right(self.minutes, minute) - 1


def _parse_rows(rows: list[tuple[int, str, str, str]], where: str, team: str) -> TeamSeries:
    """``rows``: (line number, time, total, idle); may be every minute or only the changes."""
    if not rows:
        raise WorkloadError(f"{where}: no rows for team {team!r}")
    minutes: list[int] = []
    total: list[int] = []
    busy: list[int] = []
    start: datetime | None = None
    for line, time_text, total_text, idle_text in rows:
        try:
            when = datetime.fromisoformat(time_text)
        except ValueError:
            raise WorkloadError(f"{where}:{line}: time: {time_text!r} is not a time like 2020-05-01 00:00:00") from None
        record = {"total_gpu_num": total_text, "idle_gpu_num": idle_text}
        t, idle = (csv_int(record, column, f"{where}:{line}") for column in record)
        if t <= 0 or not 0 <= idle <= t:
            raise WorkloadError(f"{where}:{line}: need 0 <= idle_gpu_num <= total_gpu_num and a quota > 0")
        if start is None:
            start = when
        offset = (when - start).total_seconds() / 60
        minute = round(offset)
        if abs(offset - minute) > 1e-6 or (minutes and minute <= minutes[-1]):
            raise WorkloadError(f"{where}:{line}: times must be whole minutes in increasing order, got {time_text}")
        if not total or (t, t - idle) != (total[-1], busy[-1]):
            minutes.append(minute)
            total.append(t)
            busy.append(t - idle)
        last = minute
    assert start is not None
    return TeamSeries(team, start, last + 1, tuple(minutes), tuple(total), tuple(busy))


def _read_csv(text: str, where: str) -> dict[str, list[tuple[int, str, str, str]]]:
    by_team: dict[str, list[tuple[int, str, str, str]]] = {}
    for line, row in csv_rows(text, where, ("time", "total_gpu_num", "idle_gpu_num")):
        team = row.get("team", "")
        by_team.setdefault(team, []).append((line, row["time"], row["total_gpu_num"], row["idle_gpu_num"]))
    return by_team


@lru_cache(maxsize=16)
def _load_file(path: Path, mtime_ns: int) -> dict[str, list[tuple[int, str, str, str]]]:
    del mtime_ns  # part of the cache key only
    return _read_csv(read_text(path, "Helios trace"), str(path))


def _rows_for(path: Path, team: str) -> list[tuple[int, str, str, str]]:
    by_team = _load_file(path, file_version(path, "Helios trace"))
    if "" in by_team and len(by_team) == 1:
        return by_team[""]  # a per-team file of HeliosArtifact
    if team not in by_team:
        raise WorkloadError(f"{path}: no series for team {team!r}; it has {', '.join(sorted(by_team))}")
    return by_team[team]


def load_series(trace: str, team: str, base_dir: Path) -> TeamSeries:
    """The series of ``team`` from ``trace`` (see the module docstring for the accepted forms)."""
    if trace == EMBEDDED:
        path = EMBEDDED_FILE
    else:
        path = resolve_path(trace, base_dir)
        if path.is_dir():
            path = path / team / SERIES_FILE
    return _parse_rows(_rows_for(path, team), str(path), team)


def active_counts(series: TeamSeries, first: int, minutes: int, owners: int) -> list[tuple[int, int]]:
    """``(minute, active owners)`` at minute 0 and wherever it changes, for ``minutes`` minutes
    of the series from series-minute ``first`` (wrapping at the end of the series)."""
    out: list[tuple[int, int]] = []
    m = 0
    pos = first % series.length
    while m < minutes:
        i = series.index_at(pos)
        seg_end = series.minutes[i + 1] if i + 1 < len(series.minutes) else series.length
        q = series.total[i]
        count = min(owners, math.ceil(series.busy[i] * owners / q)) if i >= 0 else 0
        if not out or out[-1][1] != count:
            out.append((m, count))
        m += seg_end - pos
        pos = seg_end % series.length
    return out


class HeliosOwners:
    """The ``helios`` owner source (see the module docstring)."""

    config_type = HeliosConfig

    def build(self, config: HeliosConfig, request: OwnerRequest) -> list[OwnerTrace]:
        series = [load_series(config.trace, team, request.base_dir) for team in config.teams]
        horizon_min = math.ceil(request.horizon / 60)
        owners: list[OwnerTrace] = []
        copy = 0
        while len(owners) < request.count:
            team = series[copy % len(series)]
            shift_min = int((copy // len(series)) * config.copy_offset // 60)
            start_min = round((datetime.fromisoformat(config.start) - team.start).total_seconds() / 60)
            if not 0 <= start_min < team.length:
                raise WorkloadError(
                    f"start {config.start!r} is outside team {team.team}'s series "
                    f"({team.start} + {team.length} minutes)"
                )
            quota_owners = max(1, team.quota() // request.gpus_per_owner)
            n = min(quota_owners, request.count - len(owners))
            # A partial copy scales the team's busy GPUs to its own size (n of quota_owners).
            counts = active_counts(team, start_min + shift_min, horizon_min, quota_owners)
            if n < quota_owners:
                counts = [(m, math.ceil(c * n / quota_owners)) for m, c in counts]
            rng = random.Random(f"{request.seed}:{request.group}:{copy}")
            origin = f"{NAME}:{team.team}+{shift_min // 60}h"
            intervals = _assign(counts, n, rng, request.horizon)
            base = len(owners)
            owners.extend(
                OwnerTrace(f"{request.group}-{base + i:05d}", request.gpus_per_owner, iv, origin)
                for i, iv in enumerate(intervals)
            )
            copy += 1
        return owners


def _assign(
    counts: list[tuple[int, int]], n: int, rng: random.Random, horizon: float
) -> list[tuple[tuple[float, float], ...]]:
    """Turn active-owner counts into per-owner intervals (uniform choice, see module docstring)."""
    active: list[int] = []
    inactive = list(range(n))
    since: dict[int, float] = {}
    done: list[list[tuple[float, float]]] = [[] for _ in range(n)]
    for minute, wanted in counts:
        t = minute * 60.0
        count = min(wanted, n)
        if count > len(active):
            for owner in rng.sample(inactive, count - len(active)):
                inactive.remove(owner)
                active.append(owner)
                since[owner] = t
        elif count < len(active):
            for owner in rng.sample(active, len(active) - count):
                active.remove(owner)
                inactive.append(owner)
                done[owner].append((since.pop(owner), t))
    for owner in active:
        done[owner].append((since.pop(owner), horizon))
    out = []
    for spans in done:
        clipped = [(s, min(e, horizon)) for s, e in spans if s < horizon and min(e, horizon) > s]
        out.append(tuple(clipped))
    return out


OWNER_SOURCES.register(NAME, HeliosOwners())

__all__ = ["NAME", "HeliosConfig", "HeliosOwners", "TeamSeries", "active_counts", "load_series"]
