"""Jobs from the ElasticFlow traces (Microsoft ITP clusters, 2021; MIT).

Side effect: reads the trace in :meth:`ElasticFlowJobs.build` (parsed traces are cached per
file). Decides which trace jobs arrive when in the simulation.

The data: per cluster, one row per job with ``submission_time`` (seconds, relative to the
trace start), ``duration`` (seconds of running time) and ``num_gpu``; seconds may have
fractions (``12.5``). A row that is short, long or not numbers is an error naming file:line.
Accepted inputs
(``trace``):

* ``embedded``: the excerpt shipped with spotgpu (all ten clusters, ``job_id`` replaced by the
  row number);
* ElasticFlow's ``raw-traces.tar.gz`` as published;
* a folder of ``clusterNN.csv`` files, or one such file (the cluster is the file's stem);
* a file in the excerpt's format (``cluster,row,submission_time,duration,num_gpu``, optionally
  gzip-compressed).

Windows: the chosen clusters are merged and cut into windows of the simulated horizon,
window ``i`` starting at ``start + i * horizon`` (wrapping around the end of the trace).
Window 0 is the plain replay; a job stream that asks for more load overlays further windows
(:func:`~spotgpu.sim.workloads.base.overlay_windows`).
"""

from __future__ import annotations

import bisect
import dataclasses
import gzip
import tarfile
from functools import lru_cache
from pathlib import Path
from typing import Final, NamedTuple

from spotgpu.core.configfile import ConfigError, Seconds
from spotgpu.sim.workloads.base import (
    EMBEDDED,
    JOB_SOURCES,
    JobRequest,
    TraceJob,
    WorkloadError,
    csv_int,
    csv_rows,
    csv_seconds,
    file_version,
    overlay_windows,
    read_text,
    resolve_path,
)

NAME: Final = "elasticflow"
EMBEDDED_FILE: Final = Path(__file__).resolve().parent.parent / "data" / "elasticflow-2021.csv.gz"

_DEFAULT_START: Final = Seconds(0.0)


@dataclasses.dataclass(frozen=True, slots=True)
class ElasticFlowConfig:
    """Scenario section ``elasticflow:`` of a job stream."""

    trace: str = EMBEDDED
    clusters: tuple[str, ...] = ()
    """Clusters to merge (``cluster04``, ...); empty means all in the trace."""
    start: Seconds = _DEFAULT_START
    """Offset into the trace (its times are relative seconds) replayed at simulated time 0."""

    def __post_init__(self) -> None:
        if len(set(self.clusters)) != len(self.clusters):
            raise ConfigError(
                f"clusters: listed twice: {sorted(c for c in self.clusters if self.clusters.count(c) > 1)}"
            )


class Row(NamedTuple):
    submission: float
    """Seconds from the trace's start (whole in the published traces; fractions accepted)."""
    cluster: str
    row: int
    duration: float
    gpus: int


def _parse(text: str, where: str, cluster: str | None) -> list[Row]:
    need = {"submission_time", "duration", "num_gpu"} | ({"cluster", "row"} if cluster is None else set())
    rows = []
    for n, (line, rec) in enumerate(csv_rows(text, where, need)):
        at = f"{where}:{line}"
        sub, dur = csv_seconds(rec, "submission_time", at), csv_seconds(rec, "duration", at)
        gpus = csv_int(rec, "num_gpu", at)
        name, row_no = (rec["cluster"], csv_int(rec, "row", at)) if cluster is None else (cluster, n)
        if sub < 0 or dur <= 0 or gpus < 1:
            raise WorkloadError(f"{at}: need submission_time >= 0, duration > 0, num_gpu >= 1")
        rows.append(Row(sub, name, row_no, dur, gpus))
    return rows


def _read(path: Path) -> list[Row]:
    try:
        if path.is_dir():
            rows = []
            files = sorted(path.glob("cluster*.csv"))
            if not files:
                raise WorkloadError(f"{path}: no cluster*.csv file in this folder")
            for file in files:
                rows.extend(_parse(file.read_text(), str(file), file.stem))
            return rows
        if path.name.endswith((".tar.gz", ".tgz")):
            rows = []
            with tarfile.open(path, "r:gz") as tar:
                for member in sorted(tar.getmembers(), key=lambda m: m.name):
                    name = Path(member.name).name
                    fh = tar.extractfile(member) if member.isfile() else None
                    if fh is not None and name.startswith("cluster") and name.endswith(".csv"):
                        rows.extend(_parse(fh.read().decode(), f"{path}:{member.name}", name.removesuffix(".csv")))
            return rows
        text = read_text(path, "ElasticFlow trace")
        header = text.split("\n", 1)[0]
        return _parse(text, str(path), None if "cluster" in header.split(",") else path.stem)
    except (OSError, EOFError, tarfile.TarError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: cannot read ElasticFlow trace: {exc}") from None


@lru_cache(maxsize=8)
def _load(path: Path, mtime_ns: int) -> tuple[Row, ...]:
    del mtime_ns  # cache key only
    rows = _read(path)
    if not rows:
        raise WorkloadError(f"{path}: the trace has no job")
    return tuple(sorted(rows))


def load_trace(trace: str, base_dir: Path) -> tuple[Row, ...]:
    """Every job of the trace, sorted by (submission time, cluster, row)."""
    path = EMBEDDED_FILE if trace == EMBEDDED else resolve_path(trace, base_dir)
    return _load(path, file_version(path, "ElasticFlow trace"))


class Windows:
    """The chosen clusters of a trace, cut into windows of ``horizon`` seconds."""

    def __init__(self, rows: tuple[Row, ...], clusters: tuple[str, ...], start: float, horizon: float) -> None:
        if clusters:
            known = {r.cluster for r in rows}
            unknown = sorted(set(clusters) - known)
            if unknown:
                raise WorkloadError(f"clusters: {unknown} not in the trace; it has {', '.join(sorted(known))}")
            wanted = set(clusters)
            rows = tuple(r for r in rows if r.cluster in wanted)
        self.rows = rows
        self.times = [r.submission for r in rows]
        self.span = self.times[-1] + 1
        if start >= self.span:
            raise WorkloadError(f"start: {start:g}s is past the end of the trace ({self.span}s)")
        self.start = start
        self.horizon = horizon
        self.count = max(1, int(self.span // horizon))

    def _slice(self, lo: float, hi: float, shift: float) -> list[TraceJob]:
        a, b = bisect.bisect_left(self.times, lo), bisect.bisect_left(self.times, hi)
        return [
            TraceJob(f"{NAME}:{r.cluster}:{r.row}", r.submission - lo + shift, float(r.duration), r.gpus)
            for r in self.rows[a:b]
        ]

    def __call__(self, index: int) -> list[TraceJob]:
        lo = (self.start + index * self.horizon) % self.span
        hi = lo + self.horizon
        jobs = self._slice(lo, min(hi, self.span), 0.0)
        if hi > self.span:  # wrap around the end of the trace
            jobs.extend(self._slice(0.0, min(hi - self.span, lo), self.span - lo))
        return jobs


class ElasticFlowJobs:
    """The ``elasticflow`` job source (see the module docstring)."""

    config_type = ElasticFlowConfig

    def build(self, config: ElasticFlowConfig, request: JobRequest) -> list[TraceJob]:
        windows = Windows(load_trace(config.trace, request.base_dir), config.clusters, config.start, request.horizon)
        return overlay_windows(windows, windows.count, request)


JOB_SOURCES.register(NAME, ElasticFlowJobs())

__all__ = ["NAME", "ElasticFlowConfig", "ElasticFlowJobs", "Row", "Windows", "load_trace"]
