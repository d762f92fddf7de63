"""Every default figure of the simulator, in one place, with where it comes from.

Constants only; no side effects. The node-level latencies below decide the owner-visible hold
and the amount of spot work lost, so each one names its source. When the project's own
benchmarks (``spotgpu bench agent``, ``bench guard``, ``bench runtime``, ``spotgpu node-e2e``)
report new figures, update them *here*; scenario files can override any of them
(``latencies:`` section, see docs/simulator.md).

Sources used:

* ``AgentConfig`` / ``GuardConfig`` defaults in :mod:`spotgpu.core.config` (what a node runs
  with unless configured otherwise).
* The project's benchmarks, run on the 2-vCPU development machine (kernel 6.18, containerd
  1.6.20, runc 1.1.5, no GPU: stand-in devices), shared with other engineers' jobs, on
  2026-11-30. Each figure names its command and result keys.
* "assumption": no measurement yet; a deliberately plain figure, listed so that it can be
  replaced in one place.

**Measured latencies are distributions.** Each is a :class:`Measured` table of ``(quantile,
ms)`` rows, exactly the quantiles its benchmark reports (today p50 and p99), and its source
(command and result keys). The simulation draws every occurrence from the table with the run's
seeded generator (:class:`spotgpu.sim.latency.Latency`: linear between rows, the lowest row's
value below it, the highest's above it: no tail beyond what was measured), so the spread of
owner holds and start-up delays is model output, not only the number of tasks a return kills.
To update from a new result file, replace the rows (e.g.
``spotgpu.sim.latency.quantiles_from_result(json.load(f), "eviction_ms")`` reads
``eviction_ms_p50``/``_p99`` or ``{"eviction_ms": {"p50": .., "p99": ..}}``), the source and
MEASURED_ON.

Cross-check (2026-11-30): for a return with 8 spot tasks the model's median hold is
``guardSignal + killFirstTask + 7 * killExtraTask + guardRelease`` = 0.16 + 23.4 + 2.74 =
26.3 ms (p99 rows: 1.94 + 40.3 + 2.95 = 45.2 ms); ``spotgpu node-e2e --spot-containers 8
--cycles 50`` (everything real but the GPU, a kubelet double, load average 2.9) measured
``return_hold_ms_p50`` 34.2 / ``_p99`` 82.9: its eviction there took 27.6 ms (p50; a fresh
pod-resources read over gRPC and a busier machine than ``bench agent``'s 23.4 ms) and its
notification path 3.9 ms (hold minus the agent's own ``released_ms``) against 0.16 ms in
``bench guard``. The model is therefore about 8 ms (a quarter) optimistic against the
end-to-end median, and about half the end-to-end p99.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from spotgpu.core.config import AgentConfig, GuardConfig, Seconds


class Measured(NamedTuple):
    """A benchmark's quantiles of one latency: ``(quantile in 0..1, milliseconds)`` rows, by quantile."""

    quantiles_ms: tuple[tuple[float, float], ...]
    source: str
    """The command and the result keys the rows come from (and the date)."""


_AGENT: Final = AgentConfig()
_GUARD: Final = GuardConfig()

MEASURED_ON: Final = "2026-11-30"
"""Date of the benchmark runs the latency defaults below come from."""

# --- node agent (detection) -------------------------------------------------------------------
DETECT_INTERVAL_S: Final = Seconds(_AGENT.detect_interval)
"""Lowpower detector polling period. Source: ``AgentConfig.detect_interval`` (10 s). The lending
delay it implies (``maxInactiveTime`` after the owner's last activity, rounded up to the poll
grid) matches ``spotgpu node-e2e``: ``lend_detect_s`` 1.04 (median of 50) with detectInterval
0.25 s and maxInactiveTime 1 s (2026-11-30)."""

MAX_INACTIVE_TIME_S: Final = Seconds(_AGENT.max_inactive_time)
"""Owner inactivity before lending. Source: ``AgentConfig.max_inactive_time`` (10 min)."""

# --- return path (guard + eviction) -----------------------------------------------------------
GUARD_SIGNAL: Final = Measured(
    ((0.50, 0.16), (0.99, 1.94)),
    "spotgpu bench guard --json: details.owner_back_ms p50/p99, 2026-11-30",
)
"""Owner's first GPU call -> the agent's owner-back handler runs (seccomp notification, guard,
handler)."""

KILL_FIRST_TASK: Final = Measured(
    ((0.50, 5.5), (0.99, 15.6)),
    "spotgpu bench agent --containers 1 --runs 40 --json: eviction_ms_p50 6.05/5.03 and _p99 16.9/14.2 "
    "in two runs (their mean), 2026-11-30",
)
"""The agent's eviction of one spot task: owner-back signal -> the task verified stopped
(containerd Tasks/Kill SIGKILL + Wait, through gRPC).

The kill model is ``killFirstTask + (n - 1) * killExtraTask`` for ``n`` tasks (the agent issues
the kills concurrently; each further task adds the containerd and shim work that serialises),
both terms read at the same quantile of one draw (a slow machine is slow for every task). The
8-container benchmark alone cannot separate the two terms, so the first task is the
1-container figure and the per-task step is fitted so that the model reproduces the
8-container figure at each quantile: p50 ``(23.4 - 5.5) / 7`` = 2.557 ms, p99 ``(40.3 - 15.6)
/ 7`` = 3.53 ms. A sweep on the same day (1, 2, 4, 8 containers, 40 runs each, load average
3-5: p50 5.03, 5.81, 9.85, 18.69 ms) is linear, with a least-squares fit of 4.3 ms + 2.0 ms per
further task."""

KILL_EXTRA_TASK: Final = Measured(
    ((0.50, 2.557), (0.99, 3.53)),
    "fitted: killFirstTask + 7 x killExtraTask = spotgpu bench agent --containers 8 --json eviction_ms_p50 23.4 "
    "/ _p99 40.3, 2026-11-30",
)
"""Each further spot task on the same owner's GPUs (see KILL_FIRST_TASK for the fit)."""

GUARD_RELEASE: Final = Measured(
    ((0.50, 2.74), (0.99, 2.95)),
    "spotgpu node-e2e --spot-containers 8 --cycles 50 released_ms_p50 30.3 - eviction_ms_p50 27.6 (agent's "
    "release step, run A) + spotgpu bench guard --json details.release_after_eviction_ms p50 0.041 / "
    "release_after_eviction_ms_p99 0.25 (largest of the runs), 2026-11-30; the agent's step p99 not measured",
)
"""Every spot task stopped -> the owner's held call continues. Two parts: the agent's release
step (forget the evicted users, disarm the guard, republish the device plugin's list), 2.7 ms
at the median, taken from run A of docs/node-e2e.md (the run that takes ``released_ms`` at the
disarm); and the guard letting the held call go, p50 0.041 ms, p99 0.10-0.25 ms over runs. The
p99 row is the agent's median plus the guard's largest p99 (assumption: the agent's release
step has no p99 of its own; a difference of two p99s is no p99)."""

FAIL_OPEN_TIMEOUT_S: Final = Seconds(_GUARD.fail_open_timeout)
"""A held owner call is released after this long whatever happens. Source:
``GuardConfig.fail_open_timeout`` (5 s)."""

# --- control plane ---------------------------------------------------------------------------
SCHEDULE_PERIOD_S: Final = Seconds(1.0)
"""Scheduling cycles run at most this often, and only when something changed, on clusters of up
to SCHEDULE_PERIOD_NODES nodes. Source: Volcano's default schedule period (1 s)."""

SCHEDULE_PERIOD_NODES: Final[int] = 125
"""Above this many nodes the period grows in proportion (40 s at 5,000 nodes): a real cycle
over thousands of nodes and pending pods takes seconds (issue 3's benchmark target is 2,000
pods/s, 5 s for 10,000 pending pods at 5,000 nodes), and the simulation's cost is the number of
cycles times their size. A modelling trade-off, not a measurement; set
``latencies.schedulePeriod`` to override it."""


def schedule_period(nodes: int) -> float:
    """The automatic scheduling period for a cluster of ``nodes`` nodes."""
    return max(float(SCHEDULE_PERIOD_S), SCHEDULE_PERIOD_S * nodes / SCHEDULE_PERIOD_NODES)


SPOT_START: Final = Measured(
    ((0.50, 115.6), (0.99, 180.1)),
    "spotgpu node-e2e --spot-containers 8 --cycles 50 spot_start_ms_p50/_p99 (run A), 2026-11-30",
)
"""Bind -> spot containers running, the image already on the node: the device plugin's Allocate
of a twin, the pod-resources grant and ``ctr run -d`` through spotgpu-runtime with the device
sync until the task started. ``spotgpu bench runtime --runs 20 --nice -10 --json`` agrees:
plain ``ctr run --rm`` 102.5 ms median plus 18.1 ms for a create with device sync. Not included
(assumption: 0): the kubelet's pod admission and sandbox, and image pulls; add your image's
start-up time."""

RESERVED_START: Final = Measured(
    ((0.50, 105.6),),
    "spotgpu bench runtime --runs 20 --nice -10 --json: plain_ms_median 102.5 + passthrough_added_ms 3.1, "
    "2026-11-30 (a median only: constant)",
)
"""Bind -> reserved containers running, the image already on the node: plain ``ctr run --rm``
102.5 ms median (measured), plus spotgpu-runtime's share for a GPU owner, which no benchmark
times separately. Assumption for that share: the pass-through's 3.1 ms; an owner's ``create``
goes through the Python wrapper for the guard rule, so it may cost up to about the device-sync
create's 18.1 ms (121 ms in all). The benchmark reports a median and an IQR width (18.6 ms),
no quantiles, so this latency stays a constant. Not included, as for SPOT_START: kubelet,
sandbox, image pull."""

GANG_TEARDOWN_S: Final = Seconds(1.0)
"""An evicted gang's remaining pods (on other nodes or GPUs) release their GPUs after this long
(pod deletion through the API server and kubelet). Assumption: no benchmark measures pod
deletion against a real API server and kubelet (``spotgpu node-e2e``'s
``eviction_complete_ms_p99`` 151.8 ms deletes through an in-process API double). The work of
every member stops at the eviction instant."""

REQUEUE_DELAY_S: Final = Seconds(0.0)
"""Evicted gang -> pending again (GangJob controller backoff). Assumption: 0."""

SHADOW_RELEASE_S: Final = Seconds(1.0)
"""Deleting a ShadowPod frees its real GPUs for a reserved pod after this long (API server +
kubelet). Assumption, as GANG_TEARDOWN_S (not measured)."""

# --- model and output ------------------------------------------------------------------------
SAMPLE_INTERVAL_S: Final = Seconds(300.0)
"""Time-series sampling for the allocation plot (5 min)."""

AUDIT_INTERVAL_S: Final = Seconds(3600.0)
"""Full invariant audit of the cluster model every simulated hour (besides the checks on every
change), but at most AUDITS_PER_RUN times per run: an audit walks every GPU."""

AUDITS_PER_RUN: Final[int] = 12


__all__ = [
    "AUDITS_PER_RUN",
    "AUDIT_INTERVAL_S",
    "DETECT_INTERVAL_S",
    "FAIL_OPEN_TIMEOUT_S",
    "GANG_TEARDOWN_S",
    "GUARD_RELEASE",
    "GUARD_SIGNAL",
    "KILL_EXTRA_TASK",
    "KILL_FIRST_TASK",
    "MAX_INACTIVE_TIME_S",
    "MEASURED_ON",
    "Measured",
    "REQUEUE_DELAY_S",
    "RESERVED_START",
    "SAMPLE_INTERVAL_S",
    "SCHEDULE_PERIOD_NODES",
    "SCHEDULE_PERIOD_S",
    "SHADOW_RELEASE_S",
    "SPOT_START",
    "schedule_period",
]
