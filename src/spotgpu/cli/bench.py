"""``spotgpu bench <name> [ARGS]``: benchmarks that print one JSON object with their figures.

Each benchmark is a module ``spotgpu.bench.<name>`` with ``add_arguments(parser)`` and
``run(args) -> int`` (the same shape as a CLI subcommand); only the chosen one is imported,
and it parses its own arguments. Speed and memory targets live in these benchmarks, never in
timed unit tests.
"""

from __future__ import annotations

import argparse
import importlib
from typing import cast

from spotgpu.cli import CommandModule

BENCHMARKS: dict[str, str] = {
    "scheduler": "one scheduling cycle on a synthetic cluster: throughput, victim selection, memory",
    "agent": "owner-busy to all spot tasks stopped, through a real containerd (root)",
    "runtime": "spotgpu-runtime's added latency on ctr run / kill, or through CRI with --cri (root)",
    "guard": "the return guard's cost per ioctl, notifications per session, release latency (root)",
    "returnpath": "where an owner's hold goes under load, stage by stage; A/B of faster stops (root)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bench", metavar="BENCHMARK", choices=sorted(BENCHMARKS), help=", ".join(sorted(BENCHMARKS)))
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="the benchmark's own arguments (see --help)")
    parser.epilog = "benchmarks:\n" + "\n".join(f"  {n:<10} {h}" for n, h in BENCHMARKS.items())
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def run(args: argparse.Namespace) -> int:
    name = cast(str, args.bench)
    module = cast(CommandModule, importlib.import_module(f"spotgpu.bench.{name}"))
    parser = argparse.ArgumentParser(prog=f"spotgpu bench {name}", description=BENCHMARKS[name])
    module.add_arguments(parser)
    return module.run(parser.parse_args(cast(list[str], args.bench_args)))
