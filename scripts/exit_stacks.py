"""Sample the kernel stacks of spot processes blocked (state D) while they exit: where an exit waits.

Run as root while the node e2e runs, then commit its JSON (docs/results/exit-stacks-*.json)::

    python scripts/exit_stacks.py 100 "$(git rev-parse HEAD)" > stacks.json &
    spotgpu node-e2e --spot-containers 8 --cycles 10

Every ~1 ms it lists ``/proc``; for each process named ``sleep`` (the e2e's spot containers) in
state D it reads ``/proc/<pid>/stack`` and counts that stack. A SIGKILLed spot process in state D
is inside its exit, so the stacks say what its exit waits for. The sampler is itself a busy
process (about a third of a core on a 2-core machine): read the counts, not the hold figures of
the run beside it.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import platform
import sys
import time


def sample(seconds: float, comm: str = "sleep") -> collections.Counter[str]:
    stacks: collections.Counter[str] = collections.Counter()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2]
                if state == "D" and name == comm:
                    with open(f"/proc/{entry}/stack") as f:
                        stacks[f.read()] += 1
            except (OSError, ValueError):
                continue  # gone meanwhile
        time.sleep(0.001)
    return stacks


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    stacks = sample(float(argv[0]))
    doc = {
        "command": f"python scripts/exit_stacks.py {argv[0]} REV"
        " during spotgpu node-e2e --spot-containers 8 --cycles 10",
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()}-vCPU machine of the CI kind, kernel {platform.release()}",
        "revision": argv[1],
        "samples": sum(stacks.values()),
        "stacks": [
            {"count": n, "frames": [line.split("] ", 1)[-1] for line in text.splitlines()]}
            for text, n in stacks.most_common()
        ],
    }
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
