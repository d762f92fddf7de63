"""Scraping, the dashboard and the alert rules: leader-aware, labels that exist under any scrape,
every trust and refusal metric on a panel, and an alert for each that means an attack or a
broken invariant.

No Prometheus runs here: the queries are checked against the metrics the code really registers
(names and label names, from the registries of the scheduler, the agent and the guard), not
parsed by Prometheus itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from gotemplate import render_chart
from prometheus_client import CollectorRegistry

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.guard.service import GuardMetrics
from spotgpu.kube.metrics import ControllerMetrics

CHART = Path(__file__).resolve().parents[2] / "deploy" / "chart" / "spotgpu"
DASHBOARD = CHART / "dashboards" / "spotgpu.json"
RULES = CHART / "alerts" / "spotgpu.rules.yaml"
# what every way of scraping sets: pod annotations (kubernetes-pods job), a PodMonitor, endpoints
SCRAPE_LABELS = {"instance", "job"}
# only with endpoint or pod discovery and its relabelling: never in a shipped query
DISCOVERY_LABELS = {"pod", "node", "service", "endpoint", "container", "kubernetes_pod_name"}

# trust and refusal metrics: each on a panel
TRUST_METRICS = {
    "spotgpu_agent_forged_shadow_pods",
    "spotgpu_scheduler_forged_shadow_pods",
    "spotgpu_agent_runtime_answers_total",
    "spotgpu_agent_allocations_total",
    "spotgpu_agent_allocation_mismatches_total",
    "spotgpu_agent_owners_unguarded",
    "spotgpu_agent_not_lent_total",
    "spotgpu_agent_release_holders_killed_total",
    "spotgpu_agent_release_unclean_total",
    "spotgpu_agent_release_check_seconds_bucket",
    "spotgpu_gangjob_templates_refused_total",
    "spotgpu_scheduler_objects_skipped_total",
    "spotgpu_scheduler_idle_forecasts_ignored_total",
    "spotgpu_guard_fail_open_total",
    "spotgpu_guard_lost_notify_fds",
}
# ... and an alert where it means an attack, a broken invariant or protection that is off
ALERTED_METRICS = {
    "spotgpu_agent_forged_shadow_pods",
    "spotgpu_scheduler_forged_shadow_pods",
    "spotgpu_agent_runtime_answers_total",
    "spotgpu_agent_allocation_mismatches_total",
    "spotgpu_agent_release_holders_killed_total",
    "spotgpu_agent_release_unclean_total",
    "spotgpu_gangjob_templates_refused_total",
    "spotgpu_guard_fail_open_total",
    "spotgpu_guard_available",
    "spotgpu_guard_holder_attached",
    "spotgpu_guard_lost_notify_fds",
    "spotgpu_scheduler_leader",
    "spotgpu_controller_errors_total",
    "spotgpu_scheduler_objects_skipped_total",
}
# the scheduler's snapshot gauges: only the leader's are current
LEADER_GAUGES = {
    "spotgpu_scheduler_pending_pods",
    "spotgpu_scheduler_unschedulable_gangs",
    "spotgpu_scheduler_forged_shadow_pods",
}


def catalog() -> dict[str, set[str]]:
    """Every series name the code exports, with its label names."""
    registries = [ControllerMetrics().registry]
    agent = AgentMetrics()
    agent.watch_runtime(lambda: {"refused:forged": 1})
    registries.append(agent.registry)
    guard = CollectorRegistry()
    GuardMetrics(guard)
    registries.append(guard)
    out: dict[str, set[str]] = {}
    for registry in registries:
        for collector in list(registry._collector_to_names):
            names = registry._collector_to_names[collector]
            labels = set(getattr(collector, "_labelnames", ()))
            samples = [sample for family in collector.collect() for sample in family.samples]
            labels |= {label for sample in samples for label in sample.labels} - {"le"}
            for name in set(names) | {sample.name for sample in samples}:
                out[name] = labels | ({"le"} if name.endswith("_bucket") else set())
    return out


CATALOG = catalog()


def dashboard_exprs() -> list[tuple[str, str]]:
    """(expr, legendFormat) of every dashboard target."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(t["expr"], t.get("legendFormat", "")) for p in panels for t in p.get("targets", [])]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def metrics_in(expr: str) -> set[str]:
    return set(re.findall(r"\b(spotgpu_[a-z_]+)", expr))


def grouping_labels(expr: str) -> set[str]:
    clauses = re.findall(r"\b(?:by|on|without|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr)
    selectors = re.findall(r"\{([^}]*)\}", expr)
    labels = {label.strip() for clause in clauses for label in clause.split(",") if label.strip()}
    return labels | {m.split("=")[0].rstrip("!~").strip() for s in selectors for m in s.split(",") if m.strip()}


def every_query() -> list[tuple[str, str]]:
    rules = [(r["expr"], json.dumps(r.get("annotations", {}))) for r in alert_rules()]
    return dashboard_exprs() + rules


@pytest.mark.parametrize(("expr", "text"), every_query(), ids=lambda v: v[:60])
def test_queries_use_exported_metrics_and_only_labels_every_scrape_sets(expr: str, text: str) -> None:
    used = metrics_in(expr)
    assert used, expr
    unknown = sorted(m for m in used if m not in CATALOG)
    assert not unknown, f"{expr}: no such metric {unknown}"
    own = set().union(*(CATALOG[m] for m in used))
    for label in grouping_labels(expr):
        assert label in own | SCRAPE_LABELS, f"{expr}: label {label!r} exists only with some discovery"
    shown = set(re.findall(r"\{\{\s*\$?(?:labels\.)?\.?([a-z_]+)\s*\}\}", text.replace("$labels.", "")))
    for label in shown:
        assert label in own | SCRAPE_LABELS and label not in DISCOVERY_LABELS, f"{expr}: shows {label!r}"
    assert expr.count("(") == expr.count(")"), expr


def test_every_trust_and_refusal_metric_is_on_a_panel() -> None:
    used = {m for expr, _ in dashboard_exprs() for m in metrics_in(expr)}
    assert sorted(TRUST_METRICS - used) == []


def test_each_attack_or_broken_invariant_has_an_alert() -> None:
    rules = alert_rules()
    alerted = {m for r in rules for m in metrics_in(r["expr"])}
    assert sorted(ALERTED_METRICS - alerted) == []
    for rule in rules:
        assert re.fullmatch(r"Spotgpu[A-Za-z]+", rule["alert"])
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert "for" not in rule or re.fullmatch(r"[0-9]+[smh]", rule["for"])
    assert len({r["alert"] for r in rules}) == len(rules)


def test_the_schedulers_snapshot_gauges_are_read_from_the_leader_only() -> None:
    queries = dashboard_exprs() + [(r["expr"], "") for r in alert_rules()]
    for expr, _ in queries:
        if metrics_in(expr) & LEADER_GAUGES:
            assert "and on (instance) (spotgpu_scheduler_leader == 1)" in expr, expr
    leader = [e for e, _ in dashboard_exprs() if metrics_in(e) == {"spotgpu_scheduler_leader"}]
    assert leader == ["max by (instance) (spotgpu_scheduler_leader)"]


# --- what the chart ships ---------------------------------------------------------------------


def documents(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for text in render_chart(CHART, values).values() for d in yaml.safe_load_all(text) if d]


def by_name(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def metrics_port(pod: dict[str, Any]) -> int:
    ports = [p for c in pod["spec"]["containers"] for p in c.get("ports", []) if p["name"] == "metrics"]
    (port,) = ports
    return int(port["containerPort"])


def test_every_scheduler_and_agent_pod_is_scraped_by_annotation() -> None:
    docs = documents({})
    for kind, name in (("Deployment", "spotgpu-scheduler"), ("DaemonSet", "spotgpu-agent")):
        template = by_name(docs, kind, name)["spec"]["template"]
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(metrics_port(template))
        assert annotations["prometheus.io/path"] == "/metrics"
    # no Service load-balances between leader and standby
    assert by_name(docs, "Service", "spotgpu-scheduler-metrics")["spec"]["clusterIP"] == "None"
    off = documents({"metrics": {"podAnnotations": False}})
    scheduler = by_name(off, "Deployment", "spotgpu-scheduler")["spec"]["template"]["metadata"]
    assert "prometheus.io/scrape" not in scheduler.get("annotations", {})
    assert (
        "prometheus.io/scrape"
        not in by_name(off, "DaemonSet", "spotgpu-agent")["spec"]["template"]["metadata"]["annotations"]
    )


def test_the_operator_objects_are_optional_and_select_every_pod_with_metrics() -> None:
    assert not [d for d in documents({}) if d["apiVersion"].startswith("monitoring.coreos.com/")]
    values = {
        "metrics": {
            "podMonitor": {"enabled": True, "labels": {"release": "kps"}},
            "prometheusRule": {"enabled": True, "labels": {"release": "kps"}},
        }
    }
    docs = documents(values)
    monitor = by_name(docs, "PodMonitor", "spotgpu")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    selector = monitor["spec"]["selector"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    selected = []
    for workload in [d for d in docs if d["kind"] in ("Deployment", "DaemonSet")]:
        template = workload["spec"]["template"]
        labels = template["metadata"]["labels"]
        matched = all(labels.get(k) == v for k, v in selector["matchLabels"].items()) and all(
            labels.get(e["key"]) in e["values"] for e in selector["matchExpressions"]
        )
        if matched:
            selected.append(workload["metadata"]["name"])
            assert endpoint["port"] in {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
    assert sorted(selected) == ["spotgpu-agent", "spotgpu-scheduler"]  # not the guard holder: it exports none
    rule = by_name(docs, "PrometheusRule", "spotgpu")
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
