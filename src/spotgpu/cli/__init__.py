"""The ``spotgpu`` command line: one program, one subcommand per job.

Each subcommand lives in its own module (``spotgpu.cli.<name>`` or a module named in
:data:`COMMANDS`) that defines ``add_arguments(parser)`` and ``run(args) -> int``. Only the
chosen subcommand's module is imported, so ``spotgpu --help`` and quick commands stay fast and
a subcommand's heavy dependencies (gRPC, matplotlib, the Kubernetes client) load only when used.

The production image (``deploy/Dockerfile``) leaves out the test and measurement packages
(:mod:`spotgpu.testing`, :mod:`spotgpu.e2e`, :mod:`spotgpu.bench`); the subcommands that need them
(``bench``, ``node-e2e``) import them only when they run, name them in :attr:`Command.needs`, and
without them exit with status 2 and say so. Every other subcommand works without them
(import-linter contracts in ``pyproject.toml``; ``tests/test_structure.py`` runs them with those
packages unimportable).

Side effects: whatever the chosen subcommand does; this module only parses arguments.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Protocol, cast

from spotgpu import __version__


class CommandModule(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


@dataclass(frozen=True, slots=True)
class Command:
    module: str
    help: str
    needs: tuple[str, ...] = ()
    """Packages outside the production image that the subcommand imports when it runs."""


COMMANDS: dict[str, Command] = {
    "simulate": Command("spotgpu.cli.simulate", "replay cluster traces: what would lending idle GPUs win and cost"),
    "agent": Command("spotgpu.cli.agent", "run the node agent (device plugin, detection, lending, guard)"),
    "scheduler": Command("spotgpu.cli.scheduler", "run the gang scheduler with the spot plugin against a cluster"),
    "status": Command("spotgpu.cli.status", "show nodes (GPUs, lent, owners) and queues of a cluster"),
    "gangjob": Command("spotgpu.cli.gangjob", "submit and inspect GangJobs"),
    "bench": Command(
        "spotgpu.cli.bench",
        "run a benchmark and print its figures as JSON",
        needs=("spotgpu.bench", "spotgpu.testing"),
    ),
    "node-e2e": Command(
        "spotgpu.cli.node_e2e",
        "run the full lend/return cycle on this machine (root)",
        needs=("spotgpu.e2e", "spotgpu.bench", "spotgpu.testing"),
    ),
    "soak": Command(
        "spotgpu.cli.soak",
        "lend/return cycles with seeded random faults and the node's invariants after each (root)",
        needs=("spotgpu.e2e", "spotgpu.bench", "spotgpu.testing"),
    ),
    "guard-holder": Command("spotgpu.cli.guard_holder", "run the guard's notify-fd holder process"),
}


def stop_on_signals(log: logging.Logger) -> threading.Event:
    """An event set on SIGTERM or SIGINT (long-running commands wait on it to shut down cleanly)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    """``-v``: the operator commands' log lines (every HTTP request, retries); quiet without it."""
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log every API request and retry on stderr (default: quiet)"
    )


def quiet_unless_verbose(args: argparse.Namespace) -> None:
    """An operator command prints its answer and its errors; log lines (the HTTP client logs every
    request at INFO) only with ``-v``, at ``--log-level``."""
    if not args.verbose:
        logging.getLogger().setLevel(max(logging.WARNING, logging.getLogger().level))


def _load(name: str) -> CommandModule:
    return cast(CommandModule, importlib.import_module(COMMANDS[name].module))


def missing_packages(name: str) -> list[str]:
    """The packages subcommand ``name`` needs that this installation lacks (the production image
    has no test or measurement packages)."""
    missing = []
    for package in COMMANDS[name].needs:
        try:
            found = importlib.util.find_spec(package) is not None
        except ImportError:
            found = False
        if not found:
            missing.append(package)
    return missing


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    """The parser; only the subcommand ``load`` gets its own arguments (and module import)."""
    parser = argparse.ArgumentParser(
        prog="spotgpu",
        description="Lend idle reserved GPUs to spot jobs on Kubernetes; take them back before the owner notices.",
    )
    parser.add_argument("--version", action="version", version=f"spotgpu {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log verbosity on stderr (default: INFO)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        sp = sub.add_parser(name, help=command.help, description=command.help)
        if name == load:
            module = _load(name)
            module.add_arguments(sp)
            sp.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in args_list if a in COMMANDS), None)
    missing = missing_packages(chosen) if chosen is not None else []
    if missing:
        print(
            f"spotgpu {chosen}: not part of this installation (no {', '.join(missing)}; the production "
            "image leaves out the test and measurement packages: install spotgpu from source)",
            file=sys.stderr,
        )
        return 2
    try:
        parser = build_parser(load=chosen)
    except ImportError as exc:  # a subcommand whose optional dependency is missing
        print(f"spotgpu {chosen}: cannot load: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(args_list)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    run = cast(Callable[[argparse.Namespace], int], args._run)
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130


__all__ = [
    "COMMANDS",
    "Command",
    "add_verbose_argument",
    "build_parser",
    "main",
    "missing_packages",
    "quiet_unless_verbose",
    "stop_on_signals",
]
