"""The cluster simulator behind ``spotgpu simulate``: traces through the real scheduler and lending policy.

Public API (docs/simulator.md):

* :func:`~spotgpu.sim.scenario.load_scenario`, :func:`~spotgpu.sim.scenario.default_scenario`,
  :func:`~spotgpu.sim.scenario.parse_scenario`: a validated :class:`Scenario` (errors name the key);
* :func:`~spotgpu.sim.runner.simulate`: every policy of a scenario on one workload, returning a
  :class:`SimulationResult` whose ``summary()`` is the ``--json`` document;
* :func:`~spotgpu.sim.simulation.run_policy` / :class:`Simulation`: one policy, with
  :class:`Hooks` to swap the decision code (tests inject faulty schedulers and agents);
* :class:`InvariantViolation`: what a broken promise raises;
* :func:`~spotgpu.sim.report.write_outputs`, :func:`~spotgpu.sim.table.summary_table`,
  :func:`~spotgpu.sim.page.render_html`.

Modules: ``engine`` (the event heap), ``model`` (the cluster's state), ``events``, ``state``
(one run's shared state), ``simulation`` (the core dispatching events to ``owners`` (activity,
the agent's lending), ``jobs``, ``apply`` (decisions acted out) and ``snapshot`` (the scheduler's
view, trimmed)), ``lending``, ``schedview``, ``invariants``, ``metrics``, ``scenario``,
``workloads/`` (one source per module), ``defaults`` (every latency and its source),
``runner``, ``estimate`` (a run's cost, before it starts), ``table`` (the terminal table), ``page``
(report.html), ``report`` (files), ``progress``, ``excerpts`` (rebuilds the shipped trace excerpts).
Side effects live in ``runner`` (worker processes), ``report`` (files), ``progress`` (stderr)
and the workload sources (reading traces); the rest is pure.
"""

from __future__ import annotations

from spotgpu.sim.invariants import InvariantViolation
from spotgpu.sim.latency import Latencies
from spotgpu.sim.report import write_outputs
from spotgpu.sim.runner import SimulationResult, simulate
from spotgpu.sim.scenario import PolicySpec, Scenario, build_workload, default_scenario, load_scenario, parse_scenario
from spotgpu.sim.simulation import PolicyRun, Simulation, run_policy
from spotgpu.sim.state import Hooks
from spotgpu.sim.table import summary_table

__all__ = [
    "Hooks",
    "InvariantViolation",
    "Latencies",
    "PolicyRun",
    "PolicySpec",
    "Scenario",
    "Simulation",
    "SimulationResult",
    "build_workload",
    "default_scenario",
    "load_scenario",
    "parse_scenario",
    "run_policy",
    "simulate",
    "summary_table",
    "write_outputs",
]
