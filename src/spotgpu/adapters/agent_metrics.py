"""The agent's Prometheus metrics, their ``/metrics`` HTTP endpoint and the ``/debug/state`` dump.

Decides nothing. Side effects: metric updates in a private registry (one per agent, so tests
and several agents in one process never collide; the return guard's metrics join it) and,
when :meth:`AgentMetrics.serve` and :meth:`AgentMetrics.serve_debug` are called, HTTP server
threads that answer

* ``GET /metrics`` (also ``/``): the registry in the format the scraper asks for;
* ``GET /debug/state``: the agent's state as JSON (its MappingCache, lending states, twin
  health, guard, runtime service answers, recent evictions), on its *own* listener
  (:meth:`AgentMetrics.serve_debug`, ``agent.debugAddress``, a loopback address only): it names
  every owner, loan and spot pod of the node, which the metrics port (behind a Service, open to
  any pod) never shows; the metrics listener answers 404 there.

Metric names (all prefixed ``spotgpu_agent_``):

* ``evictions_total{reason,namespace}``: spot pods evicted, by reason and the spot user's
  namespace (bounded cardinality; each pod is also named in the log);
* ``eviction_seconds{reason}``: trigger (owner-busy event or guard signal) to every spot task
  stopped; ``eviction_complete_seconds{reason}``: to the guard released;
* ``lent_gpu_seconds_total``: seconds GPUs of idle owners were lent (twin Healthy);
  ``spot_gpu_seconds_total``: seconds lent or unallocated GPUs had spot users on them;
* ``twin_healthy{device}``: 1 when real ``device`` is lendable (its twin Healthy, unless no
  container holds it yet); ``owners{state}``: owner containers by lending state;
  ``forged_shadow_pods``: pods on this node claiming to be ShadowPods without being authentic;
* ``detector_errors_total{kind}``, ``collector_errors_total{source,kind}``,
  ``task_stop_failures_total``, ``pod_delete_failures_total``, ``detect_cycle_seconds``;
  the release check: ``release_holders_killed_total{verdict}``, ``release_unclean_total{why}``,
  ``release_check_seconds``;
* ``runtime_answers_total{answer,reason}``: spotgpu-runtime's service answers (``unchanged``,
  ``modified``, ``refused``, ``retry``; refusals by reason), read from its engine at scrape time;
* lending (``spotgpu.core.lending``): ``not_lent_total{reason}`` (idle owners not lent, once
  per idle period: ``unguarded`` no guard coverage, ``forecast`` expected idle remainder too
  short, ``backoff`` recent loans ended quickly), ``owners_unguarded`` (owners without guard
  coverage that are refused or lent poll-only now);
* steering (``spotgpu.agent.steer``): ``preferred_allocations_total{resource,result}``
  (``steered`` to the scheduler's GPUs, or ``fallback``), ``allocations_total{resource,result}``
  (``assigned``, ``mismatch``: the kubelet chose other GPUs than the scheduler, ``unassigned``:
  no pod with an assignment identified, ``refused``) and ``allocation_mismatches_total{resource}``
  (containers pod-resources shows on GPUs other than their assigned ones, once per container).
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from spotgpu.core.config import loopback_port

log = logging.getLogger(__name__)

StateFn = Callable[[], Mapping[str, Any]]

_EVICTION_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class AgentMetrics:
    """Every metric the agent exports (see module docstring)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._add_eviction_metrics(self.registry)
        self._add_gpu_use_metrics(self.registry)
        self._add_failure_metrics(self.registry)
        self._add_steering_metrics(self.registry)
        self._add_lending_metrics(self.registry)
        self._servers: list[tuple[ThreadingHTTPServer, Thread]] = []
        self._runtime: _RuntimeAnswers | None = None

    def _add_eviction_metrics(self, r: CollectorRegistry) -> None:
        """Evictions and how long they take."""
        self.evictions = Counter(
            "spotgpu_agent_evictions_total", "Spot pods evicted", ["reason", "namespace"], registry=r
        )
        self.eviction_seconds = Histogram(
            "spotgpu_agent_eviction_seconds",
            "Trigger to every spot task stopped",
            ["reason"],
            buckets=_EVICTION_BUCKETS,
            registry=r,
        )
        self.eviction_complete_seconds = Histogram(
            "spotgpu_agent_eviction_complete_seconds",
            "Trigger to pods deleted and the owner released",
            ["reason"],
            buckets=_EVICTION_BUCKETS,
            registry=r,
        )

    def _add_gpu_use_metrics(self, r: CollectorRegistry) -> None:
        """Lent and spot GPU time, twin health, owners by lending state."""
        self.lent_gpu_seconds = Counter(
            "spotgpu_agent_lent_gpu_seconds_total", "Seconds GPUs of idle owners were lent", registry=r
        )
        self.spot_gpu_seconds = Counter(
            "spotgpu_agent_spot_gpu_seconds_total", "Seconds GPUs had spot users on them", registry=r
        )
        self.twin_healthy = Gauge("spotgpu_agent_twin_healthy", "1 when the twin is Healthy", ["device"], registry=r)
        self.owners = Gauge("spotgpu_agent_owners", "Owner containers by lending state", ["state"], registry=r)

    def _add_failure_metrics(self, r: CollectorRegistry) -> None:
        """Detection, collection, task-stop and pod-delete failures; the detection cycle's time."""
        self.detector_errors = Counter(
            "spotgpu_agent_detector_errors_total", "Detection failures (treated as activity)", ["kind"], registry=r
        )
        self.collector_errors = Counter(
            "spotgpu_agent_collector_errors_total", "Utilization collector errors", ["source", "kind"], registry=r
        )
        self.task_stop_failures = Counter(
            "spotgpu_agent_task_stop_failures_total", "Spot tasks that could not be verified stopped", registry=r
        )
        self.pod_delete_failures = Counter(
            "spotgpu_agent_pod_delete_failures_total", "Spot pod deletions that failed (retried)", registry=r
        )
        self.release_holders_killed = Counter(
            "spotgpu_agent_release_holders_killed_total",
            "Processes the release check killed before an owner's release (victim-pod, foreign-gpu-holder, "
            "foreign-control-holder): a process other than the owner's held its GPUs",
            ["verdict"],
            registry=r,
        )
        self.release_unclean = Counter(
            "spotgpu_agent_release_unclean_total",
            "Owner releases with a condemned holder still alive, or with the owner's pod unknown (check limited)",
            ["why"],
            registry=r,
        )
        self.release_check_seconds = Histogram(
            "spotgpu_agent_release_check_seconds",
            "Wall time of the release check on the return path",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0),
            registry=r,
        )
        self.detect_cycle_seconds = Histogram(
            "spotgpu_agent_detect_cycle_seconds",
            "Wall time of one detection cycle",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )

    def _add_steering_metrics(self, r: CollectorRegistry) -> None:
        """GetPreferredAllocation and Allocate against the scheduler's choice (:mod:`spotgpu.agent.steer`)."""
        self.preferred_allocations = Counter(
            "spotgpu_agent_preferred_allocations_total",
            "GetPreferredAllocation answers: steered to the scheduler's GPUs or the fallback choice",
            ["resource", "result"],
            registry=r,
        )
        self.allocations = Counter(
            "spotgpu_agent_allocations_total",
            "Allocate calls: assigned, mismatch (other GPUs than the scheduler's), unassigned, refused",
            ["resource", "result"],
            registry=r,
        )
        self.allocation_mismatches = Counter(
            "spotgpu_agent_allocation_mismatches_total",
            "Spot containers pod-resources shows on GPUs other than the scheduler assigned",
            ["resource"],
            registry=r,
        )

    def _add_lending_metrics(self, r: CollectorRegistry) -> None:
        """Owners not lent and why, unguarded owners, forged ShadowPods (:mod:`spotgpu.core.lending`)."""
        self.not_lent = Counter(
            "spotgpu_agent_not_lent_total",
            "Idle owners not lent (once per idle period and reason): unguarded, forecast, backoff",
            ["reason"],
            registry=r,
        )
        self.owners_unguarded = Gauge(
            "spotgpu_agent_owners_unguarded",
            "Owners the return guard does not cover now that are idle and refused, or lent poll-only",
            registry=r,
        )
        self.forged_shadow_pods = Gauge(
            "spotgpu_agent_forged_shadow_pods",
            "Pods holding GPUs on this node that claim to be ShadowPods but are not (treated as owners)",
            registry=r,
        )

    # -- updates used by the solver ----------------------------------------------------------
    def set_health(self, health: Mapping[str, bool]) -> None:
        for device, healthy in health.items():
            self.twin_healthy.labels(device=device).set(1 if healthy else 0)

    def set_owner_counts(self, counts: Mapping[str, int]) -> None:
        for state, count in counts.items():
            self.owners.labels(state=state).set(count)

    def collector_error(self, source: str, kind: str, count: int = 1) -> None:
        self.collector_errors.labels(source=source, kind=kind).inc(count)

    def sample(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """The current value of one sample (tests and the benchmark)."""
        return self.registry.get_sample_value(name, dict(labels or {}))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def watch_runtime(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Export spotgpu-runtime's answer counts (``SpecEngine.counts``) as
        ``spotgpu_agent_runtime_answers_total``; a later call replaces the source."""
        if self._runtime is None:
            self._runtime = _RuntimeAnswers(counts)
            self.registry.register(self._runtime)
        else:
            self._runtime.counts = counts

    # -- HTTP --------------------------------------------------------------------------------
    def serve(self, address: str) -> int:
        """Serve ``/metrics`` on ``host:port`` (port 0 picks one); returns the port. Never the dump."""
        return self._start(address, self.registry, None, "agent-metrics")

    def serve_debug(self, address: str, state: StateFn) -> int:
        """Serve ``/debug/state`` alone on ``address``, a loopback ``ip:port``
        (:func:`spotgpu.core.config.loopback_port` refuses anything else); returns the port."""
        loopback_port(address, "debugAddress")
        return self._start(address, None, state, "agent-debug")

    def _start(self, address: str, registry: CollectorRegistry | None, state: StateFn | None, name: str) -> int:
        host, _, port = address.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        server = (_Server6 if ":" in host else _Server)((host, int(port)), _Handler)
        server.registry = registry
        server.state = state
        thread = Thread(target=server.serve_forever, name=name, daemon=True)
        thread.start()
        self._servers.append((server, thread))
        return int(server.server_address[1])

    def close(self) -> None:
        while self._servers:
            server, thread = self._servers.pop()
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


class _RuntimeAnswers(Collector):
    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "spotgpu_agent_runtime_answers",
            "Answers of spotgpu-runtime's service, by answer and (for refusals and retries) reason",
            labels=["answer", "reason"],
        )
        for key, count in sorted(self.counts().items()):
            answer, _, reason = key.partition(":")
            family.add_metric([answer, reason], count)
        yield family


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: CollectorRegistry | None
    state: StateFn | None


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics %s: " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        registry = self.server.registry
        if path in ("/", "/metrics") and registry is not None:
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._answer(200, content_type, encoder(registry))
        elif path == "/debug/state" and self.server.state is not None:
            try:
                body = json.dumps(self.server.state(), sort_keys=True).encode()
            except Exception as exc:  # a bug in the dump must not take the endpoint down
                log.exception("building /debug/state failed")
                self._answer(500, "text/plain; charset=utf-8", f"state unavailable: {exc}\n".encode())
                return
            self._answer(200, "application/json", body)
        else:
            where = "/debug/state" if registry is None else "/metrics (/debug/state: agent.debugAddress)"
            self._answer(404, "text/plain; charset=utf-8", f"not found: try {where}\n".encode())

    def _answer(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


__all__ = ["AgentMetrics", "StateFn"]
