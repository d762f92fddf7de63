"""Workload model and the workload-source extension points.

Pure data and pure functions; sources read trace files only in their ``build`` (the one side
effect of this package, named in each adapter's docstring). A scenario asks each configured
source for what it needs:

* an :class:`OwnerSource` returns :class:`OwnerTrace` s: reserved owners (a pod holding
  ``gpus`` real GPUs on one node) with the intervals in which they use their GPUs;
* a :class:`JobSource` returns :class:`TraceJob` s: arrival, duration and size of jobs (spot
  gangs or reserved jobs; the scenario decides which and assigns spot priorities).

A new source is one module that registers an object with ``config_type`` (a frozen dataclass
loaded from the scenario's section named after the source) and ``build`` in
:data:`OWNER_SOURCES` or :data:`JOB_SOURCES`.

Randomness: sources that need it derive a :class:`random.Random` from ``request.seed`` (a
string; ``random.Random(str)`` is seeded through SHA-512, so it is stable across processes and
Python runs), never from the global generator.
"""

from __future__ import annotations

import bisect
import csv
import gzip
import io
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from spotgpu.core.configfile import ConfigError, camel
from spotgpu.core.errors import ValidationError
from spotgpu.core.registry import Registry
from spotgpu.core.types import SpotPriority

EMBEDDED: Final = "embedded"
"""The ``trace`` value that selects the excerpt shipped inside the package."""


class WorkloadError(ValidationError):
    """A workload source got a bad configuration or a trace file it cannot use; the message
    names the file (and line) or the key."""


@dataclass(frozen=True, slots=True)
class OwnerTrace:
    """A reserved owner: one pod holding ``gpus`` GPUs of one node, and when it uses them.

    ``active`` holds sorted, disjoint, non-touching ``[start, end)`` intervals in simulated
    seconds; outside them the owner issues no GPU work.
    """

    name: str
    gpus: int
    active: tuple[tuple[float, float], ...]
    origin: str
    """Where the owner comes from (source and series), for reports."""

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise WorkloadError(f"owner {self.name}: needs at least one GPU, got {self.gpus}")
        prev_end = -math.inf
        for start, end in self.active:
            if not (math.isfinite(start) and math.isfinite(end)) or start < 0 or end <= start:
                raise WorkloadError(f"owner {self.name}: bad active interval [{start}, {end})")
            if start <= prev_end:
                raise WorkloadError(f"owner {self.name}: active intervals must be sorted and disjoint at {start}")
            prev_end = end

    def active_at(self, t: float) -> bool:
        i = bisect.bisect_right(self.active, (t, math.inf)) - 1
        return i >= 0 and self.active[i][0] <= t < self.active[i][1]

    def active_seconds(self, until: float) -> float:
        return sum(max(0.0, min(e, until) - s) for s, e in self.active if s < until)


@dataclass(frozen=True, slots=True)
class TraceJob:
    """A job as a trace gives it: arrival (simulated seconds), duration of its work, GPUs."""

    origin: str
    """A stable identity (``source:series:row``); the hash priority rule reads it."""
    arrival: float
    duration: float
    gpus: int
    priority: SpotPriority | None = None
    """An explicit spot priority (inline jobs); otherwise the stream's rule decides."""
    min_lease: float | None = None
    """An explicit minimum lease in seconds (inline jobs); otherwise the stream's ``minLease`` rule."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.arrival) or self.arrival < 0:
            raise WorkloadError(f"job {self.origin}: arrival must be >= 0, got {self.arrival}")
        if not math.isfinite(self.duration) or self.duration <= 0:
            raise WorkloadError(f"job {self.origin}: duration must be > 0, got {self.duration}")
        if self.gpus < 1:
            raise WorkloadError(f"job {self.origin}: needs at least one GPU, got {self.gpus}")


@dataclass(frozen=True, slots=True)
class OwnerRequest:
    """What a scenario asks an owner source for."""

    group: str
    count: int
    """Owners wanted."""
    gpus_per_owner: int
    horizon: float
    """Simulated seconds; activity after it is irrelevant."""
    seed: str
    base_dir: Path
    """Relative trace paths are resolved against this (the scenario file's folder)."""


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What a scenario asks a job source for.

    Exactly one of ``target_gpu_seconds`` (offered GPU demand to reach by overlaying further
    windows of the trace) and ``scale`` (a plain multiplier) is set.
    """

    stream: str
    horizon: float
    target_gpu_seconds: float | None
    scale: float | None
    max_gpus: int
    """Jobs asking for more GPUs than this are left out (they could never run)."""
    seed: str
    base_dir: Path


class OwnerSource(Protocol):
    @property
    def config_type(self) -> type[Any]: ...

    def build(self, config: Any, request: OwnerRequest) -> list[OwnerTrace]: ...


class JobSource(Protocol):
    @property
    def config_type(self) -> type[Any]: ...

    def build(self, config: Any, request: JobRequest) -> list[TraceJob]: ...


OWNER_SOURCES: Final[Registry[OwnerSource]] = Registry("owner source")
JOB_SOURCES: Final[Registry[JobSource]] = Registry("job source")


def check_work_week(config: Any, probabilities: Sequence[str] = ()) -> None:
    """The rules of a work-week pattern's keys (``workdays``, ``firstWeekday``, ``arrive`` before
    ``leave`` within a day, and the named probability fields); :class:`ConfigError` naming the key."""
    if any(not 0 <= d <= 6 for d in config.workdays):
        raise ConfigError(f"workdays: days are 0 (Monday) .. 6 (Sunday), got {list(config.workdays)}")
    if not 0 <= config.first_weekday <= 6:
        raise ConfigError(f"firstWeekday: must be 0 (Monday) .. 6 (Sunday), got {config.first_weekday}")
    for name in probabilities:
        value = getattr(config, name)
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"{camel(name)}: a probability must be within 0..1, got {value}")
    if not config.arrive < config.leave <= 86400.0:
        raise ConfigError(f"leave: must be after arrive and within a day ({config.arrive:g}s .. {config.leave:g}s)")


def resolve_path(value: str, base_dir: Path) -> Path:
    """A trace path from a scenario: ``~`` expanded, relative to the scenario's folder."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else base_dir / path


def read_text(path: Path, what: str) -> str:
    """A trace file's text, gunzipped when it ends in ``.gz``; :class:`WorkloadError` naming it otherwise."""
    try:
        raw = path.read_bytes()
        return (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode()
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: cannot read {what}: {exc}") from None


def file_version(path: Path, what: str) -> int:
    """The file's modification time (ns), a cache key that changes when the file does."""
    try:
        return path.stat().st_mtime_ns
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None


def csv_rows(text: str, where: str, required: Iterable[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """The records of a CSV trace as ``(line, {column: text})``, the header on line 1.

    Every problem is a :class:`WorkloadError` naming ``where:line``: a missing column, a row with
    fewer or more fields than the header, a malformed line (the csv module's own errors).
    """
    reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
    done = 0  # the last line of the last complete record (the csv module counts lines per record)
    try:
        fields = list(reader.fieldnames or ())
        done = reader.line_num
        missing = set(required) - set(fields)
        if missing:
            raise WorkloadError(f"{where}: missing column(s) {', '.join(sorted(missing))}")
        for record in reader:
            line = reader.line_num
            if None in record:
                raise WorkloadError(f"{where}:{line}: more fields than the header's {len(fields)}")
            short = [k for k in fields if record.get(k) is None]
            if short:
                raise WorkloadError(
                    f"{where}:{line}: {len(fields) - len(short)} of the header's {len(fields)} fields;"
                    f" no {', '.join(short)}"
                )
            done = line
            yield line, record  # every value is a str here (checked above)
    except csv.Error as exc:
        raise WorkloadError(f"{where}:{done + 1}: not valid CSV (in the record from this line on): {exc}") from None


def csv_seconds(record: dict[str, str], column: str, where: str) -> float:
    """A finite number of seconds (``12``, ``12.5``, ``1e3``) from a CSV field; ``where`` is ``file:line``."""
    text = record[column].strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise WorkloadError(f"{where}: {column}: {text!r} is not a number of seconds")
    return value


def csv_int(record: dict[str, str], column: str, where: str) -> int:
    """An integer from a CSV field (``4``; ``4.0`` too, a float spelling of a whole number)."""
    text = record[column].strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value != int(value):
        raise WorkloadError(f"{where}: {column}: {text!r} is not an integer")
    return int(value)


def merge_intervals(intervals: Iterable[tuple[float, float]], horizon: float) -> tuple[tuple[float, float], ...]:
    """Sort, clip to ``[0, horizon)``, drop empty ones and merge overlapping or touching ones."""
    out: list[tuple[float, float]] = []
    for first, last in sorted(intervals):
        start, end = max(0.0, first), min(horizon, last)
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return tuple(out)


def demand_gpu_seconds(jobs: Iterable[TraceJob], horizon: float) -> float:
    """GPU-seconds the jobs ask for inside ``[0, horizon)`` (work past the horizon not counted)."""
    return sum(j.gpus * max(0.0, min(j.duration, horizon - j.arrival)) for j in jobs if j.arrival < horizon)


def overlay_windows(window: Callable[[int], Sequence[TraceJob]], windows: int, request: JobRequest) -> list[TraceJob]:
    """Build a job stream from consecutive trace windows, scaled as ``request`` asks.

    ``window(i)`` returns the jobs of the i-th window of the trace (arrivals relative to that
    window's start, so within ``[0, horizon)``); there are ``windows`` distinct ones. With a
    ``scale`` s, windows 0 .. floor(s)-1 are overlaid whole and window floor(s) is thinned to the
    fraction s - floor(s). With a ``target_gpu_seconds``, windows are overlaid in order until
    the target is reached, the last one thinned to what is still missing. Thinning keeps each
    job with the missing fraction as probability, drawn from a generator seeded by
    ``request.seed`` (so it is deterministic). Windows are reused cyclically if the trace has
    fewer than needed. Every window is real trace data, with its real burstiness.
    """
    if windows < 1:
        raise WorkloadError(f"{request.stream}: the trace has no job to take")
    rng = random.Random(f"{request.seed}:thin")

    def fitting(i: int) -> list[TraceJob]:
        return [j for j in window(i % windows) if j.gpus <= request.max_gpus]

    out: list[TraceJob] = []
    if request.scale is not None:
        whole, frac = divmod(request.scale, 1.0)
        for i in range(int(whole)):
            out.extend(fitting(i))
        if frac > 0:
            out.extend(j for j in fitting(int(whole)) if rng.random() < frac)
    else:
        target = request.target_gpu_seconds or 0.0
        have = 0.0
        i = 0
        empty_streak = 0
        while have < target * (1 - 1e-9):
            jobs = fitting(i)
            need = target - have
            got = demand_gpu_seconds(jobs, request.horizon)
            if got <= 0:
                empty_streak += 1
                if empty_streak >= windows:
                    raise WorkloadError(f"{request.stream}: no window of the trace has jobs within the horizon")
                i += 1
                continue
            empty_streak = 0
            if got <= need:
                out.extend(jobs)
                have += got
            else:
                frac = need / got
                kept = [j for j in jobs if rng.random() < frac]
                out.extend(kept)
                have += demand_gpu_seconds(kept, request.horizon)
                break
            i += 1
    out.sort(key=lambda j: (j.arrival, j.origin))
    return out


__all__ = [
    "EMBEDDED",
    "JOB_SOURCES",
    "OWNER_SOURCES",
    "JobRequest",
    "JobSource",
    "OwnerRequest",
    "OwnerSource",
    "OwnerTrace",
    "TraceJob",
    "WorkloadError",
    "check_work_week",
    "csv_int",
    "csv_rows",
    "csv_seconds",
    "demand_gpu_seconds",
    "file_version",
    "merge_intervals",
    "overlay_windows",
    "read_text",
    "resolve_path",
]
