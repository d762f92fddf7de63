"""``spotgpu guard-holder``: run the return guard's fd holder (see :mod:`spotgpu.guard.holder`).

Side effects: the holder's sockets and notify fds, its readiness file; signal handlers for
SIGTERM/SIGINT. Deploy it as its own DaemonSet (same hostPath for the sockets as the agent), with
``maxSurge: 1, maxUnavailable: 0`` so that a new holder starts, takes every fd over from the old
one and only then is the old one stopped (docs/guard.md, "Handover").

Signals: the first SIGTERM/SIGINT asks the holder to exit once nothing depends on it alone (a
successor took its fds) or after ``handoverTimeout``; a second one exits at once.
"""

from __future__ import annotations

import argparse
import logging
import resource
import signal
from pathlib import Path
from types import FrameType

from spotgpu.core.config import GuardConfig
from spotgpu.core.configfile import ConfigError, load_yaml_file
from spotgpu.guard.gate import ReleaseGate

log = logging.getLogger("spotgpu.guard.holder")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = GuardConfig()
    parser.add_argument("--config", type=Path, help="agent configuration file (YAML, section 'agent', key 'guard')")
    parser.add_argument("--listener", type=Path, help=f"seccomp listener socket (default {defaults.listener_path})")
    parser.add_argument("--control", type=Path, help=f"control socket for the guard (default {defaults.holder_path})")
    parser.add_argument(
        "--guard-timeout",
        type=float,
        help=f"seconds of guard silence before taking the fds back (default {defaults.holder_timeout:g})",
    )
    parser.add_argument(
        "--handover-timeout",
        type=float,
        help=f"seconds a stopping holder waits for a successor to take its fds (default {defaults.handover_timeout:g})",
    )
    parser.add_argument(
        "--runtime", help=f"runc binary to check (default {defaults.runtime_binary!r}; '' skips the check)"
    )
    parser.add_argument(
        "--ready-file",
        type=Path,
        help="written once this holder serves (after taking over from a running holder, if any), removed at "
        "exit: for a readiness probe (`cat FILE`); put it on the container's own filesystem, not the hostPath",
    )
    parser.add_argument(
        "--cgroup-root",
        action="append",
        dest="cgroup_roots",
        help="pod cgroup root walked by the release check before this holder releases an owner's call itself "
        "(repeatable; default the config's agent.eviction.releaseCheck.cgroupRoots, else kubepods.slice and kubepods)",
    )
    parser.add_argument(
        "--no-release-check",
        action="store_true",
        help="release owner calls without first killing other pods' holders of the owner's GPUs (earlier behaviour)",
    )
    parser.add_argument(
        "--no-inherit",
        action="store_true",
        help="do not take over from a holder already running on the control socket (it keeps its fds)",
    )


def _config(args: argparse.Namespace) -> GuardConfig:
    base = GuardConfig()
    if args.config is not None:
        from spotgpu.core.config import AgentConfig

        base = load_yaml_file(args.config, AgentConfig, section="agent").guard
    return GuardConfig(
        enabled=base.enabled,
        listener_path=args.listener or base.listener_path,
        holder_path=args.control or base.holder_path,
        fail_open_timeout=base.fail_open_timeout,
        holder_timeout=base.holder_timeout if args.guard_timeout is None else args.guard_timeout,
        runtime_binary=base.runtime_binary if args.runtime is None else args.runtime,
        handover_timeout=base.handover_timeout if args.handover_timeout is None else args.handover_timeout,
    )


def _gate(args: argparse.Namespace) -> ReleaseGate | None:
    """The release check the holder runs before it releases an owner's call by itself."""
    if args.no_release_check:
        return None
    from spotgpu.adapters.holderscan import HolderScanner
    from spotgpu.adapters.ownerclear import OwnerClearer
    from spotgpu.core.config import AgentConfig, ReleaseCheckConfig

    roots = ReleaseCheckConfig().cgroup_roots
    if args.config is not None:
        roots = load_yaml_file(args.config, AgentConfig, section="agent").eviction.release_check.cgroup_roots
    return OwnerClearer(HolderScanner(args.cgroup_roots or roots))


def _raise_fd_limit() -> None:
    """One fd per owner container plus one per live ``runc exec``: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run(args: argparse.Namespace) -> int:
    from spotgpu.guard.holder import FdHolder
    from spotgpu.guard.support import probe

    try:
        config = _config(args)
        gate = _gate(args)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    _raise_fd_limit()
    support = probe(config.runtime_binary)
    holder = FdHolder(
        config.listener_path,
        config.holder_path,
        support,
        guard_timeout=config.holder_timeout,
        handover_timeout=config.handover_timeout,
        inherit=not args.no_inherit,
        ready_file=args.ready_file,
        gate=gate,
    )
    asked = 0

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        nonlocal asked
        asked += 1
        if asked > 1:
            holder.stop()
        else:
            holder.request_exit()

    # Before start(): a SIGTERM while taking over from a predecessor is then a request like any
    # other (the loop decides when to leave), never a kill in the middle of the handover.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        holder.start()
    except OSError as exc:
        log.error("cannot open the holder's sockets: %s", exc)
        holder.close()
        return 1
    try:
        holder.serve()  # returns once stopped
    finally:
        holder.close()
    return 0
