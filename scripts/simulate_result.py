"""Run ``spotgpu simulate ARGS --json --no-progress`` and write it as a docs/results file.

Usage: ``python scripts/simulate_result.py docs/results/simulate-NAME.json [simulate args...]``
(with the project's virtual environment active, so that ``spotgpu`` is on PATH). The file holds
the command, the date, the machine, the load average before and after, the wall time and peak
RSS of the run, the git revision (dirty: any tracked change outside docs/results) and the
simulator's summary under ``summary``; the summary is deterministic, the rest is not.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time


def _load() -> str:
    with open("/proc/loadavg") as f:
        return ", ".join(f.read().split()[:3])


def _git() -> dict[str, object]:
    rev = subprocess.run(["git", "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    status = ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/results"]
    dirty = bool(subprocess.run(status, check=True, capture_output=True, text=True).stdout.strip())
    return {"revision": rev, "dirty": dirty}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out, args = argv[0], argv[1:]
    cmd = ["spotgpu", "simulate", *args, "--json", "--no-progress"]
    before = _load()
    start = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    doc = {
        "command": " ".join(cmd),
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()}-vCPU machine, kernel {platform.release()}, Python {platform.python_version()}",
        "git": _git(),
        "load_average_before_after": [before, _load()],
        "wall_s_measured": round(wall, 2),
        "peak_rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        "note": "policies, scenario and notes are deterministic (a function of the code, the scenario and the "
        "seed); wall_seconds, profile and the wall/RSS figures depend on the machine",
        "summary": json.loads(run.stdout),
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{out}: {wall:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
