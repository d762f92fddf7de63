"""Run every policy of a scenario on the same workload and assemble the summary.

Side effects: with ``workers > 1`` it forks worker processes (one policy each; results do not
depend on the number of workers, each policy run is deterministic on its own) and reads the
wall clock for ``wall_seconds``. The summary's keys are documented in docs/simulator.md; the
``policies`` entries are :func:`spotgpu.sim.metrics.summarize`'s plus the policy settings.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Final

from spotgpu import __version__
from spotgpu.core.configfile import ConfigError
from spotgpu.core.types import NodeStrategy
from spotgpu.sim.inputs import LATENCY_MODEL, scenario_summary
from spotgpu.sim.metrics import share_of_best, useful_gain_gpu_hours
from spotgpu.sim.scenario import PolicySpec, Scenario, Workload, build_workload
from spotgpu.sim.simulation import PolicyRun, run_policy
from spotgpu.sim.state import Hooks

ATTRIBUTION: Final = (
    {
        "data": "Helios Earth per-team GPU series (May 2020)",
        "source": "github.com/S-Lab-System-Group/HeliosArtifact (derived from SenseTime's Helios traces)",
        "license": "repository MIT, Copyright (c) 2021-present NTU S-Lab; Helios data CC BY 4.0",
        "cite": "Hu et al., Characterization and Prediction of Deep Learning Workloads in Large-Scale GPU "
        "Datacenters, SC'21",
    },
    {
        "data": "ElasticFlow traces (Microsoft ITP clusters, 2021)",
        "source": "github.com/microsoft/elasticflow-traces",
        "license": "MIT, Copyright (c) Microsoft Corporation",
        "cite": "Gu et al., ElasticFlow: An Elastic Serverless Training Platform for Distributed Deep Learning, "
        "ASPLOS'23",
    },
)
"""Attribution of the traces the embedded excerpts come from (shown in every report)."""

ProgressFn = Callable[[str, float], None]
"""Called with (policy name, fraction of its simulated time done)."""


@dataclass(slots=True)
class SimulationResult:
    scenario: Scenario
    workload: dict[str, object]
    runs: list[PolicyRun]
    wall_seconds: float
    build_seconds: float
    workers: int
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        """The JSON document of ``--json`` and ``summary.json``."""
        baseline = next((run for run in self.runs if not run.policy.lending), None)
        entries = [policy_entry(run, baseline) for run in self.runs]
        gains = [gain for e in entries if isinstance(gain := e["useful_gain_gpu_hours"], float)]
        best = max(gains, default=0.0)
        for entry in entries:
            gain = entry["useful_gain_gpu_hours"]
            entry["useful_gain_share_of_best"] = share_of_best(gain, best) if isinstance(gain, float) else None
        return {
            "spotgpu_version": __version__,
            "scenario": self.workload,
            "baseline_policy": baseline.policy.name if baseline is not None else None,
            "policies": entries,
            "notes": list(NOTES),
            "wall_seconds": round(self.wall_seconds, 3),
            "profile": {
                "workload_build_s": round(self.build_seconds, 3),
                "workers": self.workers,
                "policies": {
                    run.policy.name: {k: round(v, 3) for k, v in sorted(run.profile.items())} for run in self.runs
                },
            },
            "attribution": list(ATTRIBUTION),
        }


NOTES: Final = (
    "spot_wait_s_* and reserved_wait_s_* are over every submitted job: a job not started by the end of the run is "
    "censored there (its wait counts as end - submit, a lower bound), *_wait_censored says how many; "
    "*_wait_started_s_* count started jobs only",
    "latencies: " + LATENCY_MODEL + " (scenario.latencies lists the tables and their sources)",
    "useful_gain_gpu_hours: what lending wins, useful spot GPU-hours (spot - wasted) minus the baseline policy's "
    "(the first without lending; null when the run has none); useful_gain_share_of_best: that gain over the "
    "largest gain of the run",
    "reclaimed_gpu_hours: spot GPU-hours on lent GPUs, wasted work included, and including work that would "
    "otherwise have run on unallocated GPUs; not the win",
    "spot_jobs_completed_vs_baseline: spot jobs completed minus the baseline policy's (the first without lending); "
    "wasted_spot_percent: wasted spot GPU-hours / all spot GPU-hours",
)
"""What the summary's figures mean where a reader could mistake them (repeated in the report)."""


def policy_entry(run: PolicyRun, baseline: PolicyRun | None) -> dict[str, object]:
    """A policy's summary entry: its run's figures, whether it is recommended, and how it compares."""
    figures = run.summary
    spot = float(figures["spot_gpu_hours"])  # type: ignore[arg-type]
    wasted = float(figures["wasted_spot_gpu_hours"])  # type: ignore[arg-type]
    delta: int | None = None
    gain: float | None = None
    if baseline is not None:
        delta = int(figures["spot_jobs_completed"]) - int(baseline.summary["spot_jobs_completed"])  # type: ignore[call-overload]
        gain = useful_gain_gpu_hours(
            float(figures["useful_spot_gpu_hours"]),  # type: ignore[arg-type]
            float(baseline.summary["useful_spot_gpu_hours"]),  # type: ignore[arg-type]
        )
    return {
        "name": figures["name"],
        "recommended": run.policy.recommended,
        "useful_gain_gpu_hours": gain,
        "useful_gain_share_of_best": None,
        # the share of the run's largest gain: set by SimulationResult.summary, which sees every policy
        **figures,
        "spot_jobs_completed_vs_baseline": delta,
        "wasted_spot_percent": round(100.0 * wasted / spot, 3) if spot > 0 else 0.0,
    }


def select_policies(scenario: Scenario, names: Sequence[str] | None) -> tuple[PolicySpec, ...]:
    """The scenario's policies named in ``names`` (``--policies``), in that order; all for None."""
    known = {p.name: p for p in scenario.policies}
    if names is None:
        return scenario.policies
    if not names:
        raise ConfigError(f"--policies: no policy named; the scenario has {', '.join(known)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"--policies: {repeated} named more than once")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"--policies: {unknown} not in the scenario; it has {', '.join(known)}")
    return tuple(known[n] for n in names)


# Set before forking workers: the children inherit it instead of unpickling a large workload.
_FORK_STATE: dict[str, Any] = {}


def _worker(index: int) -> PolicyRun:
    scenario: Scenario = _FORK_STATE["scenario"]
    workload: Workload = _FORK_STATE["workload"]
    policy: PolicySpec = _FORK_STATE["policies"][index]
    hooks: Hooks = _FORK_STATE["hooks"]
    progress_queue: Any = _FORK_STATE["queue"]
    last = [-1.0]

    def report(fraction: float) -> None:
        if fraction - last[0] >= 0.01 or fraction >= 1.0:
            last[0] = fraction
            progress_queue.put((policy.name, fraction))

    return run_policy(scenario, workload, policy, replace(hooks, progress=report))


def simulate(
    scenario: Scenario,
    policies: Sequence[PolicySpec] | None = None,
    *,
    workers: int = 1,
    progress: ProgressFn | None = None,
    hooks: Hooks | None = None,
) -> SimulationResult:
    """Build the workload once, then simulate each policy on it (in ``workers`` processes)."""
    start = time.perf_counter()
    chosen = tuple(policies) if policies is not None else scenario.policies
    workload = build_workload(scenario)
    build_s = time.perf_counter() - start
    base = hooks or Hooks()
    workers = max(1, min(workers, len(chosen)))
    if workers > 1 and "fork" not in multiprocessing.get_all_start_methods():
        workers = 1
    runs: list[PolicyRun]
    if workers == 1:
        runs = []
        for policy in chosen:
            report = None if progress is None else (lambda f, name=policy.name: progress(name, f))
            runs.append(run_policy(scenario, workload, policy, replace(base, progress=report)))
    else:
        runs = _parallel(scenario, workload, chosen, base, workers=workers, progress=progress)
    wall = time.perf_counter() - start
    return SimulationResult(scenario, scenario_summary(scenario, workload), runs, wall, build_s, workers)


def _parallel(
    scenario: Scenario,
    workload: Workload,
    policies: tuple[PolicySpec, ...],
    hooks: Hooks,
    *,
    workers: int,
    progress: ProgressFn | None,
) -> list[PolicyRun]:
    ctx = multiprocessing.get_context("fork")
    progress_queue = ctx.SimpleQueue()
    _FORK_STATE.update(scenario=scenario, workload=workload, policies=policies, hooks=hooks, queue=progress_queue)
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            # Likely-longest first, so that no worker is left alone with a long policy at the end:
            # without lending, or with the idle strategy, spot work spreads over more nodes and
            # cycles are larger (measured on the default scenario at 5,000 nodes).
            order = sorted(range(len(policies)), key=lambda i: (_light(policies[i]), i))
            futures: dict[int, Future[PolicyRun]] = {i: pool.submit(_worker, i) for i in order}
            while not all(f.done() for f in futures.values()):
                _drain(progress_queue, progress)
                time.sleep(0.05)
            _drain(progress_queue, progress)
            return [futures[i].result() for i in range(len(policies))]
    finally:
        _FORK_STATE.clear()


def _light(policy: PolicySpec) -> bool:
    return policy.lending and policy.strategy is NodeStrategy.LOWPOWER


def _drain(progress_queue: Any, progress: ProgressFn | None) -> None:
    try:
        while not progress_queue.empty():
            name, fraction = progress_queue.get()
            if progress is not None:
                progress(name, fraction)
    except (OSError, EOFError, queue.Empty):  # pragma: no cover - a worker died; its future raises
        return


def default_workers() -> int:
    """One per CPU this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


__all__ = ["ATTRIBUTION", "NOTES", "SimulationResult", "default_workers", "policy_entry", "select_policies", "simulate"]
