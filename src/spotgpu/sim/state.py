"""One policy run's shared state, grouped: the run's inputs and recorders (:class:`Run`), the
simulated world (:class:`World`), the node indexes trimming reads (:class:`NodeIndex`), the
running spot gangs (:class:`PlacedSpot`) and the cycle timer (:class:`Cycles`).

No I/O. The components of a run (:mod:`spotgpu.sim.owners`, :mod:`spotgpu.sim.snapshot`,
:mod:`spotgpu.sim.apply`, :mod:`spotgpu.sim.jobs`) each hold the parts they need;
:class:`spotgpu.sim.simulation.Simulation` builds them and dispatches the events.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from spotgpu.agent.model import EvictionPlan, plan_eviction
from spotgpu.core.ids import DeviceID, NodeName
from spotgpu.core.lending import Action
from spotgpu.core.mapping_cache import MappingSnapshot
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import GPU_MILLI, EvictionReason
from spotgpu.ports.node import GpuDevice
from spotgpu.scheduler.config import SchedulerConfig
from spotgpu.scheduler.decisions import CycleResult
from spotgpu.scheduler.model import Snapshot, VictimScale
from spotgpu.sim.engine import Engine, Priority
from spotgpu.sim.events import Cycle, Event
from spotgpu.sim.invariants import InvariantChecker
from spotgpu.sim.latency import Latencies
from spotgpu.sim.metrics import Metrics
from spotgpu.sim.model import Category, GpuSim, JobSim, NodeSim, OwnerSim, PodSim, ShadowSim
from spotgpu.sim.scenario import PolicySpec, Scenario, Workload

OWNER_NAMESPACE: Final = "owners"
CONTAINER: Final = "main"

SchedulerFn = Callable[[Snapshot, SchedulerConfig, float], CycleResult]
EvictionPlanner = Callable[[MappingSnapshot, ContainerRef, Sequence[DeviceID], float], EvictionPlan]


def real_scheduler(snapshot: Snapshot, config: SchedulerConfig, now: float) -> CycleResult:
    """The scheduler core's cycle (imported here so that a test can pass another one)."""
    from spotgpu.scheduler import run_cycle

    return run_cycle(snapshot, config, now)


def agent_eviction_plan(
    snapshot: MappingSnapshot, owner: ContainerRef, devices: Sequence[DeviceID], at: float
) -> EvictionPlan:
    """The agent's eviction plan for a returning owner (no API or runtime view in a simulation)."""
    return plan_eviction(snapshot, owner, devices, {}, [], reason=EvictionReason.OWNER_BACK, at=at)


@dataclass(frozen=True, slots=True)
class Hooks:
    """What a caller may swap: the decision code (tests inject faulty ones), progress, a timer."""

    scheduler: SchedulerFn = real_scheduler
    plan_eviction: EvictionPlanner = agent_eviction_plan
    progress: Callable[[float], None] | None = None
    """Called with the simulated fraction done (0..1), about 200 times per run."""
    perf_counter: Callable[[], float] = time.perf_counter
    trim_snapshots: bool = True
    """Leave out of a cycle's snapshot the nodes that cannot take part in its decisions."""
    cap_pending: bool = True
    """With ``trim_snapshots``: offer only the pending spot gangs that could be placed (see
    :meth:`spotgpu.sim.snapshot.Snapshots.spot_candidates`)."""
    lending_log: list[Action] | None = None
    """When a list, every action of every owner's lending state machine is appended (tests)."""


@dataclass(slots=True)
class Run:
    """What every component of one policy run shares: its inputs, the clock and the recorders."""

    scenario: Scenario
    policy: PolicySpec
    hooks: Hooks
    horizon: float
    engine: Engine[Event] = field(default_factory=Engine)
    rng: random.Random = field(init=False)
    """Draws of the measured latencies (one stream per run, in event order)."""
    checker: InvariantChecker = field(init=False)
    metrics: Metrics = field(init=False)
    profile: dict[str, float] = field(default_factory=lambda: {"scheduler_s": 0.0, "snapshot_s": 0.0, "apply_s": 0.0})

    def __post_init__(self) -> None:
        s = self.scenario
        self.rng = random.Random(f"{s.seed}:latencies")
        self.checker = InvariantChecker(self.policy.name, self.policy.lending, s.latencies)
        self.metrics = Metrics.of(s.cluster.nodes * s.cluster.gpus_per_node)

    @property
    def lat(self) -> Latencies:
        return self.scenario.latencies

    def touch(self, gpu: GpuSim) -> None:
        """Recompute what ``gpu`` is doing after a change, for the metrics."""
        spot = gpu.running_spot()
        if gpu.reserved_pod is not None:
            cat = Category.RESERVED
        elif gpu.owner_sim is not None:
            if gpu.owner_sim.active:
                cat = Category.SPOT_EXPOSED if spot else Category.OWNER_ACTIVE
            else:
                cat = Category.SPOT_LENT if spot else Category.OWNER_IDLE
        elif spot:
            cat = Category.SPOT_UNALLOCATED
        elif gpu.shadow is not None:
            cat = Category.SHADOW_IDLE
        else:
            cat = Category.FREE
        if cat is not gpu.category:
            self.metrics.time.move(gpu.category, cat)
            gpu.category = cat


@dataclass(slots=True)
class World:
    """The simulated cluster: nodes, owners, jobs, their pods and ShadowPods. Build with :meth:`build`."""

    nodes: list[NodeSim]
    nodes_by_name: dict[str, NodeSim]
    gpu_devices: dict[DeviceID, GpuDevice]
    owners: list[OwnerSim]
    jobs: list[JobSim]
    job_by_group: dict[PodRef, JobSim]
    pods: dict[PodRef, PodSim] = field(default_factory=dict)
    shadows: dict[PodRef, ShadowSim] = field(default_factory=dict)
    pending: dict[int, JobSim] = field(default_factory=dict)
    """Jobs waiting for placement, by index (insertion order = submission order)."""
    nominated: dict[DeviceID, PodSim] = field(default_factory=dict)
    """Devices kept for a preempting reserved pod (no spot pod may take them)."""
    idle_shadows: dict[PodRef, ShadowSim] = field(default_factory=dict)
    """ShadowPods without users, not being deleted (the scheduler collects them after a grace)."""

    @classmethod
    def build(cls, scenario: Scenario, workload: Workload) -> World:
        """Nodes of ``gpusPerNode`` GPUs, the workload's owners on them (each with its poll phase), its jobs."""
        gpn = scenario.cluster.gpus_per_node
        nodes: list[NodeSim] = []
        devices: dict[DeviceID, GpuDevice] = {}
        for n in range(scenario.cluster.nodes):
            node = NodeSim(n, NodeName(f"node-{n:05d}"))
            for i in range(gpn):
                gpu = GpuSim(DeviceID(f"GPU-{n:05d}-{i}"), i, node)
                node.gpus.append(gpu)
                devices[gpu.id] = GpuDevice(gpu.id, i)
            nodes.append(node)
        owners: list[OwnerSim] = []
        detect = scenario.latencies.detect_interval
        for k, slot in enumerate(workload.owners):
            node = nodes[slot.node]
            gpus = node.gpus[slot.first_gpu : slot.first_gpu + slot.trace.gpus]
            ref = ContainerRef(OWNER_NAMESPACE, slot.trace.name, CONTAINER)
            phase = random.Random(f"{scenario.seed}:poll:{slot.trace.name}").random() * detect
            owner = OwnerSim(k, slot.trace, ref, gpus, phase)
            for gpu in gpus:
                gpu.owner = ref
                gpu.owner_sim = owner
            owners.append(owner)
        jobs = [JobSim(i, spec) for i, spec in enumerate(workload.jobs)]
        return cls(nodes, {n.name: n for n in nodes}, devices, owners, jobs, {j.group_ref: j for j in jobs})


@dataclass(slots=True)
class NodeIndex:
    """Which nodes changed since their scheduler objects were built, and where there is room
    (maintained by :meth:`spotgpu.sim.snapshot.Snapshots.rebuild_node`)."""

    dirty: set[NodeSim]
    spot_room: set[NodeSim] = field(default_factory=set)
    """Nodes with a free Healthy twin (room for spot pods)."""
    unalloc_nodes: set[NodeSim] = field(default_factory=set)
    """Nodes with unallocated or ShadowPod-held GPUs (where reserved pods can go, maybe after preemption)."""
    real_room: set[NodeSim] = field(default_factory=set)
    """Nodes with an unallocated, unused, un-nominated real GPU (room for reserved pods)."""
    lent_nodes: set[NodeSim] = field(default_factory=set)
    """Nodes with a lent owner (their agents publish idle forecasts)."""
    room: int = 0
    """The sum of every node's :attr:`NodeSim.room` (the spot room on unallocated GPUs, in milli)."""


@dataclass(slots=True)
class PlacedSpot:
    """Spot gangs bound and not evicted, in bind order (the first started earliest), and how
    many of them have each (pods, GPU milli): the victim score's normalisation maxima."""

    gangs: dict[int, JobSim] = field(default_factory=dict)
    sizes: dict[tuple[int, int], int] = field(default_factory=dict)

    def add(self, job: JobSim) -> None:
        self.gangs[job.index] = job
        size = (len(job.pods), job.spec.gpus * GPU_MILLI)
        self.sizes[size] = self.sizes.get(size, 0) + 1

    def discard(self, job: JobSim) -> None:
        """``job`` no longer counts among the running spot gangs (evicted or done)."""
        if self.gangs.pop(job.index, None) is not None:
            size = (len(job.pods), job.spec.gpus * GPU_MILLI)
            left = self.sizes[size] - 1
            if left:
                self.sizes[size] = left
            else:
                del self.sizes[size]

    def victim_scale(self) -> VictimScale:
        """The victim score's normalisation over every running spot gang (for trimmed snapshots).

        The scheduler's facts per gang are its placed pods not being evicted, their GPU milli and
        its earliest pod start; in the model a bound spot gang has all its pods placed, started at
        ``bound_at``, until it is evicted (pods evicting) or done.
        """
        first = next(iter(self.gangs.values()), None)
        return VictimScale(
            tasks=max((t for t, _ in self.sizes), default=0),
            milli=max((m for _, m in self.sizes), default=0),
            earliest_start=first.bound_at if first is not None else None,
        )


class Cycles:
    """When the next scheduling cycle runs: only when there is work for one, at most once per period."""

    __slots__ = ("at", "handle", "last", "period", "run", "world")

    def __init__(self, run: Run, world: World) -> None:
        self.run = run
        self.world = world
        self.period = run.lat.period(run.scenario.cluster.nodes)
        self.handle: int | None = None
        self.at = math.inf
        self.last = -math.inf

    def want(self, at: float | None = None, force: bool = False) -> None:
        """Ask for a cycle (at ``at`` or as soon as the period allows), when there is work for one."""
        if not force and not self.world.pending:
            return
        engine = self.run.engine
        when = max(engine.now if at is None else at, self.last + self.period)
        if when >= self.at or when > self.run.horizon:
            return
        if self.handle is not None:
            engine.cancel(self.handle)
        self.handle = engine.at(when, Cycle(), Priority.SCHEDULER)
        self.at = when

    def started(self, now: float) -> None:
        """The cycle asked for runs now."""
        self.handle = None
        self.at = math.inf
        self.last = now


__all__ = [
    "CONTAINER",
    "OWNER_NAMESPACE",
    "Cycles",
    "EvictionPlanner",
    "Hooks",
    "NodeIndex",
    "PlacedSpot",
    "Run",
    "SchedulerFn",
    "World",
    "agent_eviction_plan",
    "real_scheduler",
]
