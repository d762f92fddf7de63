"""Prometheus metrics of the ``spotgpu scheduler`` process (scheduler loop and GangJob controller).

Decides nothing. Side effects: :func:`serve` starts an HTTP server thread answering ``/metrics``.
Every metric lives in the :class:`ControllerMetrics` object's own registry (never the global
one), so tests and several components in one process do not collide. Names are documented in
docs/deploy.md and used by the Grafana dashboard in ``deploy/grafana/spotgpu.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


@dataclass(slots=True)
class ControllerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    leader: Gauge = field(init=False)
    cycles: Counter = field(init=False)
    cycle_seconds: Histogram = field(init=False)
    binds: Counter = field(init=False)
    evictions: Counter = field(init=False)
    shadow_pods: Counter = field(init=False)
    nominations: Counter = field(init=False)
    unschedulable: Gauge = field(init=False)
    pending_pods: Gauge = field(init=False)
    errors: Counter = field(init=False)
    api_retries: Counter = field(init=False)
    gang_evictions: Counter = field(init=False)
    informer_relists: Gauge = field(init=False)
    snapshot_skipped: Counter = field(init=False)
    forged_shadow_pods: Gauge = field(init=False)
    forecasts_ignored: Counter = field(init=False)
    templates_refused: Counter = field(init=False)

    def __post_init__(self) -> None:
        r = self.registry
        self.leader = Gauge("spotgpu_scheduler_leader", "1 while this replica holds the leader Lease", registry=r)
        self.cycles = Counter("spotgpu_scheduler_cycles", "Scheduling cycles run", ["result"], registry=r)
        self.cycle_seconds = Histogram(
            "spotgpu_scheduler_cycle_duration_seconds",
            "Wall time of one cycle: snapshot, decide, apply",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.binds = Counter("spotgpu_scheduler_binds", "Pods bound", ["kind"], registry=r)
        self.evictions = Counter(
            "spotgpu_scheduler_evictions", "Spot pods evicted by the scheduler", ["reason", "method"], registry=r
        )
        self.shadow_pods = Counter("spotgpu_scheduler_shadow_pods", "ShadowPods created/deleted", ["op"], registry=r)
        self.nominations = Counter("spotgpu_scheduler_nominations", "Nominations set/cleared", ["op"], registry=r)
        self.unschedulable = Gauge(
            "spotgpu_scheduler_unschedulable_gangs", "Gangs the last cycle could not place", registry=r
        )
        self.pending_pods = Gauge("spotgpu_scheduler_pending_pods", "Unplaced pods in the last snapshot", registry=r)
        self.errors = Counter("spotgpu_controller_errors", "Failed applies and cycles", ["component"], registry=r)
        self.api_retries = Counter("spotgpu_api_retries", "API calls retried after a temporary error", registry=r)
        self.gang_evictions = Counter(
            "spotgpu_gangjob_evictions", "Gang evictions seen by the GangJob controller", ["reason"], registry=r
        )
        self.informer_relists = Gauge(
            "spotgpu_informer_relists_gone", "Relists after 410 Gone, per informer", ["informer"], registry=r
        )
        self.snapshot_skipped = Counter(
            "spotgpu_scheduler_objects_skipped", "Objects left out of a snapshot as malformed", ["kind"], registry=r
        )
        self.forged_shadow_pods = Gauge(
            "spotgpu_scheduler_forged_shadow_pods",
            "Pods claiming to be ShadowPods without being authentic ones (treated as ordinary pods)",
            registry=r,
        )
        self.forecasts_ignored = Counter(
            "spotgpu_scheduler_idle_forecasts_ignored",
            "Entries of the agents' spotgpu.io/idle-forecast annotations ignored as malformed",
            registry=r,
        )

        self.templates_refused = Counter(
            "spotgpu_gangjob_templates_refused",
            "GangJobs whose pod template carried scheduler-only metadata or spec.nodeName (no pod created)",
            registry=r,
        )

    def on_retry(self, what: str, exc: BaseException) -> None:
        self.api_retries.inc()


def serve(metrics: ControllerMetrics, port: int, address: str = "0.0.0.0") -> Any:
    """Serve ``/metrics`` on ``address:port`` from a daemon thread; returns the server."""
    server, _thread = start_http_server(port, addr=address, registry=metrics.registry)
    return server


__all__ = ["ControllerMetrics", "serve"]
