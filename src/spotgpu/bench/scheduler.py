"""``spotgpu bench scheduler``: one scheduling cycle on a synthetic cluster; throughput, victim selection, memory.

Side effects: reads the clocks (``time.perf_counter`` for wall time, ``time.process_time`` for
this process's CPU time, which other jobs on the machine disturb less) and the peak RSS, prints one JSON
object (``--json``) or a short table to stdout, and with ``--profile N`` a cProfile listing to
stderr. The scheduler core itself reads no clock; all timing happens here.

The synthetic cluster (seeded, :func:`synthetic_snapshot`):

* ``--nodes`` nodes of ``--gpus-per-node`` GPUs. About 30% are developer machines: all GPUs held
  by one reserved owner, lending allowed, strategy ``lowpower``; 60% of these owners are idle
  (twins Healthy). The others are pool nodes: unallocated GPUs, strategy ``idle``.
* ``--running-spot-pods`` placed spot pods in spot gangs of 1-4: 60% of gangs exclusive (1 GPU
  per pod) on pool nodes through ShadowPods, spread so that a pool node carries at most half its
  GPUs of spot work; 40% shared (250 or 500 milli) on idle owners' GPUs. Random spot tiers, start
  times up to a day back.
* ``--shadow-reuse F`` (default 0): on a share ``F`` of the pool nodes carrying spot work, all
  the node's ShadowPods are one ShadowPod (the oldest) that also holds one idle GPU: spot gangs
  took the idle GPUs of an earlier gang's ShadowPod, as the ``idle`` strategy does, so the
  ShadowPod can only go when every one of them is evicted (the shape victim selection must
  cost; issue 3's fix). Drawn from its own seeded stream: other draws do not change.
* ``--pending-pods`` pending pods in gangs of 1-8 (``min_member`` = gang size): 40% reserved
  (1, 2, 4 or 8 GPUs per pod, weights 4:3:2:1; priorities 0/100/1000) over three reserved queues,
  60% spot (70% exclusive with 1-2 GPUs, 30% shared 250/500 milli) over two spot queues.

Figures: ``cycle_seconds`` is one full :func:`~spotgpu.scheduler.run_cycle` (checking and
indexing the snapshot included), ``pods_per_second`` = ``pods_placed / cycle_seconds``.
``cycle_cpu_seconds`` is the same cycle's CPU time.
``victim_selection_ms_*`` time victim selection for one extra 8-GPU reserved gang on the same
cluster (every pool node carries spot work, so it must preempt), on an open session, repeated
``--victim-repeats`` times (each run planned, then undone; the garbage collector paused as in a
cycle; ``victim_selection_cpu_ms_p99`` is the CPU-time p99); ``victim_session_open_seconds`` is
the one-off cost of checking and indexing that snapshot. ``peak_rss_mb`` is the process's peak
resident memory (snapshot generation included). ``--background-load N`` runs it all beside N
busy-loop processes (:mod:`spotgpu.bench.env`); ``environment`` records that, the load average
before and after, versions and the revision.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any, Final

from spotgpu.bench import env
from spotgpu.core.ids import SPOT_GPU_RESOURCE, DeviceID, NodeName
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import GPU_MILLI, Health, NodeStrategy, QueueType, SpotPriority
from spotgpu.scheduler import (
    GPU,
    CycleResult,
    GPURequest,
    Node,
    Pod,
    PodGroup,
    PodGroupPhase,
    Queue,
    SchedulerConfig,
    ShadowPod,
    Snapshot,
    open_session,
    run_cycle,
)
from spotgpu.scheduler.cycle import collector_paused
from spotgpu.scheduler.victims import preempt_gang

TARGETS: Final = {"pods_per_second": 2000.0, "victim_selection_ms_p99": 5.0, "peak_rss_mb": 2048.0}
TARGET_SHAPE: Final = {"nodes": 5000, "gpus_per_node": 8, "pending_pods": 10000, "running_spot_pods": 20000}
NOW: Final = 1_700_000_000.0
RESERVED_QUEUES: Final = (("team-a", 1), ("team-b", 2), ("team-c", 1))
SPOT_QUEUES: Final = (("spot", 2), ("spot-batch", 1))
PREEMPTOR: Final = PodRef("bench", "preemptor")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    shape = TARGET_SHAPE
    parser.add_argument("--nodes", type=int, default=shape["nodes"], help=f"nodes (default {shape['nodes']})")
    parser.add_argument(
        "--gpus-per-node", type=int, default=shape["gpus_per_node"], help=f"default {shape['gpus_per_node']}"
    )
    parser.add_argument(
        "--pending-pods",
        type=int,
        default=shape["pending_pods"],
        help=f"pods to place (default {shape['pending_pods']})",
    )
    parser.add_argument(
        "--running-spot-pods",
        type=int,
        default=shape["running_spot_pods"],
        help=f"spot pods already placed (default {shape['running_spot_pods']})",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the synthetic cluster (default 1)")
    parser.add_argument(
        "--shadow-reuse",
        type=float,
        default=0.0,
        metavar="F",
        help="share of pool nodes with spot work whose ShadowPods are one, shared by several gangs (default 0)",
    )
    parser.add_argument("--victim-repeats", type=int, default=200, help="victim-selection runs to time (default 200)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--profile", type=int, metavar="N", default=0, help="cProfile the cycle; top N to stderr")
    env.add_arguments(parser)


class _NodeDraft:
    __slots__ = ("dev", "gpus", "lending", "milli", "name", "owner", "spot", "strategy", "twin")

    def __init__(self, index: int, gpus: int, owner: ContainerRef | None, idle: bool) -> None:
        self.name = NodeName(f"node-{index:05d}")
        self.gpus = [DeviceID(f"GPU-{index:05d}-{j}") for j in range(gpus)]
        self.owner: list[ContainerRef | None] = [owner] * gpus
        self.twin = [Health.HEALTHY if owner is None or idle else Health.UNHEALTHY] * gpus
        self.milli = [0] * gpus
        self.dev = owner is not None
        self.lending = self.dev
        self.strategy = NodeStrategy.LOWPOWER if self.dev else NodeStrategy.IDLE
        self.spot = 0

    def obj(self) -> Node:
        gpus = tuple(GPU(d, o, t) for d, o, t in zip(self.gpus, self.owner, self.twin, strict=True))
        return Node(self.name, gpus, lending=self.lending, strategy=self.strategy)


def synthetic_snapshot(
    nodes: int,
    gpus_per_node: int,
    pending: int,
    running: int,
    *,
    seed: int,
    now: float = NOW,
    shadow_reuse: float = 0.0,
) -> Snapshot:
    """The benchmark's cluster (see the module docstring). Deterministic for a seed."""
    rng = random.Random(seed)
    drafts: list[_NodeDraft] = []
    for i in range(nodes):
        if rng.random() < 0.3:
            owner = ContainerRef("dev", f"dev-{i:05d}", "main")
            drafts.append(_NodeDraft(i, gpus_per_node, owner, idle=rng.random() < 0.6))
        else:
            drafts.append(_NodeDraft(i, gpus_per_node, None, idle=True))
    pool = [d for d in drafts if not d.dev]
    lent = [(d, j) for d in drafts if d.dev and d.twin[0] is Health.HEALTHY for j in range(gpus_per_node)]
    rng.shuffle(pool)
    rng.shuffle(lent)
    queues = [Queue(n, QueueType.RESERVED, w) for n, w in RESERVED_QUEUES]
    queues += [Queue(n, QueueType.SPOT, w) for n, w in SPOT_QUEUES]
    placer = _SpotPlacer(rng, drafts, pool, lent, max(1, gpus_per_node // 2))
    groups, pods, shadows = placer.running(running, now)
    pending_groups, pending_pods = _pending(rng, pending, gpus_per_node)
    groups += pending_groups
    pods += pending_pods
    if shadow_reuse > 0:
        shadows = _merge_shadows(drafts, shadows, shadow_reuse, random.Random(f"{seed}/shadow-reuse"))
    return Snapshot(tuple(d.obj() for d in drafts), tuple(queues), tuple(groups), tuple(pods), tuple(shadows))


class _SpotPlacer:
    """Running spot gangs: exclusive members on pool nodes (at most ``per_node_cap`` per node,
    each node's GPUs held by one ShadowPod per gang), shared members on lent GPUs."""

    def __init__(
        self,
        rng: random.Random,
        drafts: list[_NodeDraft],
        pool: list[_NodeDraft],
        lent: list[tuple[_NodeDraft, int]],
        per_node_cap: int,
    ) -> None:
        self.rng = rng
        self.drafts = drafts
        self.pool = pool
        self.lent = lent
        self.per_node_cap = per_node_cap
        self.pool_pos = 0
        self.lent_pos = 0

    def running(self, running: int, now: float) -> tuple[list[PodGroup], list[Pod], list[ShadowPod]]:
        rng = self.rng
        tiers = list(SpotPriority)
        groups: list[PodGroup] = []
        pods: list[Pod] = []
        shadows: list[ShadowPod] = []
        g = 0
        while running > 0 and self.pool:
            size = min(running, rng.randint(1, 4))
            ref = PodRef("spot", f"run-{g:06d}")
            exclusive = rng.random() < 0.6 or self.lent_pos >= len(self.lent)
            start = now - rng.uniform(60.0, 86400.0)
            held: dict[NodeName, list[DeviceID]] = {}
            members: list[Pod] = []
            for k in range(size):
                pref = PodRef("spot", f"run-{g:06d}-{k}")
                member = self._exclusive(pref, ref, start, held) if exclusive else self._shared(pref, ref, start)
                if member is None:
                    break
                members.append(member)
            if not members:
                break
            queue = SPOT_QUEUES[g % len(SPOT_QUEUES)][0]
            groups.append(
                PodGroup(ref, queue, len(members), spot_priority=rng.choice(tiers), phase=PodGroupPhase.RUNNING)
            )
            pods.extend(members)
            shadows.extend(self._shadows(ref, held, start))
            running -= len(members)
            g += 1
        return groups, pods, shadows

    def _exclusive(self, pref: PodRef, ref: PodRef, start: float, held: dict[NodeName, list[DeviceID]]) -> Pod | None:
        for _ in range(len(self.pool)):
            d = self.pool[self.pool_pos % len(self.pool)]
            self.pool_pos += 1
            if d.spot < self.per_node_cap:
                break
        else:
            return None
        j = d.spot
        d.spot += 1
        d.milli[j] = GPU_MILLI
        held.setdefault(d.name, []).append(d.gpus[j])
        return Pod(pref, ref.name, GPURequest.spot(1), node=d.name, devices=(d.gpus[j],), start_time=start)

    def _shared(self, pref: PodRef, ref: PodRef, start: float) -> Pod | None:
        milli = self.rng.choice((250, 500))
        lent = self.lent
        while self.lent_pos < len(lent) and lent[self.lent_pos][0].milli[lent[self.lent_pos][1]] + milli > GPU_MILLI:
            self.lent_pos += 1
        if self.lent_pos >= len(lent):
            return None
        d, j = lent[self.lent_pos]
        d.milli[j] += milli
        return Pod(pref, ref.name, GPURequest.shared(milli), node=d.name, devices=(d.gpus[j],), start_time=start)

    def _shadows(self, ref: PodRef, held: dict[NodeName, list[DeviceID]], start: float) -> list[ShadowPod]:
        """One ShadowPod per node holding the gang's exclusive GPUs there (its GPUs' owner)."""
        out = []
        for node_name, devices in held.items():
            sref = PodRef("spot", f"{ref.name}-shadow-{node_name}")
            owner = sref.container("main")
            draft = self.drafts[int(node_name.rsplit("-", 1)[1])]
            for dev in devices:
                draft.owner[draft.gpus.index(dev)] = owner
            out.append(ShadowPod(sref, node_name, tuple(devices), group=ref, created_at=start))
        return out


def _pending(rng: random.Random, pending: int, gpus_per_node: int) -> tuple[list[PodGroup], list[Pod]]:
    """Pending gangs: reserved (whole GPUs) and spot (exclusive or shared), in the queue."""
    tiers = list(SpotPriority)
    groups: list[PodGroup] = []
    pods: list[Pod] = []
    n = 0
    while pending > 0:
        size = min(pending, rng.randint(1, 8))
        reserved = rng.random() < 0.4
        ref = PodRef("jobs", f"job-{n:06d}")
        if reserved:
            queue = RESERVED_QUEUES[n % len(RESERVED_QUEUES)][0]
            gpus = rng.choices((1, 2, 4, 8), weights=(4, 3, 2, 1))[0]
            request = GPURequest.reserved(min(gpus, gpus_per_node))
            group = PodGroup(ref, queue, size, priority=rng.choice((0, 100, 1000)), phase=PodGroupPhase.INQUEUE)
        else:
            queue = SPOT_QUEUES[n % len(SPOT_QUEUES)][0]
            if rng.random() < 0.7:
                request = GPURequest.spot(min(rng.choice((1, 1, 2)), gpus_per_node))
            else:
                request = GPURequest.shared(rng.choice((250, 500)))
            group = PodGroup(ref, queue, size, spot_priority=rng.choice(tiers), phase=PodGroupPhase.INQUEUE)
        groups.append(group)
        pods.extend(Pod(PodRef("jobs", f"{ref.name}-{k}"), ref.name, request, created_at=float(k)) for k in range(size))
        pending -= size
        n += 1
    return groups, pods


def _merge_shadows(
    drafts: list[_NodeDraft], shadows: list[ShadowPod], share: float, rng: random.Random
) -> list[ShadowPod]:
    """On a ``share`` of the nodes with ShadowPods, one ShadowPod holds them all plus one idle GPU."""
    by_node: dict[NodeName, list[ShadowPod]] = {}
    for shadow in shadows:
        by_node.setdefault(shadow.node, []).append(shadow)
    out: list[ShadowPod] = []
    for node_name, held in by_node.items():
        if rng.random() >= share:
            out.extend(held)
            continue
        first = min(held, key=lambda sh: (sh.created_at, sh.ref.name))
        draft = drafts[int(node_name.rsplit("-", 1)[1])]
        devices = [dev for sh in held for dev in sh.devices]
        idle = next((j for j in range(len(draft.gpus)) if draft.owner[j] is None and not draft.milli[j]), None)
        if idle is not None:
            devices.append(draft.gpus[idle])
        owner = first.container_ref
        for dev in devices:
            draft.owner[draft.gpus.index(dev)] = owner
        out.append(ShadowPod(first.ref, node_name, tuple(devices), group=first.group, created_at=first.created_at))
    return out


def with_preemptor(snapshot: Snapshot, gpus: int) -> Snapshot:
    """``snapshot`` without pending pods, plus one pending reserved gang of one ``gpus``-GPU pod."""
    group = PodGroup(PREEMPTOR, RESERVED_QUEUES[0][0], 1, priority=1000, phase=PodGroupPhase.INQUEUE)
    pod = Pod(PodRef(PREEMPTOR.namespace, "preemptor-0"), PREEMPTOR.name, GPURequest.reserved(gpus))
    placed = tuple(p for p in snapshot.pods if p.node is not None)
    names = {p.group for p in placed}
    groups = tuple(g for g in snapshot.groups if g.ref.name in names and g.ref.namespace == "spot")
    return Snapshot(snapshot.nodes, snapshot.queues, (*groups, group), (*placed, pod), snapshot.shadows)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    snapshot = synthetic_snapshot(
        args.nodes,
        args.gpus_per_node,
        args.pending_pods,
        args.running_spot_pods,
        seed=args.seed,
        shadow_reuse=args.shadow_reuse,
    )
    build_seconds = time.perf_counter() - t0
    config = SchedulerConfig()
    result, cycle_seconds, cycle_cpu_seconds = _timed_cycle(snapshot, config, args.profile)
    victims = _timed_victim_selection(with_preemptor(snapshot, args.gpus_per_node), config, args.victim_repeats)
    return _figures(
        args,
        snapshot,
        result=result,
        cycle_seconds=cycle_seconds,
        cycle_cpu_seconds=cycle_cpu_seconds,
        v=victims,
        build_seconds=build_seconds,
    )


def _timed_cycle(snapshot: Snapshot, config: SchedulerConfig, profile: int) -> tuple[CycleResult, float, float]:
    """One cycle, its wall and CPU seconds; with ``profile``, its top functions on stderr."""
    profiler = cProfile.Profile() if profile else None
    t0, c0 = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    result = run_cycle(snapshot, config, NOW)
    if profiler is not None:
        profiler.disable()
    cycle_seconds = time.perf_counter() - t0
    cycle_cpu_seconds = time.process_time() - c0
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(profile)
        out.write("\n--- by internal time ---\n")
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(profile)
        print(out.getvalue(), file=sys.stderr)
    return result, cycle_seconds, cycle_cpu_seconds


@dataclass(frozen=True, slots=True)
class _VictimTimings:
    wall_ms: list[float]
    cpu_ms: list[float]
    victims: list[str]
    possible: bool
    open_seconds: float


def _timed_victim_selection(snapshot: Snapshot, config: SchedulerConfig, repeats: int) -> _VictimTimings:
    """Victim selection for the preemptor, ``repeats`` times on one session (each discarded)."""
    timings: list[float] = []
    cpu_timings: list[float] = []
    victims: list[str] = []
    possible = False
    with collector_paused():  # as inside a cycle
        t0 = time.perf_counter()
        session = open_session(snapshot, config, NOW)
        open_seconds = time.perf_counter() - t0
        job = session.state.jobs[PREEMPTOR]
        for _ in range(max(1, repeats)):
            t0, c0 = time.perf_counter(), time.process_time()
            outcome = preempt_gang(session, job)
            timings.append((time.perf_counter() - t0) * 1000.0)
            cpu_timings.append((time.process_time() - c0) * 1000.0)
            possible = outcome.possible
            victims = sorted(str(v.ref) for v in outcome.victims)
            outcome.statement.discard()
        session.state.dispose()
    return _VictimTimings(timings, cpu_timings, victims, possible, open_seconds)


def _figures(
    args: argparse.Namespace,
    snapshot: Snapshot,
    *,
    result: CycleResult,
    cycle_seconds: float,
    cycle_cpu_seconds: float,
    v: _VictimTimings,
    build_seconds: float,
) -> dict[str, Any]:
    timings, cpu_timings, victims, possible, open_seconds = v.wall_ms, v.cpu_ms, v.victims, v.possible, v.open_seconds
    spot_binds = sum(1 for b in result.binds if b.resource == SPOT_GPU_RESOURCE)
    pods_placed = len(result.binds)
    figures: dict[str, Any] = {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "pending_pods": args.pending_pods,
        "running_spot_pods": sum(1 for p in snapshot.pods if p.node is not None),
        "seed": args.seed,
        "shadow_reuse": args.shadow_reuse,
        "shadows": len(snapshot.shadows),
        "pods_placed": pods_placed,
        "reserved_pods_placed": pods_placed - spot_binds,
        "spot_pods_placed": spot_binds,
        "gangs_placed": result.stats.gangs_placed,
        "gangs_unschedulable": len(result.unschedulable),
        "gangs_preempting": result.stats.gangs_preempting,
        "pods_evicted": result.stats.pods_evicted,
        "shadows_created": result.stats.shadows_created,
        "cycle_seconds": round(cycle_seconds, 6),
        "cycle_cpu_seconds": round(cycle_cpu_seconds, 6),
        "pods_per_second": round(pods_placed / cycle_seconds, 1) if cycle_seconds > 0 else 0.0,
        "victim_selection_ms_p50": round(_percentile(timings, 0.5), 3),
        "victim_selection_ms_p99": round(_percentile(timings, 0.99), 3),
        "victim_selection_ms_max": round(max(timings), 3),
        "victim_selection_cpu_ms_p99": round(_percentile(cpu_timings, 0.99), 3),
        "victim_selection_possible": possible,
        "victim_gangs": len(victims),
        "victim_session_open_seconds": round(open_seconds, 4),
        "snapshot_build_seconds": round(build_seconds, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        "profiled": bool(args.profile),
    }
    at_target_shape = all(figures[k] == v for k, v in TARGET_SHAPE.items() if k != "running_spot_pods") and (
        args.running_spot_pods == TARGET_SHAPE["running_spot_pods"]
    )
    figures["targets"] = {
        "pods_per_second_min": TARGETS["pods_per_second"],
        "victim_selection_ms_p99_max": TARGETS["victim_selection_ms_p99"],
        "peak_rss_mb_max": TARGETS["peak_rss_mb"],
        "at_target_shape": at_target_shape,
        "met": figures["pods_per_second"] >= TARGETS["pods_per_second"]
        and figures["victim_selection_ms_p99"] <= TARGETS["victim_selection_ms_p99"]
        and figures["peak_rss_mb"] <= TARGETS["peak_rss_mb"],
    }
    return figures


def run(args: argparse.Namespace) -> int:
    for name in ("nodes", "gpus_per_node", "pending_pods", "running_spot_pods", "victim_repeats"):
        if getattr(args, name) < (1 if name in ("nodes", "gpus_per_node", "victim_repeats") else 0):
            print(f"spotgpu bench scheduler: --{name.replace('_', '-')} is out of range", file=sys.stderr)
            return 2
    if not 0.0 <= args.shadow_reuse <= 1.0:
        print("spotgpu bench scheduler: --shadow-reuse must be between 0 and 1", file=sys.stderr)
        return 2
    before = env.load_average()
    with env.background_load(args.background_load):
        figures = measure(args)
    figures["environment"] = env.environment(
        background_load=args.background_load, load_before=before, load_after=env.load_average()
    )
    if args.json:
        print(json.dumps(figures, sort_keys=False))
    else:
        for key, value in figures.items():
            print(f"{key:32} {value}")
    return 0


__all__ = ["PREEMPTOR", "add_arguments", "run", "synthetic_snapshot", "with_preemptor"]
