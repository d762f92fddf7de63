"""``spotgpu soak --duration D --seed N``: random lend/return cycles with seeded random faults on
the node harness of ``spotgpu node-e2e`` (real containerd, runc, agent, guard, fd holder), the
node's invariants checked after every cycle; stops at the first violation (root). See
docs/reliability.md.

Side effects: everything :class:`spotgpu.e2e.node.Node` starts, under a private directory in
``/tmp`` (removed at the end; kept with every log after a violation or with ``--keep``); one line
per cycle on stderr; the result as JSON on stdout (``--json``: only the JSON object; ``--out
FILE``: also into FILE). Exit status 0 without violations, 1 with one, 2 when the machine cannot
run it.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from spotgpu.bench import env
from spotgpu.cli.node_e2e import check_machine, new_node, node_settings, say


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", default="10m", help="how long to soak: 90s, 10m, 1h (default 10m)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the fault schedule (default 7)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result on stdout")
    parser.add_argument("--spot-containers", type=int, default=2, help="spot containers per cycle (default 2)")
    parser.add_argument("--containerd", choices=["1.6", "2.2"], default="1.6", help="containerd (default 1.6)")
    parser.add_argument("--mode", choices=["wrapper", "nri"], default="wrapper", help="wrapper or nri (2.2)")
    parser.add_argument("--detect-interval", type=float, default=0.2, help="agent detectInterval, s (default 0.2)")
    parser.add_argument("--max-inactive", type=float, default=0.6, help="agent maxInactiveTime, s (default 0.6)")
    parser.add_argument("--fail-open", type=float, default=5.0, help="guard failOpenTimeout, s (default 5)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--out", type=Path, help="also write the JSON object to this file")


def _invalid(args: argparse.Namespace) -> str | None:
    from spotgpu.e2e.soak import parse_duration

    try:
        parse_duration(args.duration)
    except ValueError as exc:
        return f"--duration: {exc}"
    if args.spot_containers < 1:
        return "--spot-containers >= 1"
    if args.mode == "nri" and args.containerd == "1.6":
        return "containerd 1.6 has no NRI: --mode nri needs --containerd 2.2"
    return None


def _unmount_below(base: Path) -> int:
    """Lazily unmount what is still mounted below ``base`` after the node closed (sandbox
    ``shm`` mounts containerd left behind); returns how many there were."""
    import subprocess

    prefix = str(base) + "/"
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return 0
    points = [p for line in lines if (p := line.split()[4]).startswith(prefix)]
    for point in sorted(points, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    return len(points)


def run(args: argparse.Namespace) -> int:
    problem = check_machine() or _invalid(args)
    if problem:
        print(f"spotgpu soak: {problem}", file=sys.stderr)
        return 2
    from spotgpu.e2e.run import Run
    from spotgpu.e2e.soak import parse_duration, soak, summarize

    duration = parse_duration(args.duration)
    base, node = new_node(node_settings(args, gpus=2), "sg-soak-")
    began = time.monotonic()
    load_before = env.load_average()
    revision = env.git_revision()  # now: the code that runs (the tree may change during a long soak)
    result: dict[str, Any]
    try:
        node.start()
        say(f"node up in {time.monotonic() - began:.1f} s ({base}); soaking {duration:.0f} s, seed {args.seed}")
        outcome, invariants = soak(Run(node, say), duration, args.seed, say)
        result = summarize(outcome, invariants, duration, args.seed)
    except Exception as exc:
        logging.getLogger("spotgpu.e2e").exception("soak aborted")
        say(f"agent log tail:\n{node.agent.log_tail(40)}")
        result = {"error": f"{type(exc).__name__}: {exc}", "violations": [f"aborted: {exc}"]}
    finally:
        node.close()
        left = _unmount_below(base)
    result["mounts_left_at_close"] = left
    result["wall_s"] = round(time.monotonic() - began, 1)
    result["node"] = {"launcher": "cri", "containerd": args.containerd, "mode": args.mode}
    result["settings"] = {
        "spot_containers": args.spot_containers,
        "detect_interval_s": args.detect_interval,
        "max_inactive_time_s": args.max_inactive,
        "fail_open_timeout_s": args.fail_open,
    }
    result["environment"] = env.environment(background_load=0, load_before=load_before, load_after=env.load_average())
    result["environment"]["git"] = revision
    ok = not result["violations"]
    result["passed"] = ok
    for line in result["violations"]:
        say(f"VIOLATION {line}")
    if args.keep or not ok:
        say(f"work directory kept (logs): {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    text = json.dumps(result, indent=2, sort_keys=True)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(json.dumps(result, sort_keys=True) if args.json else text)
    return 0 if ok else 1
