"""``spotgpu bench returnpath``: where an owner's hold goes, stage by stage, and what cuts it (root).

An analysis tool, not a pass/fail benchmark: it runs the same returns as ``spotgpu bench
agent`` (:mod:`spotgpu.bench.agent`: real containerd, busybox spot containers holding stand-in
GPUs, the agent's own eviction code behind the guard's owner-back signal) with the stop path
swapped or probed through the agent's ports only (the task port, the guard, the guard's
thread), so it keeps working when the solver's inside changes. Every combination of
``--containers``, ``--background-load`` and ``--variants`` is measured ``--runs`` times,
interleaved (each round visits every combination and, inside it, every variant, in rotating
orders), so the ratios between variants hold on a machine whose other load drifts. The
probes themselves are in :mod:`spotgpu.bench.probes`.

Variants (``--variants``; each a stop strategy, optionally with a modifier):

* ``containerd-wait``: :meth:`ContainerdTasks.stop_tasks` as it ran before issue 15
  (``verify_by_pidfd=False``, no pins): a Wait on every task issued first, each init's PID from
  containerd's ``Tasks.Get``, SIGKILLed through a pidfd, each stop verified by containerd's Wait
  answer.
* ``containerd``: the same with ``verify_by_pidfd=True``: an init that is its PID namespace's
  init is verified by its pidfd turning readable, no Wait for it; containerd's ``Kill(all)``
  follows after the release.
* ``containerd-pinned``: :meth:`ContainerdTasks.stop_tasks` as it runs by default: as
  ``containerd`` with the spot containers' processes pinned by the agent's refreshes
  (:meth:`ContainerdTasks.pin`), so no ``Tasks.Get`` comes before the kill.
* ``kill-rpc``: as ``containerd-wait`` with containerd's ``Kill(all)`` per task instead of the
  direct signal (the path before that): one ``runc kill`` process per task.
* ``pidfd-get``: PIDs from ``Tasks.Get``, SIGKILLed through pidfds
  (:mod:`spotgpu.adapters.pidkill`) and verified by pidfd readiness; containerd is told
  (``Kill(all)``) only after, off the owner's path.
* ``pidfd-pinned``: as ``pidfd-get`` with the pidfds opened before the signal (an agent that
  pins each spot container's init when it first sees it): no containerd call before the kill.
* ``helper-pinned``: as ``pidfd-pinned`` but the kill and the wait are done by a compiled
  helper process (C, built with :mod:`spotgpu.testing.cbuild`), told the PIDs over a pipe.
* modifiers: ``+boost`` (direct strategies) raises each victim to nice -20 right after its
  SIGKILL is queued (it runs no more user code then, only its exit); ``+rr`` runs the guard's
  thread and the agent's eviction executor (``agent.eviction.realtime``, off otherwise) at
  ``SCHED_RR`` 10 for the whole measurement; ``+nice`` the guard's thread at nice -10;
  ``+detect`` runs detection cycles back to back on another thread meanwhile (GIL and
  solver-lock contention; an upper bound: a real agent runs one cycle per ``detectInterval``);
  ``+defer`` lets those cycles wait while the return is in flight (``agent.eviction.
  deferDetection``, off otherwise); ``+switch`` sets Python's GIL switch interval to 0.5 ms
  (default 5 ms) during the measurement.

Per return, times from the owner-back signal (monotonic, ms): ``wake`` (the guard's thread
woke), ``plan`` (stop_tasks entered: lock, twins Unhealthy, fresh pod-resources read, plan),
``signal`` (every SIGKILL sent: for containerd variants the Get round trip included),
``die`` (the last victim exited, seen by a watcher process at ``SCHED_FIFO`` polling pidfds:
the kernel's own answer, independent of the variant), ``report`` (the stop path learned it:
the last Wait answer on gRPC's thread, or pidfd readiness), ``collect`` (stop_tasks returned),
``release`` (the guard disarmed), ``hold`` (the agent's release, as in ``bench agent``). Also,
over the window: run-queue wait (``/proc/.../schedstat``: runnable, not running) of the
guard's thread, of the whole agent process and of containerd plus its shims, the guard
thread's CPU time, and time in Python's garbage collector.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spotgpu.adapters import pidkill
from spotgpu.bench import agent as bench_agent
from spotgpu.bench import env
from spotgpu.bench.probes import (
    KILLER_C,
    SHIPPED,
    Helper,
    Marks,
    Probe,
    ProbedTasks,
    TimedGuard,
    rq_wait,
    rq_wait_delta,
    runtime_pids,
)
from spotgpu.core.config import EvictionConfig
from spotgpu.testing.cbuild import compile_static
from spotgpu.testing.containerd import Containerd
from spotgpu.testing.exitwatch import ExitWatcher
from spotgpu.testing.fakes import FakeGuard

STRATEGIES = (*SHIPPED, "pidfd-get", "pidfd-pinned", "helper-pinned")
MODIFIERS = ("rr", "nice", "detect", "defer", "boost", "switch")
DEFAULT_VARIANTS = "containerd-wait,containerd,containerd+rr,containerd+detect,pidfd-pinned,pidfd-pinned+rr"
STAGES = ("wake", "plan", "signal", "die", "report", "collect", "release")

# -- one return ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    strategy: str
    rr: bool = False
    nice: bool = False
    detect: bool = False
    defer: bool = False
    boost: bool = False
    switch: bool = False

    @classmethod
    def parse(cls, name: str) -> Variant:
        strategy, *mods = name.split("+")
        if strategy not in STRATEGIES or any(m not in MODIFIERS for m in mods):
            raise argparse.ArgumentTypeError(f"unknown variant {name!r}: {STRATEGIES} with +{'/+'.join(MODIFIERS)}")
        flags = {m: m in mods for m in MODIFIERS}
        return cls(name, strategy, **flags)


class GuardThread(bench_agent.GuardThread):
    """The bench's guard thread, probed, optionally at a raised priority."""

    def __init__(self, guard: FakeGuard, probe: Probe, variant: Variant) -> None:
        self.probe = probe
        self.variant = variant
        self.tid = 0
        self._ready = threading.Event()
        super().__init__(guard)
        self._ready.wait(10)

    def _loop(self) -> None:
        self.tid = threading.get_native_id()
        self.probe.guard_thread = threading.get_ident()
        if self.variant.rr:
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(10))
        if self.variant.nice:
            os.setpriority(os.PRIO_PROCESS, self.tid, -10)
        self._ready.set()
        super()._loop()

    def _call(self) -> None:
        marks = self.probe.marks
        marks.handler = time.monotonic_ns()
        marks.signal = self.fired_at
        cpu = time.thread_time_ns()
        super()._call()
        marks.handler_cpu_ns = time.thread_time_ns() - cpu


@contextlib.contextmanager
def switch_interval(short: bool) -> Iterator[None]:
    """Python's GIL switch interval at 0.5 ms while the block runs (when ``short``)."""
    default = sys.getswitchinterval()
    if short:
        sys.setswitchinterval(0.0005)
    try:
        yield
    finally:
        sys.setswitchinterval(default)


@dataclass
class Context:
    containerd: Containerd
    node: bench_agent.Node
    tasks: ProbedTasks
    probe: Probe
    watcher: ExitWatcher
    settle: float


def one_return(ctx: Context, tag: str, count: int, load: int, variant: Variant) -> dict[str, Any]:
    """Start ``count`` spot containers, lend, load, signal, measure; clean up."""
    cids = ctx.node.start_spots(ctx.containerd, tag, count)
    try:
        ctx.probe.marks = Marks()
        ctx.probe.released.clear()
        guard = TimedGuard(ctx.probe)
        ctx.tasks.strategy = variant.strategy
        ctx.tasks.nice_boost = variant.boost
        switches = EvictionConfig(realtime=variant.rr, defer_detection=variant.defer)
        agent, _ = ctx.node.agent(ctx.tasks, cids, guard=guard, eviction=switches)
        signaller: GuardThread | None = None
        try:
            pids = [ctx.tasks.init_pid(c) or 0 for c in cids]
            pinned, _ = pidkill.pin(pids)
            ctx.tasks.pinned = {c: (p, pinned[p]) for c, p in zip(cids, pids, strict=True) if p in pinned}
            signaller = GuardThread(guard, ctx.probe, variant)
            ctx.watcher.watch(pids)
            runtime = runtime_pids(ctx.containerd)
            detecting = bench_agent.detection_meanwhile(agent, variant.detect)
            with env.background_load(load), detecting, switch_interval(variant.switch):
                time.sleep(ctx.settle if load else 0.0)
                before = (rq_wait([os.getpid()]), rq_wait(runtime))
                start = time.monotonic()
                signaller.fire()
                after = (rq_wait([os.getpid()]), rq_wait(runtime))
            elapsed = time.monotonic() - start
            ctx.probe.marks.deaths = [t for t in ctx.watcher.exits(pids, 30).values() if t is not None]
            pidkill.close_all(pinned)
        finally:
            if signaller is not None:
                signaller.close()
            agent.stop()
        record = agent.debug_state()["evictions"][-1]
        if record["failed_tasks"] or len(ctx.probe.marks.deaths) != count:
            raise RuntimeError(f"{variant.name}: not every spot task was seen stopped: {record}")
    finally:
        bench_agent.remove(ctx.containerd, cids)
    return _figures(ctx.probe.marks, before, after, signaller.tid, elapsed)


def _figures(
    m: Marks,
    before: tuple[dict[int, int], dict[int, int]],
    after: tuple[dict[int, int], dict[int, int]],
    tid: int,
    elapsed: float,
) -> dict[str, Any]:
    def ms(a: int, b: int) -> float:
        return round((b - a) / 1e6, 3)

    dead = max(m.deaths)
    return {
        "wake": ms(m.signal, m.handler),
        "plan": ms(m.handler, m.stop_enter),
        "signal": ms(m.stop_enter, m.killed),
        "die": ms(m.killed, dead),
        "die_first": ms(m.killed, min(m.deaths)),
        "report": ms(dead, m.reported),
        "collect": ms(m.reported, m.stop_return),
        "release": ms(m.stop_return, m.released),
        "eviction": ms(m.signal, m.stop_return),
        "hold": ms(m.signal, m.released),
        "dead": ms(m.signal, dead),
        "guard_thread_rq_wait": round((after[0].get(tid, 0) - before[0].get(tid, 0)) / 1e6, 3),
        "agent_rq_wait": round(rq_wait_delta(before[0], after[0]) / 1e6, 3),
        "runtime_rq_wait": round(rq_wait_delta(before[1], after[1]) / 1e6, 3),
        "guard_thread_cpu": round(m.handler_cpu_ns / 1e6, 3),
        "gc": round(m.gc_ns / 1e6, 3),
        "window_s": round(elapsed, 4),
    }


# -- the run ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--containers", type=env.int_list, default=[8, 32], metavar="N[,N...]", help="default 8,32")
    parser.add_argument(
        "--variants",
        type=lambda text: [Variant.parse(v) for v in text.split(",") if v],
        default=[Variant.parse(v) for v in DEFAULT_VARIANTS.split(",")],
        help=f"comma-separated (default {DEFAULT_VARIANTS}); the first is the baseline of the ratios",
    )
    parser.add_argument("--runs", type=int, default=10, help="rounds (each measures every combination once)")
    parser.add_argument("--settle", type=float, default=0.3, help="seconds the load runs before each signal")
    parser.add_argument("--out", type=Path, help="also write the JSON object to this file")
    env.add_arguments(parser, several=True)
    parser.set_defaults(background_load=[0, 2])


def _pct(values: Sequence[float], q: float) -> float:
    return round(bench_agent.percentile(values, q), 3)


def summarize(records: Sequence[dict[str, Any]], baseline: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians and tails of one (containers, load, variant) cell, and its paired ratios to the
    baseline variant of the same rounds."""
    out: dict[str, Any] = {"n": len(records)}
    for key in ("hold", "eviction", "dead"):
        values = [r[key] for r in records]
        out[key] = {"p50": _pct(values, 50), "p90": _pct(values, 90), "p99": _pct(values, 99), "max": max(values)}
    out["stages_p50"] = {s: round(statistics.median(r[s] for r in records), 3) for s in STAGES}
    out["stages_p90"] = {s: _pct([r[s] for r in records], 90) for s in STAGES}
    extra = ("guard_thread_rq_wait", "agent_rq_wait", "runtime_rq_wait", "guard_thread_cpu", "gc")
    out["window_p50"] = {k: round(statistics.median(r[k] for r in records), 3) for k in extra}
    out["window_max"] = {k: max(r[k] for r in records) for k in extra}
    pairs = [(r["hold"], b["hold"]) for r, b in zip(records, baseline, strict=True) if b["hold"] > 0]
    out["hold_ratio_to_baseline_paired_p50"] = round(statistics.median(a / b for a, b in pairs), 3) if pairs else None
    base = [b["hold"] for b in baseline]
    out["hold_p90_ratio_to_baseline"] = round(_pct([r["hold"] for r in records], 90) / _pct(base, 90), 3)
    return out


def measure(args: argparse.Namespace, base: Path) -> dict[tuple[int, int, str], list[dict[str, Any]]]:
    watcher = ExitWatcher(base / "bin")
    killer = compile_static(KILLER_C, base / "bin", "pidkiller")
    variants: list[Variant] = args.variants
    cells = list(itertools.product(args.containers, args.background_load))
    records: dict[tuple[int, int, str], list[dict[str, Any]]] = {
        (c, n, v.name): [] for (c, n), v in itertools.product(cells, variants)
    }
    probe = Probe()
    helper = Helper(killer) if any(v.strategy == "helper-pinned" for v in variants) else None
    node = bench_agent.Node(base / "node", max(args.containers), 0.0)
    try:
        with Containerd(base / "containerd") as containerd:
            tasks = ProbedTasks(containerd.address, bench_agent.NS, probe, helper)
            ctx = Context(containerd, node, tasks, probe, watcher, args.settle)
            try:
                for run_no in range(args.runs):
                    for i, (count, load) in enumerate(_rotate(cells, run_no)):
                        for variant in _rotate(variants, run_no + i):
                            tag = f"{run_no}-{count}-{load}-{variants.index(variant)}"
                            records[(count, load, variant.name)].append(one_return(ctx, tag, count, load, variant))
                    print(f"round {run_no + 1}/{args.runs} done, load {env.load_average()}", file=sys.stderr)
            finally:
                tasks.close()
    finally:
        probe.close()
        watcher.close()
        if helper is not None:
            helper.close()
    return records


def _rotate(items: Sequence[Any], by: int) -> list[Any]:
    shift = by % len(items)
    return list(items[shift:]) + list(items[:shift])


def run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0 or not all(shutil.which(p) for p in ("containerd", "ctr", "runc")):
        print("spotgpu bench returnpath: needs root, containerd, ctr and runc", file=sys.stderr)
        return 2
    before = env.load_average()
    with tempfile.TemporaryDirectory(prefix="spotgpu-returnpath-") as tmp, bench_agent.quiet_agent_logs():
        records = measure(args, Path(tmp))
    baseline_name = args.variants[0].name
    cells: list[dict[str, Any]] = []
    for (count, load, name), cell in records.items():
        summary = summarize(cell, records[(count, load, baseline_name)])
        cells.append({"containers": count, "background_load": load, "variant": name, **summary})
    result = {
        "benchmark": "returnpath",
        "runs": args.runs,
        "settle_s": args.settle,
        "baseline": baseline_name,
        "variants": [asdict(v) for v in args.variants],
        "stages": list(STAGES),
        "cells": cells,
        "raw": [
            {"containers": c, "background_load": n, "variant": v, "returns": cell}
            for (c, n, v), cell in records.items()
        ],
        "environment": env.environment(
            background_load=args.background_load,
            load_before=before,
            load_after=env.load_average(),
            containerd_binaries=args.containerd_binary,
        ),
    }
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


__all__ = ["Variant", "add_arguments", "run"]
