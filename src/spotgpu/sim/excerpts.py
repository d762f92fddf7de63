"""Build (or check) the trace excerpts shipped in ``spotgpu/sim/data/``.

Side effects: reads the public traces named below and writes (or compares) the two
compressed CSV files of the package's data folder. Run from a checkout::

    python -m spotgpu.sim.excerpts --helios ../shared/data/helios-earth \\
        --elasticflow ../shared/data/elasticflow/raw-traces.tar.gz [--check]

What is kept (the rest of each trace is dropped; the licenses and attribution are in
``data/NOTICE.md``):

* ``helios-earth-2020-05.csv.gz``: for each of the four Helios Earth virtual clusters
  (teams), the columns ``team,time,total_gpu_num,idle_gpu_num`` of ``cluster_sequence_vc.csv``
  at every minute where one of the two numbers changes, plus the last minute (so the series'
  end is known). The step function is exactly the original one-row-per-minute series.
* ``elasticflow-2021.csv.gz``: every job of the ten ElasticFlow clusters as
  ``cluster,row,submission_time,duration,num_gpu`` (the random ``job_id`` column is replaced by
  the row number in its cluster file, which identifies the job just as well).

Files are written with a zero gzip timestamp so that rebuilding gives identical bytes and
``--check`` can compare them.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

DATA_DIR: Final = Path(__file__).parent / "data"
HELIOS_FILE: Final = "helios-earth-2020-05.csv.gz"
ELASTICFLOW_FILE: Final = "elasticflow-2021.csv.gz"
HELIOS_TEAMS: Final = ("vc3sl", "vc6YE", "vc8Sj", "vcJLV")


def helios_excerpt(helios_dir: Path) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["team", "time", "total_gpu_num", "idle_gpu_num"])
    for team in HELIOS_TEAMS:
        with (helios_dir / team / "cluster_sequence_vc.csv").open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        prev: tuple[str, str] | None = None
        for i, row in enumerate(rows):
            value = (row["total_gpu_num"], row["idle_gpu_num"])
            if value != prev or i == len(rows) - 1:
                writer.writerow([team, row["time"], *value])
                prev = value
    return gzip.compress(out.getvalue().encode(), mtime=0)


def _elasticflow_members(path: Path) -> Iterator[tuple[str, str]]:
    with tarfile.open(path, "r:gz") as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            name = Path(member.name).name
            if member.isfile() and name.startswith("cluster") and name.endswith(".csv"):
                fh = tar.extractfile(member)
                if fh is not None:
                    yield name.removesuffix(".csv"), fh.read().decode()


def elasticflow_excerpt(tarball: Path) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["cluster", "row", "submission_time", "duration", "num_gpu"])
    for cluster, text in _elasticflow_members(tarball):
        for row_no, row in enumerate(csv.DictReader(io.StringIO(text))):
            writer.writerow([cluster, row_no, row["submission_time"], row["duration"], row["num_gpu"]])
    return gzip.compress(out.getvalue().encode(), mtime=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spotgpu.sim.excerpts", description=__doc__.split("\n")[0])
    parser.add_argument("--helios", type=Path, required=True, help="the helios-earth folder (one folder per team)")
    parser.add_argument("--elasticflow", type=Path, required=True, help="ElasticFlow's raw-traces.tar.gz")
    parser.add_argument("--out", type=Path, default=DATA_DIR, help=f"where to write (default: {DATA_DIR})")
    parser.add_argument("--check", action="store_true", help="compare with the files there instead of writing")
    args = parser.parse_args(argv)
    built = {HELIOS_FILE: helios_excerpt(args.helios), ELASTICFLOW_FILE: elasticflow_excerpt(args.elasticflow)}
    stale = []
    for name, data in built.items():
        target = args.out / name
        if args.check:
            if not target.exists() or target.read_bytes() != data:
                stale.append(name)
        else:
            target.write_bytes(data)
            print(f"wrote {target} ({len(data)} bytes)")
    if stale:
        print(f"stale excerpts (rebuild without --check): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
