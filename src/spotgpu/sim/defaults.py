"""Every default figure of the simulator, in one place, with where it comes from.

Constants only; no side effects. The node-level latencies below decide the owner-visible hold
and the amount of spot work lost, so each one names its source. When the project's own
benchmarks (``spotgpu bench agent``, ``bench guard``, ``bench runtime``, ``spotgpu node-e2e``)
report new figures, update them *here*; scenario files can override any of them
(``latencies:`` section, see docs/simulator.md).

Sources used:

* ``AgentConfig`` / ``GuardConfig`` defaults in :mod:`spotgpu.core.config` (what a node runs
  with unless configured otherwise).
* The project's benchmarks, run on a 2-vCPU machine of the CI kind (kernel 6.18, containerd
  1.6.20, runc 1.1.5, no GPU: stand-in devices) with nothing else running, on 2026-12-01; their
  result files are committed in docs/results/ (``*-2026-12-01.json``). Each figure names its
  command and result keys.
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

Cross-check (2026-12-01): for a return with 8 spot tasks the model's median hold is
``guardSignal + killFirstTask + 7 * killExtraTask + guardRelease`` = 0.426 + 0.88 + 7 x 0.623 +
0.486 = 6.15 ms against ``return_hold_ms_p50`` 6.14 of the same ``spotgpu node-e2e`` run
(docs/results/node-e2e-8-quiet-mntns-2026-12-01.json): the kill step is fitted to that run's
eviction, so the medians agree by construction. Its p99 rows sum to 13.2 ms against the run's p99
(its maximum of 30) 12.9 ms. The kill steps are node-e2e's, not ``bench agent``'s (0.88 / 2.15 ms
for 1 / 8 tasks: busybox containers through containerd, no CRI pods): through CRI each spot
process's exit waits for CPU behind containerd-shim and containerd (docs/node-e2e.md, "Where the
hold goes"). These figures are of the return path with ``agent.eviction.holdMountNs`` (the
victims' mount namespaces held across their exits); before it (the ``-boost`` and earlier runs)
a return of 8 took about twice as long at the median and up to 5x at the p99.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from spotgpu.core.config import AgentConfig, GuardConfig
from spotgpu.core.configfile import Seconds


class Measured(NamedTuple):
    """A benchmark's quantiles of one latency: ``(quantile in 0..1, milliseconds)`` rows, by quantile."""

    quantiles_ms: tuple[tuple[float, float], ...]
    source: str
    """The command and the result keys the rows come from (and the date)."""


_AGENT: Final = AgentConfig()
_GUARD: Final = GuardConfig()

MEASURED_ON: Final = "2026-12-01"
"""Date of the benchmark runs the latency defaults below come from."""

# --- node agent (detection) -------------------------------------------------------------------
DETECT_INTERVAL_S: Final = Seconds(_AGENT.detect_interval)
"""Lowpower detector polling period. Source: ``AgentConfig.detect_interval`` (10 s). The lending
delay it implies (``maxInactiveTime`` after the owner's last activity, rounded up to the poll
grid) matches ``spotgpu node-e2e``: ``lend_detect_s`` 1.09 (median of 30) with detectInterval
0.25 s and maxInactiveTime 1 s (2026-12-01, docs/results/node-e2e-8-quiet-mntns-2026-12-01.json)."""

MAX_INACTIVE_TIME_S: Final = Seconds(_AGENT.max_inactive_time)
"""Owner inactivity before lending. Source: ``AgentConfig.max_inactive_time`` (10 min)."""

# --- return path (guard + eviction) -----------------------------------------------------------
GUARD_SIGNAL: Final = Measured(
    ((0.50, 0.426), (0.99, 0.637)),
    "spotgpu node-e2e --spot-containers 8 --cycles 30: guard_signal_ms_p50/_p99, 2026-12-01 "
    "(docs/results/node-e2e-8-quiet-mntns-2026-12-01.json)",
)
"""Owner's first GPU call -> the agent's owner-back handler runs (seccomp notification, guard,
handler)."""

KILL_FIRST_TASK: Final = Measured(
    ((0.50, 0.88), (0.99, 1.05)),
    "spotgpu bench agent --containers 1,8,16,32 --background-load 0,2 --configs default,no-mntns,legacy: containers "
    "1, config default, background load 0: eviction_ms_p50/_p99, 2026-12-01 "
    "(docs/results/bench-agent-mntns-2026-12-01.json)",
)
"""The agent's eviction of one spot task: owner-back signal -> the task verified stopped
(containerd Tasks/Kill SIGKILL + Wait, through gRPC).

The kill model is ``killFirstTask + (n - 1) * killExtraTask`` for ``n`` tasks (the agent signals
every task at once; each further exit adds the kernel's and containerd's work that serialises on
a small node), both terms read at the same quantile of one draw (a slow machine is slow for every
task). The first task is ``bench agent``'s 1-container figure (pinned pidfds, no containerd call
before the kill); the per-task step is fitted so that the model reproduces ``spotgpu node-e2e``'s
8-container eviction at each quantile: p50 ``(5.24 - 0.88) / 7`` = 0.623 ms, p99 ``(11.97 - 1.05)
/ 7`` = 1.560 ms. With 32 tasks the same model gives 20.2 / 49.4 ms against node-e2e's 22.0 /
46.8 ms under background load 2 (docs/results/node-e2e-32-load2-mntns-2026-12-01.json): close,
although the model has no load term."""

KILL_EXTRA_TASK: Final = Measured(
    ((0.50, 0.623), (0.99, 1.560)),
    "fitted: killFirstTask + 7 x killExtraTask = spotgpu node-e2e --spot-containers 8 --cycles 30 eviction_ms_p50 "
    "5.24 / _p99 11.97, 2026-12-01 (docs/results/node-e2e-8-quiet-mntns-2026-12-01.json)",
)
"""Each further spot task on the same owner's GPUs (see KILL_FIRST_TASK for the fit)."""

GUARD_RELEASE: Final = Measured(
    ((0.50, 0.486), (0.99, 0.606)),
    "spotgpu node-e2e --spot-containers 8 --cycles 30: released_ms_p50 5.68 - eviction_ms_p50 5.24 (the agent's "
    "release step) + guard_release_ms_p50 0.046 / _p99 0.166, 2026-12-01 "
    "(docs/results/node-e2e-8-quiet-mntns-2026-12-01.json); the agent's step p99 not measured",
)
"""Every spot task stopped -> the owner's held call continues. Two parts: the agent's release
step (forget the evicted users, disarm the guard, republish the device plugin's list), 0.44 ms
at the median; and the guard letting the held call go until the owner's thread runs again
(``guard_release_ms``: p50 0.046 ms, p99 0.166 ms on the quiet node; under background load 2 the
owner waits for a CPU behind containerd, the shims and runc handling the exits: p50 5.3, p99
18.1 ms, docs/results/node-e2e-8-load2-mntns-2026-12-01.json; ``bench guard``'s release alone is
p99 0.14 ms). The p99 row is the agent's median plus that p99 (assumption: the agent's release
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
    ((0.50, 132.5), (0.99, 167.67)),
    "spotgpu node-e2e --spot-containers 8 --cycles 30 spot_start_ms_p50/_p99, 2026-12-01 "
    "(docs/results/node-e2e-8-quiet-mntns-2026-12-01.json)",
)
"""Bind -> spot containers running, the image already on the node: the device plugin's Allocate
of a twin, the pod-resources grant and the kubelet CRI double's CreateContainer + StartContainer
through containerd 1.6's CRI plugin and spotgpu-runtime with the device sync, until the
container holds its GPU open. Not included (assumption: 0): the kubelet's pod admission and
sandbox (the double creates the sandbox before), and image pulls; add your image's start-up
time."""

RESERVED_START: Final = Measured(
    ((0.50, 68.9),),
    "spotgpu bench runtime --json: plain_ms_median 63.68 + passthrough_added_ms 5.22, 2026-12-01 "
    "(docs/results/bench-runtime-2026-12-01.json; a median only: constant)",
)
"""Bind -> reserved containers running, the image already on the node: plain ``ctr run --rm``
63.7 ms median (measured), plus spotgpu-runtime's share for a GPU owner, which no benchmark
times separately. Assumption for that share: the pass-through's 5.2 ms (4.7 ms in a 40-round
run, docs/results/bench-runtime-runs40-2026-12-01.json); an owner's ``create`` goes through the
Python wrapper for the guard rule, so it may cost up to about the device-sync create's 16.1 ms
(79.8 ms in all). The benchmark reports a median and an IQR width (10.8 ms for the
pass-through), no quantiles, so this latency stays a constant. Not included, as for SPOT_START:
kubelet, sandbox, image pull."""

GANG_TEARDOWN_S: Final = Seconds(1.0)
"""An evicted gang's remaining pods (on other nodes or GPUs) release their GPUs after this long
(pod deletion through the API server and kubelet). Assumption: no benchmark measures pod
deletion against a real API server and kubelet (``spotgpu node-e2e``'s
``eviction_complete_ms_p99`` 148.2 ms deletes through an in-process API double). The work of
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
