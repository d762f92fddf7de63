"""``spotgpu bench guard``: what the return guard costs the owner, and how fast it lets go.

Side effects (root): builds the stand-in GPU client with gcc, runs runc containers and the fd
holder under a private temporary directory, removes everything at the end. There is no GPU
here: the owner's "GPU" is a set of stand-in devices with /dev/null's numbers, and the calls are
NVIDIA-encoded ioctls (see :mod:`spotgpu.testing.standin`).

Figures (one JSON object on stdout; ``details`` adds the per-profile and per-session numbers,
the cost of one caught-and-continued session start for an owner that is not lent, and the
owner-back latency):

* ``unarmed_overhead_us_per_ioctl``: ordinary GPU ioctls (RM_CONTROL, UVM), per call, in a
  container with the rule minus one without, measured alternately in the same run; the median
  of the per-trial differences (the machine may be shared, so only paired figures count); the
  largest over two profiles: unconfined, and a RuntimeDefault-like profile (where the rule adds
  its 18 complement rules). Target <= 1 us.
* ``notifications_per_session``: notifications the guard receives while the stand-in client
  replays the ioctl sequence of an nvidia-smi start, a CUDA init and a PyTorch-style start
  (NVML then CUDA); the figure is the largest. Target <= 4.
* ``release_after_eviction_ms_p99``: armed owner, session call held, ``disarm()`` called (the
  agent's "eviction done"): time until the owner's ioctl returns, p99 over the iterations.
  Target <= 20 ms. Also ``owner_back_ms_p99`` (held call entered -> owner-back handler runs).

``details.handover`` (no target; the invariant is that no call fails): with the guard stopped,
so that the holder itself answers, ``--handovers`` successive holder upgrades (a successor
starts and takes over, then the old holder gets SIGTERM) while the owner container starts
sessions back to back: how long each handover took (the predecessor's request-to-commit time),
how many session calls ran meanwhile, how many failed (must be 0: an ENOSYS would mean a lost
fd), and the slowest of them, next to the slowest call of a control phase in the same run (a
Python process importing the holder is started beside the same load, without a handover).

``--background-load N`` runs every phase beside N busy-loop processes (:mod:`spotgpu.bench.env`);
``environment`` records it with the load average before and after, versions and revision.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotgpu.bench.agent import percentile  # the benchmarks' one nearest-rank percentile
from spotgpu.core.refs import ContainerRef

if TYPE_CHECKING:
    from spotgpu.guard.service import GuardService
    from spotgpu.testing.guard_testbed import HolderProcess, OwnerContainer

from spotgpu.bench import env

TARGETS = {
    "unarmed_overhead_us_per_ioctl": 1.0,
    "notifications_per_session": 4,
    "release_after_eviction_ms_p99": 20.0,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the JSON object on one line")
    parser.add_argument("--trials", type=int, default=7, help="alternating overhead trials (default 7)")
    parser.add_argument("--loop", type=int, default=200_000, help="ioctls per overhead trial (default 200000)")
    parser.add_argument("--iterations", type=int, default=200, help="held-call releases to time (default 200)")
    parser.add_argument("--handovers", type=int, default=5, help="holder upgrades under load (default 5)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    env.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0 or shutil.which("runc") is None:
        print(json.dumps({"benchmark": "guard", "error": "needs root and runc"}))
        return 2
    from spotgpu.testing.containerd import make_rootfs
    from spotgpu.testing.standin import build_probe

    logging.getLogger("spotgpu.guard").setLevel(logging.WARNING)  # one line per held call otherwise
    base = Path(tempfile.mkdtemp(prefix="sgbench-", dir="/tmp"))
    before = env.load_average()
    try:
        rootfs = make_rootfs(base / "rootfs", [(build_probe(base / "probe"), "/bin/guardprobe")])
        with env.background_load(args.background_load):
            result = _measure(base, rootfs, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result["environment"] = env.environment(
        background_load=args.background_load,
        load_before=before,
        load_after=env.load_average(),
        containerd_binaries=args.containerd_binary,
        note="stand-in devices (no GPU); overhead is a paired difference measured in the same run",
    )
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 1 if args.check and not all(result["met"].values()) else 0


@dataclass(slots=True)
class _Bed:
    """The guard, its fd holder(s) and four owner containers: without and with the rule, unconfined
    and under a RuntimeDefault-like profile; ``ruled`` is ``owner``'s."""

    guard: GuardService
    holders: list[HolderProcess]
    owner: ContainerRef
    plain: OwnerContainer
    ruled: OwnerContainer
    rd_plain: OwnerContainer
    rd_ruled: OwnerContainer
    back: threading.Event
    """Set by the guard's owner-back handler."""
    back_at: list[int]
    """When the handler ran (monotonic ns)."""


@contextlib.contextmanager
def _testbed(base: Path, rootfs: Path) -> Iterator[_Bed]:
    """Start the bed; everything started is closed, stopped or killed on the way out."""
    from prometheus_client import CollectorRegistry

    from spotgpu.core.config import GuardConfig
    from spotgpu.guard.service import GuardService
    from spotgpu.guard.support import probe
    from spotgpu.testing.guard_testbed import HolderProcess, OwnerContainer, runtime_default_like

    owner = ContainerRef("bench", "owner-0", "main")
    second = ContainerRef("bench", "owner-1", "main")
    listener, control = base / "guard.sock", base / "holder.sock"
    holder = HolderProcess(listener, control, guard_timeout=3.0, log=base / "holder.log")
    back = threading.Event()
    back_at: list[int] = []

    def on_owner_back(_owner: ContainerRef) -> None:
        back_at.append(time.monotonic_ns())
        back.set()

    guard = GuardService(
        GuardConfig(listener_path=listener, holder_path=control),
        on_owner_back,
        registry=CollectorRegistry(),
        support=probe(),
    )
    containers: list[OwnerContainer] = []
    holders = [holder]
    try:
        holder.start()
        guard.start()
        if not guard.wait_until(lambda g: g.attached, 15):
            raise RuntimeError(f"guard did not attach to the holder: {holder.log()}")
        plain = OwnerContainer(base, rootfs, "plain", listener=None, owner=None)
        ruled = OwnerContainer(base, rootfs, "ruled", listener=listener, owner=owner)
        rd_plain = OwnerContainer(base, rootfs, "rd-plain", listener=None, owner=None, seccomp=runtime_default_like())
        rd_ruled = OwnerContainer(
            base, rootfs, "rd-ruled", listener=listener, owner=second, seccomp=runtime_default_like()
        )
        containers += [plain, ruled, rd_plain, rd_ruled]
        for container in containers:
            container.start()
        if not guard.wait_until(lambda g: len(g.fds()) == 2, 15):
            raise RuntimeError("the ruled containers' notify fds never reached the guard")
        yield _Bed(guard, holders, owner, plain, ruled, rd_plain, rd_ruled, back, back_at)
    finally:
        for container in containers:
            container.close()
        guard.stop()
        for each in holders:
            each.kill()


@dataclass(frozen=True, slots=True)
class _Measured:
    """What the four measurements returned (the report's raw material)."""

    overhead: dict[str, Any]
    per_session: dict[str, int]
    session_us: list[float]
    unarmed_call_us: list[float]
    release_ms: list[float]
    owner_back_ms: list[float]
    handover: dict[str, Any]


def _measure(base: Path, rootfs: Path, args: argparse.Namespace) -> dict[str, Any]:
    with _testbed(base, rootfs) as bed:
        overhead = _unarmed_overhead(bed, args)
        per_session, session_us = _notifications_per_session(bed)
        unarmed_call_us = _unarmed_session_calls(bed, args.iterations)
        release_ms, owner_back_ms = _releases(bed, args.iterations)
        # 4. Holder upgrades under load (the holder answers alone: the guard is stopped).
        bed.guard.stop()
        handover = _handovers_under_load(base, bed.ruled, bed.holders, args.handovers, fds=2)
    measured = _Measured(overhead, per_session, session_us, unarmed_call_us, release_ms, owner_back_ms, handover)
    return _report(args, measured)


def _unarmed_overhead(bed: _Bed, args: argparse.Namespace) -> dict[str, Any]:
    """1. Unarmed overhead of ordinary GPU ioctls: paired, alternating trials, per profile."""
    from spotgpu.testing import standin

    overhead: dict[str, Any] = {}
    pairs = {"unconfined": (bed.plain, bed.ruled), "runtime-default": (bed.rd_plain, bed.rd_ruled)}
    for profile, (without_c, with_c) in pairs.items():
        for call in (
            standin.Call(standin.CTL, standin.RM_CONTROL),
            standin.Call(standin.UVM, standin.UVM_MAP_EXTERNAL_ALLOCATION),
        ):
            command = f"loop {call.device} {call.request:#x} {args.loop}"
            with_rule, without, diffs = [], [], []
            for trial in range(args.trials):
                order = (without_c, with_c) if trial % 2 == 0 else (with_c, without_c)
                got = {c.id: c.command(command, timeout=120)["ns_per_call"] / 1e3 for c in order}
                with_rule.append(got[with_c.id])
                without.append(got[without_c.id])
                diffs.append(got[with_c.id] - got[without_c.id])
            overhead[f"{profile} {call.request:#x}"] = {
                "with_rule_us": round(statistics.median(with_rule), 4),
                "without_rule_us": round(statistics.median(without), 4),
                "overhead_us": round(statistics.median(diffs), 4),
            }
    notifications_before = bed.guard.metrics.notifications.labels("continue")._value.get()
    if notifications_before:
        raise RuntimeError(f"ordinary ioctls reached the guard {notifications_before} times")
    return overhead


def _notifications_per_session(bed: _Bed) -> tuple[dict[str, int], list[float]]:
    """2. Notifications per stand-in session start (unarmed: answered at once), and each
    session's slowest call (us)."""
    from spotgpu.testing import standin

    counter = bed.guard.metrics.notifications.labels("continue")
    per_session: dict[str, int] = {}
    session_us: list[float] = []
    for name, calls in standin.SESSIONS.items():
        before = counter._value.get()
        seq = bed.ruled.command(f"seq {standin.sequence_arg(calls)}", timeout=30)
        if seq["enosys"] or seq["enotty"] != seq["calls"]:
            raise RuntimeError(f"session {name} failed: {seq}")
        per_session[name] = int(counter._value.get() - before)
        session_us.append(seq["worst_ns"] / 1e3)
    return per_session, session_us


def _unarmed_session_calls(bed: _Bed, iterations: int) -> list[float]:
    """2b. What one session start costs an owner that is not lent (a notification round trip), us."""
    from spotgpu.testing import standin

    unarmed_call_us = []
    for _ in range(iterations):
        got = bed.ruled.call(standin.CHECK_VERSION_STR)
        unarmed_call_us.append((got["end_ns"] - got["start_ns"]) / 1e3)
    return unarmed_call_us


def _releases(bed: _Bed, iterations: int) -> tuple[list[float], list[float]]:
    """3. Release after eviction: armed, held, disarmed; time to the owner's return (ms), and
    from the held call to the owner-back handler (ms)."""
    from spotgpu.testing import standin

    release_ms: list[float] = []
    owner_back_ms: list[float] = []
    for _ in range(iterations):
        bed.back.clear()
        bed.back_at.clear()
        bed.guard.arm(bed.owner)
        bed.ruled.send(f"call {standin.CTL} {standin.CHECK_VERSION_STR:#x}")
        if not bed.back.wait(10):
            raise RuntimeError("owner-back was not signalled")
        disarm_at = time.monotonic_ns()
        bed.guard.disarm(bed.owner)
        got = bed.ruled.read(10)
        release_ms.append((got["end_ns"] - disarm_at) / 1e6)
        owner_back_ms.append((bed.back_at[0] - got["start_ns"]) / 1e6)
    return release_ms, owner_back_ms


def _report(args: argparse.Namespace, m: _Measured) -> dict[str, Any]:
    """The JSON object of the figures (module docstring)."""
    from spotgpu.testing import standin

    figures = {
        "unarmed_overhead_us_per_ioctl": max(v["overhead_us"] for v in m.overhead.values()),
        "notifications_per_session": max(m.per_session.values()),
        "release_after_eviction_ms_p99": round(percentile(m.release_ms, 99), 3),
    }
    return {
        "benchmark": "guard",
        **figures,
        "targets": TARGETS,
        "met": {k: figures[k] <= v for k, v in TARGETS.items()},
        "details": {
            "overhead_by_request": m.overhead,
            "notifications_by_session": m.per_session,
            "session_calls": {k: len(v) for k, v in standin.SESSIONS.items()},
            "worst_single_ioctl_in_unarmed_session_us": round(max(m.session_us), 1),
            "unarmed_session_start_call_us": {
                "p50": round(percentile(m.unarmed_call_us, 50), 1),
                "p99": round(percentile(m.unarmed_call_us, 99), 1),
            },
            "release_after_eviction_ms": {
                "p50": round(percentile(m.release_ms, 50), 3),
                "p99": round(percentile(m.release_ms, 99), 3),
                "max": round(max(m.release_ms), 3),
            },
            "owner_back_ms": {
                "p50": round(percentile(m.owner_back_ms, 50), 3),
                "p99": round(percentile(m.owner_back_ms, 99), 3),
            },
            "handover": m.handover,
            "trials": args.trials,
            "ioctls_per_trial": args.loop,
            "iterations": args.iterations,
        },
    }


_HANDED = re.compile(r"handed (\d+) fds.* in ([0-9.]+) ms")


def _handovers_under_load(base: Path, ruled: Any, holders: list[Any], count: int, *, fds: int) -> dict[str, Any]:
    """Successive holder upgrades while ``ruled`` starts sessions back to back, alternating with
    a control phase that starts a Python process importing the holder beside the same load (no
    handover): the slowest call of each phase, in the same run, separates what the handover
    costs from CPU contention. ``holders`` gets every started holder (the caller kills them)."""
    import subprocess

    from spotgpu.testing import standin
    from spotgpu.testing.guard_testbed import HolderProcess

    stop = threading.Event()
    phase = ["control"]
    calls = {"control": 0, "handover": 0}
    worst_ns = {"control": 0, "handover": 0}
    failed = [0]
    batch = standin.sequence_arg([standin.Call(standin.CTL, standin.CHECK_VERSION_STR)] * 200)

    def load() -> None:
        while not stop.is_set():
            seq = ruled.command(f"seq {batch}", timeout=30)
            name = phase[0]
            calls[name] += seq["calls"]
            failed[0] += seq["calls"] - seq["enotty"]
            worst_ns[name] = max(worst_ns[name], seq["worst_ns"])

    thread = threading.Thread(target=load, name="bench-load", daemon=True)
    thread.start()
    handover_ms: list[float] = []
    try:
        for i in range(count):
            phase[0] = "control"
            subprocess.run([sys.executable, "-c", "import spotgpu.guard.holder, spotgpu.cli"], check=True)
            time.sleep(0.1)
            phase[0] = "handover"
            previous = holders[-1]
            successor = HolderProcess(
                previous.listener, previous.control, guard_timeout=3.0, log=base / f"holder{i + 1}.log"
            )
            holders.append(successor.start())
            if previous.terminate(10) != 0:
                raise RuntimeError(f"the old holder did not exit cleanly: {previous.log()}")
            found = _HANDED.search(previous.log())
            if found is None or int(found.group(1)) != fds:
                raise RuntimeError(f"no handover of the {fds} owner fds in the old holder's log: {previous.log()}")
            handover_ms.append(float(found.group(2)))
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(60)
    if failed[0]:
        raise RuntimeError(f"{failed[0]} session calls failed during holder handovers")
    return {
        "handovers": count,
        "handover_ms": {"p50": round(statistics.median(handover_ms), 2), "max": round(max(handover_ms), 2)}
        if handover_ms
        else {},
        "session_calls_during": calls["handover"],
        "failed_session_calls": failed[0],
        "worst_session_call_ms": round(worst_ns["handover"] / 1e6, 3),
        "control_worst_session_call_ms": round(worst_ns["control"] / 1e6, 3),
        "control_session_calls": calls["control"],
    }
