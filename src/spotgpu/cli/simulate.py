"""``spotgpu simulate``: what lending idle reserved GPUs would win and cost, on traces.

Side effects: reads the scenario file and traces, forks worker processes (one policy each),
writes the progress display to stderr, the summary table or JSON to stdout and, with
``--out``, report files. Exit status: 0 done; 2 bad scenario or arguments (the message names
the key; every input, the ``--out`` folder and the run's size are checked before the run starts);
3 an invariant broke during the run (the message says which, where and when); 1 the report files
could not be written after the run (the table or JSON is printed first).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spotgpu.sim.progress import Progress
    from spotgpu.sim.runner import SimulationResult
    from spotgpu.sim.scenario import PolicySpec, Scenario

EXIT_BAD_INPUT = 2
EXIT_INVARIANT = 3
EXIT_WRITE = 1


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number greater than 0, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Replay reserved owners' activity and spot/reserved job traces through spotgpu's scheduler and "
        "lending policy, once per policy, and compare: the useful spot GPU-hours each policy gains over not "
        "lending, spot work lost to evictions, reclaimed GPU-hours, "
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
    parser.add_argument(
        "--policies",
        help="comma-separated policy names to run (default: all of the scenario's; include the baseline for "
        "the useful gain)",
    )
    parser.add_argument("--out", type=Path, help="write summary.json, report.html and PNG plots into this folder")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    parser.add_argument(
        "--workers", type=_positive_int, help="parallel worker processes, one policy each (default: CPUs available)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    parser.add_argument(
        "--force", action="store_true", help="run even when the run's estimated memory exceeds what is available"
    )
    parser.add_argument(
        "--exact-snapshots",
        action="store_true",
        help="give the scheduler the whole cluster every cycle instead of trimmed snapshots (slow on large clusters)",
    )


def _writable_folder(out: Path) -> str | None:
    """Why ``out`` cannot take the report files, or None (it exists as a writable folder afterwards)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except FileExistsError:
        return f"--out {out}: exists and is not a folder"
    except OSError as exc:
        return f"--out {out}: cannot write there: {exc.strerror or exc}"
    return None


def _memory_available_mb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _size_check(args: argparse.Namespace, scenario: Scenario, policies: int, workers: int) -> str | None:
    """Warn (stderr) about a run that takes long; the refusal of one that cannot fit in memory, or None."""
    from spotgpu.sim.estimate import SLOW_S, estimate
    from spotgpu.sim.table import duration

    guess = estimate(nodes=scenario.cluster.nodes, hours=scenario.duration / 3600, policies=policies, workers=workers)
    size = f"{scenario.cluster.nodes:,} nodes x {scenario.duration / 3600:g} h x {policies} policies"
    available = _memory_available_mb()
    if available is not None and guess.memory_mb > available and not args.force:
        return (
            f"{size} needs about {guess.memory_mb / 1024:,.1f} GiB of memory on {min(workers, policies)} worker(s), "
            f"{available / 1024:,.1f} GiB available: fewer --nodes, --days or --workers (or --force)"
        )
    if guess.wall_s > SLOW_S:
        print(
            f"spotgpu simulate: warning: {size} on {min(workers, policies)} worker(s) takes about "
            f"{duration(guess.wall_s)} or more (estimated from a measured 5,000-node run); Ctrl-C stops it",
            file=sys.stderr,
        )
    return None


def _inputs(args: argparse.Namespace) -> tuple[Scenario, tuple[PolicySpec, ...]]:
    from spotgpu.sim.runner import select_policies
    from spotgpu.sim.scenario import default_scenario, scenario_argument

    scenario = scenario_argument(args.scenario) if args.scenario else default_scenario()
    scenario = scenario.resized(
        nodes=args.nodes, duration=None if args.days is None else args.days * 86400.0, seed=args.seed
    )
    names = None if args.policies is None else [n.strip() for n in args.policies.split(",") if n.strip()]
    return scenario, select_policies(scenario, names)


def _refuse(message: str) -> int:
    print(f"spotgpu simulate: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def run(args: argparse.Namespace) -> int:
    from spotgpu.core.errors import ValidationError
    from spotgpu.sim.invariants import InvariantViolation
    from spotgpu.sim.progress import Progress
    from spotgpu.sim.runner import default_workers, simulate
    from spotgpu.sim.state import Hooks

    try:
        scenario, policies = _inputs(args)
    except ValidationError as exc:
        return _refuse(str(exc))
    workers = args.workers or default_workers()
    problem = _writable_folder(args.out) if args.out is not None else None
    problem = problem or _size_check(args, scenario, len(policies), workers)
    if problem is not None:
        return _refuse(problem)
    progress = None if args.no_progress else Progress([p.name for p in policies], sys.stderr)
    try:
        result = simulate(
            scenario, policies, workers=workers, progress=progress, hooks=Hooks(trim_snapshots=not args.exact_snapshots)
        )
    except InvariantViolation as exc:
        return _failed(progress, f"FAILED: {exc}", EXIT_INVARIANT)
    except ValidationError as exc:
        return _failed(progress, str(exc), EXIT_BAD_INPUT)
    if progress is not None:
        progress.close()
    return _present(args, result)


def _failed(progress: Progress | None, message: str, code: int) -> int:
    if progress is not None:
        progress.close()
    print(f"spotgpu simulate: {message}", file=sys.stderr)
    return code


def _present(args: argparse.Namespace, result: SimulationResult) -> int:
    """Print the table or JSON first, then write the files: a failing write loses no figure."""
    from spotgpu.sim.report import write_outputs
    from spotgpu.sim.table import summary_table

    summary = result.summary()
    for warning in summary["scenario"]["warnings"]:  # type: ignore[index]
        print(f"spotgpu simulate: warning: {warning}", file=sys.stderr)
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(summary_table(summary))
    sys.stdout.flush()
    if args.out is not None:
        try:
            written = write_outputs(result, args.out)
        except OSError as exc:
            print(f"spotgpu simulate: --out {args.out}: cannot write the report: {exc}", file=sys.stderr)
            return EXIT_WRITE
        except ModuleNotFoundError as exc:
            if exc.name != "matplotlib":
                raise
            print(
                "spotgpu simulate: --out draws its plots with matplotlib, which is not installed "
                "(the plot extra: pip install 'spotgpu[plot]')",
                file=sys.stderr,
            )
            return EXIT_WRITE
        print(f"wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    return 0
