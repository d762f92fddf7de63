"""Scenario files: cluster, owners, job streams, latencies and the policies to compare.

Pure apart from :func:`load_scenario` / :func:`default_scenario`, which read one YAML file, and
:func:`build_workload`, which asks the workload sources for their data (they read traces).
Validation goes through :func:`spotgpu.core.config.from_mapping`, so every error is a
:class:`~spotgpu.core.config.ConfigError` whose message starts with the key path
(``owners[1].devmachine.arriveJitter: ...``). The format is documented in docs/simulator.md;
the embedded default is ``spotgpu/sim/data/default.yaml``.

Each owner group and job stream names its ``source`` and carries that source's settings in a
section of the same name (``source: helios`` + ``helios: {...}``); the section is loaded into
the source's own ``config_type`` (see :mod:`spotgpu.sim.workloads.base`), so a new source
needs no change here.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from spotgpu.core.config import LendPolicyKind, PredictiveConfig
from spotgpu.core.configfile import ConfigError, Seconds, from_mapping, read_yaml
from spotgpu.core.types import NodeStrategy, SpotPriority
from spotgpu.scheduler.config import SchedulerConfig
from spotgpu.sim import defaults
from spotgpu.sim.inputs import StreamUse
from spotgpu.sim.latency import Latencies
from spotgpu.sim.workloads import (
    JOB_SOURCES,
    OWNER_SOURCES,
    JobRequest,
    LeaseRule,
    OwnerRequest,
    OwnerTrace,
    PriorityRule,
)
from spotgpu.sim.workloads.base import TraceJob, WorkloadError

DEFAULT_SCENARIO: Final = Path(__file__).resolve().parent / "data" / "default.yaml"
EMBEDDED_SCENARIOS: Final = {"default": DEFAULT_SCENARIO, "bursty": DEFAULT_SCENARIO.with_name("bursty.yaml")}
"""Scenarios shipped with spotgpu, by the name ``spotgpu simulate --scenario NAME`` takes."""
DAY: Final = 86400.0
_ONE_DAY: Final = Seconds(DAY)
_NEVER: Final = Seconds(0.0)
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


def _check_name(key: str, value: str) -> None:
    if not value or len(value) > 30 or not set(value) <= _NAME_CHARS or not value[0].isalpha() or value[-1] == "-":
        raise ConfigError(
            f"{key}: {value!r} must be 1..30 lowercase letters, digits and '-', starting with a letter"
            " (it becomes part of pod names)"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: int = 64
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ConfigError(f"nodes: must be at least 1, got {self.nodes}")
        if not 1 <= self.gpus_per_node <= 64:
            raise ConfigError(f"gpusPerNode: must be within 1..64, got {self.gpus_per_node}")


@dataclasses.dataclass(frozen=True, slots=True)
class PolicySpec:
    """One policy to simulate. ``lending: false`` is the baseline: spot work only on unallocated
    GPUs (through ShadowPods); allocated GPUs are never lent, whatever their owner does."""

    name: str
    lending: bool = True
    max_inactive_time: Seconds = defaults.MAX_INACTIVE_TIME_S
    strategy: NodeStrategy = NodeStrategy.LOWPOWER
    """Every node's strategy: ``lowpower``, ``idle`` or ``auto`` (docs/scheduler.md, "Strategies")."""
    guard: bool = True
    """Return detection by the guard (event); false: by the detector's polling only."""
    recommended: bool = False
    """The policy the project recommends (at most one per scenario); marked in the report."""
    lend_policy: LendPolicyKind = LendPolicyKind.TIMER
    """When idle owners are lent: ``timer`` (after ``maxInactiveTime``) or ``predictive`` (also
    only when the owner's learned idle durations promise ``predictive.minExpectedIdle``)."""
    predictive: PredictiveConfig = dataclasses.field(default_factory=PredictiveConfig)
    """The owner-return model and the predictive policy's thresholds (``agent.lending.predictive``)."""

    def __post_init__(self) -> None:
        _check_name("name", self.name)


@dataclasses.dataclass(frozen=True, slots=True)
class OwnerGroupKeys:
    """An entry of ``owners:`` without its source section."""

    name: str
    source: str
    nodes: int | None = None
    share: float | None = None
    gpus_per_owner: int = 8


@dataclasses.dataclass(frozen=True, slots=True)
class OwnerGroup(OwnerGroupKeys):
    """Owners of one source; they hold whole nodes' GPUs (``nodes`` or a ``share`` of all nodes).
    ``config`` is the source's section, loaded into its ``config_type``."""

    config: Any = None


@dataclasses.dataclass(frozen=True, slots=True)
class JobStreamKeys:
    """An entry of ``spotJobs:`` or ``reservedJobs:`` without its source section."""

    name: str
    source: str
    load: float | None = None
    scale: float | None = None
    priority: PriorityRule = dataclasses.field(default_factory=PriorityRule)
    min_lease: LeaseRule = dataclasses.field(default_factory=LeaseRule)
    """Spot streams: the minimum lease each job declares (:mod:`spotgpu.sim.workloads.lease`)."""
    reserved_priority: int = 1000
    gpus_per_pod: int | None = None
    max_gpus: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class JobStream(JobStreamKeys):
    """Jobs of one source, submitted as spot gangs (``spotJobs``) or reserved gangs (``reservedJobs``)."""

    config: Any = None
    spot: bool = True


def _fields_of(keys: OwnerGroupKeys | JobStreamKeys) -> dict[str, Any]:
    return {f.name: getattr(keys, f.name) for f in dataclasses.fields(keys)}


@dataclasses.dataclass(frozen=True, slots=True)
class _ScenarioKeys:
    name: str = "scenario"
    description: str = ""
    seed: int = 1
    duration: Seconds = _ONE_DAY
    cluster: ClusterSpec = dataclasses.field(default_factory=ClusterSpec)
    checkpoint_interval: Seconds = _NEVER
    latencies: Latencies = dataclasses.field(default_factory=Latencies)
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    sample_interval: Seconds = defaults.SAMPLE_INTERVAL_S
    policies: tuple[PolicySpec, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Scenario:
    """A validated scenario. Build with :func:`parse_scenario`; resize with :meth:`resized`."""

    name: str
    seed: int
    duration: float
    cluster: ClusterSpec
    owners: tuple[OwnerGroup, ...]
    spot_jobs: tuple[JobStream, ...]
    reserved_jobs: tuple[JobStream, ...]
    policies: tuple[PolicySpec, ...]
    latencies: Latencies = dataclasses.field(default_factory=Latencies)
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    checkpoint_interval: float = 0.0
    """Spot jobs save their progress this often (0: never; an evicted job restarts from scratch)."""
    sample_interval: float = defaults.SAMPLE_INTERVAL_S
    description: str = ""
    base_dir: Path = Path(".")
    path: Path | None = None
    """The scenario file it was read from (None: built in code); trace errors name it."""

    def group_nodes(self) -> list[int]:
        """Nodes of each owner group, in order (shares of the current node count, rounded)."""
        out = []
        for group in self.owners:
            if group.nodes is not None:
                out.append(group.nodes)
            else:
                assert group.share is not None
                out.append(round(group.share * self.cluster.nodes))
        return out

    def resized(self, *, nodes: int | None = None, duration: float | None = None, seed: int | None = None) -> Scenario:
        """The same scenario on another cluster size, horizon or seed (``--nodes``/``--days``/``--seed``).

        Owner groups given as a ``share`` and job streams given as a ``load`` scale with the
        cluster; fixed ``nodes`` and ``scale`` do not.
        """
        cluster = self.cluster if nodes is None else dataclasses.replace(self.cluster, nodes=nodes)
        out = dataclasses.replace(
            self,
            cluster=cluster,
            duration=self.duration if duration is None else duration,
            seed=self.seed if seed is None else seed,
        )
        _check_layout(out)
        return out


def _check_layout(s: Scenario) -> None:
    if s.duration <= 0:
        raise ConfigError(f"duration: must be greater than zero, got {s.duration:g}s")
    gpn = s.cluster.gpus_per_node
    counts = s.group_nodes()
    if sum(counts) > s.cluster.nodes:
        raise ConfigError(
            f"owners: the groups need {sum(counts)} nodes ({', '.join(map(str, counts))}) but the cluster has "
            f"{s.cluster.nodes} (cluster.nodes)"
        )
    for i, group in enumerate(s.owners):
        if gpn % group.gpus_per_owner:
            raise ConfigError(
                f"owners[{i}].gpusPerOwner: {group.gpus_per_owner} must divide cluster.gpusPerNode ({gpn})"
            )


def _source_section(
    entry: Mapping[str, object], path: str, registry_names: tuple[str, ...]
) -> tuple[dict[str, object], str, object]:
    """Split an entry into its common keys and its source's section (named after the source)."""
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{path}: expected a mapping, got {type(entry).__name__}")
    source = entry.get("source")
    if not isinstance(source, str):
        raise ConfigError(f"{path}.source: required; one of {', '.join(registry_names)}")
    if source not in registry_names:
        raise ConfigError(f"{path}.source: {source!r} is not one of {', '.join(registry_names)}")
    for other in registry_names:
        if other != source and other in entry:
            raise ConfigError(f"{path}.{other}: a section for source {other!r}, but source is {source!r}")
    common = {k: v for k, v in entry.items() if k != source}
    section = entry.get(source)
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"{path}.{source}: expected a mapping, got {type(section).__name__}")
    return common, source, section


def _owner_group(entry: Mapping[str, object], path: str) -> OwnerGroup:
    common, source, section = _source_section(entry, path, OWNER_SOURCES.names())
    keys = from_mapping(OwnerGroupKeys, common, path)
    _check_name(f"{path}.name", keys.name)
    if (keys.nodes is None) == (keys.share is None):
        raise ConfigError(f"{path}: give exactly one of 'nodes' (a count) and 'share' (a fraction of cluster.nodes)")
    if keys.nodes is not None and keys.nodes < 0:
        raise ConfigError(f"{path}.nodes: must not be negative, got {keys.nodes}")
    if keys.share is not None and not 0 <= keys.share <= 1:
        raise ConfigError(f"{path}.share: must be within 0..1, got {keys.share}")
    if keys.gpus_per_owner < 1:
        raise ConfigError(f"{path}.gpusPerOwner: must be at least 1, got {keys.gpus_per_owner}")
    assert isinstance(section, Mapping)
    config = from_mapping(OWNER_SOURCES.get(source).config_type, section, f"{path}.{source}")
    return OwnerGroup(**_fields_of(keys), config=config)


def _job_stream(entry: Mapping[str, object], path: str, spot: bool) -> JobStream:
    common, source, section = _source_section(entry, path, JOB_SOURCES.names())
    if not spot and "priority" in common:
        raise ConfigError(f"{path}.priority: reserved jobs have no spot priority; use reservedPriority")
    if not spot and "minLease" in common:
        raise ConfigError(f"{path}.minLease: reserved jobs declare no minimum lease (spot jobs only)")
    keys = from_mapping(JobStreamKeys, common, path)
    _check_name(f"{path}.name", keys.name)
    if keys.load is not None and keys.scale is not None:
        raise ConfigError(f"{path}: give at most one of 'load' and 'scale'")
    if keys.load is not None and not 0 < keys.load <= 10:
        raise ConfigError(f"{path}.load: must be within (0, 10], got {keys.load}")
    if keys.scale is not None and not 0 < keys.scale <= 1000:
        raise ConfigError(f"{path}.scale: must be within (0, 1000], got {keys.scale}")
    if keys.gpus_per_pod is not None and keys.gpus_per_pod < 1:
        raise ConfigError(f"{path}.gpusPerPod: must be at least 1, got {keys.gpus_per_pod}")
    if keys.max_gpus is not None and keys.max_gpus < 1:
        raise ConfigError(f"{path}.maxGpus: must be at least 1, got {keys.max_gpus}")
    assert isinstance(section, Mapping)
    config = from_mapping(JOB_SOURCES.get(source).config_type, section, f"{path}.{source}")
    return JobStream(**_fields_of(keys), config=config, spot=spot)


def _list(data: Mapping[str, object], key: str) -> list[object]:
    value = data.get(key, [])
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list, got {type(value).__name__}")
    return value


def parse_scenario(data: object, base_dir: Path = Path(".")) -> Scenario:
    """Validate a scenario mapping (parsed YAML); relative trace paths resolve against ``base_dir``."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"<root>: a scenario is a mapping, got {type(data).__name__}")
    lists = ("owners", "spotJobs", "reservedJobs")
    top = from_mapping(_ScenarioKeys, {k: v for k, v in data.items() if k not in lists})
    owners = tuple(_owner_group(e, f"owners[{i}]") for i, e in enumerate(_list(data, "owners")))  # type: ignore[arg-type]
    spot = tuple(_job_stream(e, f"spotJobs[{i}]", True) for i, e in enumerate(_list(data, "spotJobs")))  # type: ignore[arg-type]
    reserved = tuple(
        _job_stream(e, f"reservedJobs[{i}]", False)  # type: ignore[arg-type]
        for i, e in enumerate(_list(data, "reservedJobs"))
    )
    for key, items in (("owners", owners), ("spotJobs", spot), ("reservedJobs", reserved)):
        names = [x.name for x in items]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"{key}: names must be unique, {dup} repeated")
    stream_names = [s.name for s in (*spot, *reserved)]
    if len(set(stream_names)) != len(stream_names):
        raise ConfigError("spotJobs: spot and reserved streams must have different names")
    policies = top.policies or DEFAULT_POLICIES
    pnames = [p.name for p in policies]
    if len(set(pnames)) != len(pnames):
        raise ConfigError(f"policies: names must be unique, got {pnames}")
    marked = [p.name for p in policies if p.recommended]
    if len(marked) > 1:
        raise ConfigError(f"policies: at most one policy may be recommended, got {marked}")
    if top.checkpoint_interval < 0:
        raise ConfigError("checkpointInterval: must not be negative")
    if top.sample_interval <= 0:
        raise ConfigError("sampleInterval: must be greater than zero")
    scenario = Scenario(
        name=top.name,
        seed=top.seed,
        duration=float(top.duration),
        cluster=top.cluster,
        owners=owners,
        spot_jobs=spot,
        reserved_jobs=reserved,
        policies=policies,
        latencies=top.latencies,
        scheduler=top.scheduler,
        checkpoint_interval=float(top.checkpoint_interval),
        sample_interval=float(top.sample_interval),
        description=top.description,
        base_dir=base_dir,
    )
    _check_layout(scenario)
    return scenario


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario YAML file (errors name the file and the key)."""
    data = read_yaml(path, "scenario")
    try:
        return dataclasses.replace(parse_scenario(data, path.resolve().parent), path=path)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def default_scenario() -> Scenario:
    """The embedded default scenario (``spotgpu simulate`` with no arguments)."""
    return load_scenario(DEFAULT_SCENARIO)


def scenario_argument(text: str) -> Scenario:
    """``--scenario``: an embedded scenario's name (no ``/`` and no ``.``) or a YAML file's path."""
    if "/" in text or "." in text:
        return load_scenario(Path(text))
    path = EMBEDDED_SCENARIOS.get(text)
    if path is None:
        raise ConfigError(
            f"--scenario: {text!r} is not an embedded scenario ({', '.join(EMBEDDED_SCENARIOS)}); a file path has"
            " a '/' or a suffix (./my-scenario.yaml)"
        )
    return load_scenario(path)


def _policy_set(*entries: PolicySpec) -> tuple[PolicySpec, ...]:
    """A policy set in order, recommending the *last* entry marked ``recommended`` (earlier marks
    are dropped): a newer recommendation is one entry appended, nothing else changes."""
    marked = [i for i, p in enumerate(entries) if p.recommended]
    pick = marked[-1] if marked else -1
    return tuple(dataclasses.replace(p, recommended=i == pick) for i, p in enumerate(entries))


DEFAULT_POLICIES: Final = _policy_set(
    PolicySpec("baseline", lending=False, strategy=NodeStrategy.IDLE),
    PolicySpec("lowpower-2m", max_inactive_time=Seconds(120.0), recommended=True),
    PolicySpec("lowpower-10m", max_inactive_time=Seconds(600.0)),
    PolicySpec("lowpower-30m", max_inactive_time=Seconds(1800.0)),
    PolicySpec("idle-10m", max_inactive_time=Seconds(600.0), strategy=NodeStrategy.IDLE),
    PolicySpec("predictive-2m", max_inactive_time=Seconds(120.0), lend_policy=LendPolicyKind.PREDICTIVE),
    # The agent's defaults (AgentConfig: maxInactiveTime, lending) on the scheduler's default node
    # strategy: chosen on a set of scenarios (docs/simulator.md, "The recommended policy").
    PolicySpec(
        "auto-predictive",
        max_inactive_time=defaults.MAX_INACTIVE_TIME_S,
        strategy=NodeStrategy.AUTO,
        lend_policy=LendPolicyKind.PREDICTIVE,
        recommended=True,
    ),
    # A new recommendation: append its entry with recommended=True (the last mark wins).
)
"""Used when a scenario lists no policies: the baseline, three ``maxInactiveTime`` values with
the ``lowpower`` strategy, the ``idle`` strategy at the agent's default 10 min, the predictive
policy at 2 min, and the recommended policy, ``auto-predictive``: what a cluster runs by default
(the agent's ``maxInactiveTime`` and ``lending`` defaults, the ``auto`` node strategy)."""


# --- the workload a scenario implies (identical for every policy) -----------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class OwnerSlot:
    """An owner placed on the cluster: ``node`` index and the first GPU index it holds."""

    trace: OwnerTrace
    group: str
    node: int
    first_gpu: int


@dataclasses.dataclass(frozen=True, slots=True)
class JobSpec:
    """A job to submit: a gang of ``len(pod_gpus)`` pods, all needed (minMember = all)."""

    name: str
    stream: str
    origin: str
    arrival: float
    duration: float
    pod_gpus: tuple[int, ...]
    priority: SpotPriority | None
    """Spot priority; None for reserved jobs."""
    reserved_priority: int = 0
    min_lease: float = 0.0
    """Spot: the minimum lease in seconds the gang declares (``PodGroup.min_lease``; 0: none)."""

    @property
    def gpus(self) -> int:
        return sum(self.pod_gpus)

    @property
    def spot(self) -> bool:
        return self.priority is not None


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    """Everything the sources produced for a scenario: the same input for every policy."""

    owners: tuple[OwnerSlot, ...]
    jobs: tuple[JobSpec, ...]
    spare_nodes: int
    """Nodes no owner group holds (their GPUs start unallocated)."""
    streams: tuple[StreamUse, ...] = ()


def _pods(gpus: int, per_pod: int) -> tuple[int, ...]:
    full, rest = divmod(gpus, per_pod)
    return (per_pod,) * full + ((rest,) if rest else ())


def build_workload(s: Scenario) -> Workload:
    """Ask every source for its owners and jobs, place owners on nodes, split jobs into pods.

    Owner groups take consecutive nodes in order; the remaining nodes are unallocated. Job
    names are ``<stream>-<n>`` in arrival order. Raises :class:`ConfigError` naming the group or
    stream whose source failed (and the scenario file, when it came from one: ``s.yaml:
    spotJobs[0] (itp): trace.csv:7: duration: 'x' is not a number of seconds``).
    """
    gpn = s.cluster.gpus_per_node
    total_gpus = s.cluster.nodes * gpn
    slots: list[OwnerSlot] = []
    node = 0
    for i, (group, count) in enumerate(zip(s.owners, s.group_nodes(), strict=True)):
        per_node = gpn // group.gpus_per_owner
        request = OwnerRequest(group.name, count * per_node, group.gpus_per_owner, s.duration, str(s.seed), s.base_dir)
        try:
            traces = OWNER_SOURCES.get(group.source).build(group.config, request)
        except WorkloadError as exc:
            raise ConfigError(f"{_file(s)}owners[{i}] ({group.name}): {exc}") from None
        if len(traces) != request.count:
            raise ConfigError(
                f"{_file(s)}owners[{i}] ({group.name}): source gave {len(traces)} owners, {request.count} needed"
            )
        for j, trace in enumerate(traces):
            slots.append(OwnerSlot(trace, group.name, node + j // per_node, (j % per_node) * group.gpus_per_owner))
        node += count
    jobs: list[JobSpec] = []
    streams: list[StreamUse] = []
    for key, configured in (("spotJobs", s.spot_jobs), ("reservedJobs", s.reserved_jobs)):
        for i, stream in enumerate(configured):
            max_gpus = min(stream.max_gpus or total_gpus, total_gpus)
            target = None if stream.load is None else stream.load * total_gpus * s.duration
            scale = None if stream.load is not None else 1.0 if stream.scale is None else stream.scale
            job_request = JobRequest(
                stream.name, s.duration, target, scale, max_gpus, f"{s.seed}:{stream.name}", s.base_dir
            )
            try:
                raw = JOB_SOURCES.get(stream.source).build(stream.config, job_request)
            except WorkloadError as exc:
                raise ConfigError(f"{_file(s)}{key}[{i}] ({stream.name}): {exc}") from None
            jobs.extend(_job_specs(stream, raw, stream.gpus_per_pod or gpn))
            uses = Counter(j.origin for j in raw)
            streams.append(
                StreamUse(f"{key}[{i}]", stream.name, stream.load, len(raw), len(uses), max(uses.values(), default=0))
            )
    jobs.sort(key=lambda j: (j.arrival, j.name))
    return Workload(tuple(slots), tuple(jobs), s.cluster.nodes - node, tuple(streams))


def _file(s: Scenario) -> str:
    return f"{s.path}: " if s.path is not None else ""


def _job_specs(stream: JobStream, raw: list[TraceJob], per_pod: int) -> list[JobSpec]:
    out = []
    width = max(5, len(str(len(raw))))
    for n, job in enumerate(raw):
        pods = _pods(job.gpus, per_pod)
        priority = stream.priority.assign(job) if stream.spot else None
        out.append(
            JobSpec(
                f"{stream.name}-{n:0{width}d}",
                stream.name,
                job.origin,
                job.arrival,
                job.duration,
                pods,
                priority,
                0 if stream.spot else stream.reserved_priority,
                stream.min_lease.assign(job) if stream.spot else 0.0,
            )
        )
    return out


__all__ = [
    "DEFAULT_POLICIES",
    "DEFAULT_SCENARIO",
    "EMBEDDED_SCENARIOS",
    "ClusterSpec",
    "JobSpec",
    "JobStream",
    "JobStreamKeys",
    "OwnerGroup",
    "OwnerGroupKeys",
    "OwnerSlot",
    "PolicySpec",
    "Scenario",
    "Workload",
    "build_workload",
    "default_scenario",
    "load_scenario",
    "parse_scenario",
    "scenario_argument",
]
