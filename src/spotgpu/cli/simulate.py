"""``spotgpu simulate``: what lending idle reserved GPUs would win and cost, on traces.

Side effects: reads the scenario file and traces, forks worker processes (one policy each),
writes the progress display to stderr, the summary table or JSON to stdout and, with
``--out``, report files. Exit status: 0 done; 2 bad scenario or arguments (the message names
the key); 3 an invariant broke during the run (the message says which, where and when).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2
EXIT_INVARIANT = 3


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Replay reserved owners' activity and spot/reserved job traces through spotgpu's scheduler and "
        "lending policy, once per policy, and compare: reclaimed GPU-hours, spot work lost to evictions, "
        "spot waiting and completion times, and what owners feel on return. Without arguments it runs the "
        "embedded default scenario (trace excerpts shipped with spotgpu)."
    )
    parser.add_argument(
        "--scenario",
        help="scenario YAML file, or the name of an embedded one: default (the default), bursty (owners that come "
        "and go every few minutes)",
    )
    parser.add_argument("--nodes", type=_positive_int, help="resize the cluster (groups given as shares scale)")
    parser.add_argument("--days", type=_positive_float, help="simulated days (overrides the scenario's duration)")
    parser.add_argument("--seed", type=int, help="override the scenario's seed")
    parser.add_argument("--policies", help="comma-separated policy names to run (default: all of the scenario's)")
    parser.add_argument("--out", type=Path, help="write summary.json, report.html and PNG plots into this folder")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    parser.add_argument(
        "--workers", type=_positive_int, help="parallel worker processes, one policy each (default: CPUs available)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    parser.add_argument(
        "--exact-snapshots",
        action="store_true",
        help="give the scheduler the whole cluster every cycle instead of trimmed snapshots (slow on large clusters)",
    )


def run(args: argparse.Namespace) -> int:
    from spotgpu.core.errors import ValidationError
    from spotgpu.sim.invariants import InvariantViolation
    from spotgpu.sim.progress import Progress
    from spotgpu.sim.report import summary_table, write_outputs
    from spotgpu.sim.runner import default_workers, select_policies, simulate
    from spotgpu.sim.scenario import default_scenario, scenario_argument
    from spotgpu.sim.simulation import Hooks

    try:
        scenario = scenario_argument(args.scenario) if args.scenario else default_scenario()
        scenario = scenario.resized(
            nodes=args.nodes, duration=None if args.days is None else args.days * 86400.0, seed=args.seed
        )
        names = [n.strip() for n in args.policies.split(",") if n.strip()] if args.policies else None
        policies = select_policies(scenario, names)
    except ValidationError as exc:
        print(f"spotgpu simulate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    progress = None if args.no_progress else Progress([p.name for p in policies], sys.stderr)
    try:
        result = simulate(
            scenario,
            policies,
            workers=args.workers or default_workers(),
            progress=progress,
            hooks=Hooks(trim_snapshots=not args.exact_snapshots),
        )
    except InvariantViolation as exc:
        if progress is not None:
            progress.close()
        print(f"spotgpu simulate: FAILED: {exc}", file=sys.stderr)
        return EXIT_INVARIANT
    except ValidationError as exc:
        if progress is not None:
            progress.close()
        print(f"spotgpu simulate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if progress is not None:
        progress.close()
    summary = result.summary()
    for warning in summary["scenario"]["warnings"]:  # type: ignore[index]
        print(f"spotgpu simulate: warning: {warning}", file=sys.stderr)
    if args.out is not None:
        written = write_outputs(result, args.out)
        print(f"wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(summary_table(summary))
    return 0
