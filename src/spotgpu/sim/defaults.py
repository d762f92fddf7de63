"""Every default figure of the simulator, in one place, with where it comes from.

Constants only; no side effects. The node-level latencies below decide the owner-visible hold
and the amount of spot work lost, so each one names its source. When the project's own
benchmarks (``spotgpu bench agent``, ``bench guard``, ``bench runtime``, ``spotgpu node-e2e``)
report figures, update them *here*; scenario files can override any of them
(``latencies:`` section, see docs/simulator.md).

Sources used:

* ``AgentConfig`` / ``GuardConfig`` defaults in :mod:`spotgpu.core.config` (what a node runs
  with unless configured otherwise).
* ``shared/reference/platform-notes.md``: measured on a 2-vCPU development machine
  (containerd kill through gRPC returned in about 7 ms, the task's Wait at about 8 ms;
  a seccomp user-notification round trip with a Python supervisor costs 40-46 us).
* "assumption": no measurement yet; a deliberately plain figure, listed so that it can be
  replaced in one place.
"""

from __future__ import annotations

from typing import Final

from spotgpu.core.config import AgentConfig, GuardConfig, Seconds

_AGENT: Final = AgentConfig()
_GUARD: Final = GuardConfig()

# --- node agent (detection) -------------------------------------------------------------------
DETECT_INTERVAL_S: Final = Seconds(_AGENT.detect_interval)
"""Lowpower detector polling period. Source: ``AgentConfig.detect_interval`` (10 s)."""

MAX_INACTIVE_TIME_S: Final = Seconds(_AGENT.max_inactive_time)
"""Owner inactivity before lending. Source: ``AgentConfig.max_inactive_time`` (10 min)."""

# --- return path (guard + eviction) -----------------------------------------------------------
GUARD_SIGNAL_S: Final = Seconds(46e-6)
"""Owner's first GPU call -> agent notified. Source: platform-notes, seccomp notify round trip
with a Python supervisor, 40-46 us (upper end)."""

KILL_FIRST_TASK_S: Final = Seconds(8e-3)
"""Kill one spot container's task through containerd and see its Wait return. Source:
platform-notes, Tasks/Kill returned at ~7 ms and Wait at ~8 ms (SIGKILL, busybox)."""

KILL_EXTRA_TASK_S: Final = Seconds(1e-3)
"""Each further spot task on the same owner's GPUs (kills are issued concurrently; this is the
added serialisation). Assumption, to be replaced by ``spotgpu bench agent --containers 8``
(issue 4 targets eviction_ms_p99 <= 50 for 8 containers)."""

GUARD_RELEASE_S: Final = Seconds(46e-6)
"""Eviction done -> the held call continues (one more notify round trip). Source: as GUARD_SIGNAL_S."""

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


SPOT_START_S: Final = Seconds(0.0)
"""Bind -> spot containers running (image pull, device sync). Assumption: 0; set it to your
image start-up time (spotgpu-runtime's own share is in ``spotgpu bench runtime``)."""

RESERVED_START_S: Final = Seconds(0.0)
"""Bind -> reserved containers running. Assumption: 0."""

GANG_TEARDOWN_S: Final = Seconds(1.0)
"""An evicted gang's remaining pods (on other nodes or GPUs) release their GPUs after this long
(pod deletion through the API server and kubelet). Assumption, to be replaced by issue 8's
control-loop measurements. The work of every member stops at the eviction instant."""

REQUEUE_DELAY_S: Final = Seconds(0.0)
"""Evicted gang -> pending again (GangJob controller backoff). Assumption: 0."""

SHADOW_RELEASE_S: Final = Seconds(1.0)
"""Deleting a ShadowPod frees its real GPUs for a reserved pod after this long (API server +
kubelet). Assumption, as GANG_TEARDOWN_S."""

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
    "GUARD_RELEASE_S",
    "GUARD_SIGNAL_S",
    "KILL_EXTRA_TASK_S",
    "KILL_FIRST_TASK_S",
    "MAX_INACTIVE_TIME_S",
    "REQUEUE_DELAY_S",
    "RESERVED_START_S",
    "SAMPLE_INTERVAL_S",
    "SCHEDULE_PERIOD_NODES",
    "SCHEDULE_PERIOD_S",
    "SHADOW_RELEASE_S",
    "SPOT_START_S",
    "schedule_period",
]
