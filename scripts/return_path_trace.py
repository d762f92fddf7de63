"""Summarise a scheduler trace of owner returns (docs/results/return-path-trace-*.json).

Record while the node e2e runs, then summarise (root; tracefs mounted at /sys/kernel/tracing)::

    perf record -e sched:sched_switch,sched:sched_wakeup,sched:sched_process_exit,signal:signal_generate \\
        -a -o sched.data &
    spotgpu node-e2e --spot-containers 8 --cycles 3 --background-load 2
    kill -INT %1; perf script -i sched.data > sched.txt
    python scripts/return_path_trace.py sched.txt "$(git rev-parse HEAD)" > docs/results/return-path-trace-DATE.json

(a third argument names the node-e2e arguments when they differ from the ones above).

A return is the SIGKILLs of spot processes (``comm=sleep``, the e2e's spot containers) within 50
ms of each other; times are milliseconds from its first SIGKILL: the owner's call waking the
guard's thread (a real-time thread, priority 89 in the trace), each victim's signal, its exit
tracepoint, its first block in state D and its exit complete (state Z: its pidfd readable), the
guard's release waking the owner (``e2eclient``) and the owner's thread running again.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import sys
from typing import Any

LINE = re.compile(r"^\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+([\w:]+):\s*(.*)$")
Row = tuple[float, str, int, str, str]


def read(path: str) -> list[Row]:
    rows: list[Row] = []
    with open(path, errors="replace") as f:
        for raw in f:
            m = LINE.match(raw)
            if m:
                rows.append((float(m.group(4)), m.group(1), int(m.group(2)), m.group(5), m.group(6)))
    return rows


def returns(rows: list[Row]) -> list[list[tuple[float, int]]]:
    kills = sorted(
        (ts, int(m.group(1)))
        for ts, _, _, ev, args in rows
        if ev == "signal:signal_generate" and "sig=9" in args and "comm=sleep" in args
        for m in [re.search(r" pid=(\d+)", args)]
        if m
    )
    groups: list[list[tuple[float, int]]] = []
    for ts, pid in kills:
        if groups and ts - groups[-1][0][0] < 0.05:
            groups[-1].append((ts, pid))
        else:
            groups.append([(ts, pid)])
    return groups


def victim(rows: list[Row], t0: float, signalled: float, pid: int) -> dict[str, float | None]:
    exited = blocked = zombie = None
    for ts, _, _, ev, args in rows:
        if not t0 <= ts <= t0 + 0.2:
            continue
        if ev == "sched:sched_process_exit" and f" pid={pid} " in args + " " and exited is None:
            exited = ts
        if ev == "sched:sched_switch" and f"prev_pid={pid} " in args:
            m = re.search(r"prev_state=(\S+)", args)
            state = m.group(1) if m else ""
            if state == "D" and blocked is None:
                blocked = ts
            if state.startswith("Z") and zombie is None:
                zombie = ts
    ms = _relative(t0)
    return {
        "pid": pid,
        "signalled_ms": ms(signalled),
        "exit_tracepoint_ms": ms(exited),
        "first_blocked_D_ms": ms(blocked),
        "zombie_ms": ms(zombie),
    }


def _relative(t0: float) -> Any:
    return lambda t: None if t is None else round((t - t0) * 1000, 3)


def summarise(rows: list[Row], group: list[tuple[float, int]]) -> dict[str, Any]:
    t0 = group[0][0]
    call = woken = on_cpu = None
    for ts, comm, _, ev, args in rows:
        if not t0 - 0.02 <= ts <= t0 + 0.2:
            continue
        if ev == "sched:sched_wakeup" and comm == "e2eclient" and ts < t0 and "prio=89" in args:
            call = ts
        if ev == "sched:sched_wakeup" and "comm=e2eclient" in args and ts > t0 and woken is None:
            woken = ts
        if woken and on_cpu is None and ev == "sched:sched_switch" and "next_comm=e2eclient" in args and ts >= woken:
            on_cpu = ts
    victims = [victim(rows, t0, ts, pid) for ts, pid in group]
    ms = _relative(t0)
    return {
        "first_sigkill_s": round(t0, 6),
        "owner_call_ms": ms(call),
        "victims": victims,
        "last_zombie_ms": max(v["zombie_ms"] or 0 for v in victims),
        "owner_woken_ms": ms(woken),
        "owner_on_cpu_ms": ms(on_cpu),
    }


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    rows = read(argv[0])
    run = argv[2] if len(argv) == 3 else "--spot-containers 8 --cycles 3 --background-load 2"
    doc = {
        "command": "perf record -e sched:sched_switch,sched:sched_wakeup,sched:sched_process_exit,"
        f"signal:signal_generate -a -- (during) spotgpu node-e2e {run}; perf script; "
        "python scripts/return_path_trace.py",
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()}-vCPU machine of the CI kind, kernel {platform.release()}; nothing else running "
        "but the run and perf",
        "revision": argv[1],
        "note": "first_sigkill_s: the trace clock of the group's first SIGKILL (SIGKILLs more than 50 ms apart "
        "make two groups); owner_call_ms: the owner's GPU call waking the guard's thread; zombie_ms: the victim's exit "
        "complete (its pidfd readable); owner_woken_ms: the guard's release waking the owner; owner_on_cpu_ms: "
        "the owner's thread running again",
        "returns": [summarise(rows, g) for g in returns(rows)],
    }
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
