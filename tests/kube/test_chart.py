"""The Helm chart, the containerd snippet, the Dockerfile and the Grafana dashboard.

``helm`` cannot be installed here (not packaged for Debian 12, not on PyPI for our Python, and
nothing may be downloaded outside the registries), so the chart is rendered by
``tests/kube/gotemplate.py``, a strict renderer of the Go-template subset the chart uses (it
refuses any other construct). Every rendered manifest is validated with ``kubernetes-validate``
(strict: unknown fields are errors) against several Kubernetes versions; the custom resources
against our own CRD schemas. Then the manifests are checked for what the deployment must
guarantee: least-privilege RBAC, 2 scheduler replicas, the agent's host mounts, configurations
our own loaders accept, container arguments our own CLI parses.
"""

from __future__ import annotations

import importlib
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from gotemplate import TemplateError, parse, render_chart

from spotgpu.cli import build_parser
from spotgpu.core.config import AgentConfig, from_mapping
from spotgpu.kube import crds
from spotgpu.kube.metrics import ControllerMetrics
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.scheduler.config import SchedulerConfig

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "chart" / "spotgpu"
K8S_VERSIONS = ("1.28.0", "1.33.0", "1.37.0")

VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "tuned": {
        "image": {"tag": "9.9.9"},
        "imagePullSecrets": [{"name": "regcred"}],
        "queues": [{"name": "spot-queue", "type": "spot", "weight": 2, "capacity": "16"}],
        "rbac": {"aggregateToEdit": False},
        "runtimeClass": {"create": True},
        "scheduler": {
            "replicas": 3,
            "evictionMode": "delete",
            "gangjobController": False,
            "policy": {"nodeOrder": "spread", "victim": {"durationPolicy": "longest"}, "shadowGcGrace": "2m"},
            "tolerations": [{"key": "infra", "operator": "Exists"}],
        },
        "agent": {"runtime": {"install": False}, "config": {"maxInactiveTime": "30m"}},
        "grafana": {"dashboard": False},
    },
    "agent-only": {"scheduler": {"enabled": False}, "priorityClasses": {"create": False}, "queues": []},
}


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    docs = [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]
    docs += [yaml.safe_load(p.read_text()) for p in sorted((CHART / "crds").glob("*.yaml"))]
    return docs


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def manifests(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return documents(render_chart(CHART, VARIANTS[request.param]))


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    (found,) = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(suffix)]
    return found


def test_crd_files_are_generated_from_the_schemas() -> None:
    assert crds.main([str(CHART / "crds"), "--check"]) == 0


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_validates_against_kubernetes(manifests: list[dict[str, Any]], version: str) -> None:
    custom = crds.schemas()
    for doc in manifests:
        group = doc["apiVersion"].split("/")[0]
        if group == crds.r.GROUP:
            plural = doc["kind"].lower() + "s"
            jsonschema.Draft4Validator(_json_schema(custom[(group, plural)])).validate(doc)
        else:
            kubernetes_validate.validate(doc, version, strict=True)


def _json_schema(schema: Any) -> Any:
    from spotgpu.testing.kubeapi import _strip_k8s_extensions

    return _strip_k8s_extensions(schema)


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
def test_the_agent_node_restriction_policy_validates(version: str) -> None:
    docs = documents(render_chart(CHART, {"agent": {"nodeRestriction": True}}))
    policy = one(docs, "ValidatingAdmissionPolicy", "-agent-own-node")
    assert "system:serviceaccount:spotgpu-system:spotgpu-agent" in policy["spec"]["matchConditions"][0]["expression"]
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        kubernetes_validate.validate(one(docs, kind, "-agent-own-node"), version, strict=True)


def test_scheduler_runs_two_leader_elected_replicas_with_metrics() -> None:
    docs = documents(render_chart(CHART))
    deploy = one(docs, "Deployment", "-scheduler")
    assert deploy["spec"]["replicas"] == 2
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert "--lease-namespace=$(POD_NAMESPACE)" in args and "--identity=$(POD_NAME)" in args
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    svc = one(docs, "Service", "-scheduler-metrics")
    assert svc["spec"]["ports"][0]["port"] == container["ports"][0]["containerPort"]
    assert one(docs, "PodDisruptionBudget", "-scheduler")["spec"]["minAvailable"] == 1


def test_agent_daemonset_has_host_pid_and_the_node_sockets() -> None:
    docs = documents(render_chart(CHART))
    ds = one(docs, "DaemonSet", "-agent")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    mounts = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert mounts["device-plugins"] == "/var/lib/kubelet/device-plugins"
    assert mounts["pod-resources"] == "/var/lib/kubelet/pod-resources"  # the directory: sockets get re-created
    assert mounts["containerd"] == "/run/containerd"
    assert mounts["dev"] == "/dev"
    (agent,) = pod["containers"]
    mounted = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    for name, host in mounts.items():
        if name != "runtime-install":
            assert mounted[name] == host, f"{name} must be mounted at its host path"
    (init,) = pod["initContainers"]
    assert init["command"][:2] == ["spotgpu-runtime", "install-shim"]
    assert one(docs, "Service", "-agent-metrics")["spec"]["clusterIP"] == "None"


def _rules(role: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]


def test_rbac_is_least_privilege(manifests: list[dict[str, Any]]) -> None:
    for role in by_kind(manifests, "ClusterRole") + by_kind(manifests, "Role"):
        for group, resource, verb in _rules(role):
            assert "*" not in (group, resource, verb), role["metadata"]["name"]
            assert resource not in ("secrets", "configmaps", "serviceaccounts/token"), role["metadata"]["name"]
            assert resource != "nodes" or verb not in ("create", "delete", "update")
    agents = [r for r in by_kind(manifests, "ClusterRole") if r["metadata"]["name"].endswith("-agent")]
    for agent in agents:
        assert ("", "pods", "create") not in _rules(agent)
        assert {("", "nodes", "patch"), ("", "pods", "delete"), ("", "pods/status", "patch")} <= set(_rules(agent))
    for lease_role in by_kind(manifests, "Role"):
        named = [r for r in lease_role["rules"] if "update" in r["verbs"]]
        assert all(r.get("resourceNames") == ["spotgpu-scheduler"] for r in named)


def test_configurations_in_the_chart_load_with_our_own_loaders(manifests: list[dict[str, Any]]) -> None:
    for cm in by_kind(manifests, "ConfigMap"):
        data = cm["data"]
        if "config.yaml" in data:
            config = yaml.safe_load(data["config.yaml"])
            agent = from_mapping(AgentConfig, config["agent"], "agent")
            runtime = from_mapping(RuntimeConfig, config["runtime"], "runtime")
            assert agent.guard.listener_path == runtime.guard_listener_path
            assert agent.runtime_socket == runtime.agent_socket
        if "scheduler.yaml" in data:
            section = yaml.safe_load(data["scheduler.yaml"])["scheduler"] or {}
            from_mapping(SchedulerConfig, section, "scheduler")


def test_container_arguments_parse_with_our_cli(manifests: list[dict[str, Any]]) -> None:
    for workload in by_kind(manifests, "Deployment") + by_kind(manifests, "DaemonSet"):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            args = [a.replace("$(POD_NAMESPACE)", "ns").replace("$(POD_NAME)", "pod") for a in container["args"]]
            command = next(a for a in args if not a.startswith("-"))
            parser = build_parser(load=command)
            parsed = parser.parse_args(args)
            assert parsed.command == command


def test_containerd_snippets_define_the_spotgpu_handler() -> None:
    v2 = tomllib.loads((ROOT / "deploy/containerd/spotgpu-runtime.toml").read_text())
    v3 = tomllib.loads((ROOT / "deploy/containerd/spotgpu-runtime-v3.toml").read_text())
    cri2 = v2["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    cri3 = v3["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    binary = f"{values['agent']['runtime']['installDir']}/spotgpu-runtime"
    for cri in (cri2, cri3):
        handler = cri["runtimes"]["spotgpu"]
        assert handler["runtime_type"] == "io.containerd.runc.v2"
        assert handler["options"]["BinaryName"] == binary
        assert "platform.k8s.io/*" in handler["pod_annotations"]
        assert cri["default_runtime_name"] == "spotgpu"


def test_dockerfile_installs_the_package_and_runs_the_cli() -> None:
    text = (ROOT / "deploy/Dockerfile").read_text()
    assert 'ENTRYPOINT ["spotgpu"]' in text
    assert re.search(r"pip install .*\s\.\s*$", text, re.M)
    assert "USER 65532" in text


def test_dashboard_queries_only_metrics_that_exist() -> None:
    dashboard = json.loads((CHART / "dashboards/spotgpu.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    used = {m for e in exprs for m in re.findall(r"\b(spotgpu_[a-z_]+)", e)}
    known = {
        m.name + suffix
        for m in ControllerMetrics().registry.collect()
        for suffix in ("", "_total", "_bucket", "_count", "_sum")
    }
    sources = "".join(
        Path(importlib.import_module(mod).__file__ or "").read_text()
        for mod in ("spotgpu.adapters.agent_metrics", "spotgpu.guard.service")
    )
    for metric in used:
        base = re.sub(r"_(bucket|count|sum)$", "", metric)
        assert metric in known or f'"{base}"' in sources or f'"{base.removesuffix("_total")}' in sources, metric


def test_the_renderer_refuses_what_it_does_not_implement() -> None:
    with pytest.raises(TemplateError, match="not supported"):
        root, defines = parse("{{ .Values.x | sha256sum }}")
        from gotemplate import Renderer

        Renderer(defines).render(root, {"Values": {"x": "a"}}, {})
    with pytest.raises(TemplateError, match="unclosed"):
        parse("{{ if .x }}never closed")
