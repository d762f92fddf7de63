"""The Helm chart, the containerd snippets, the Dockerfile, the node scripts and the Grafana dashboard.

``helm`` cannot be installed here (not packaged for Debian 12, not on PyPI for our Python, and
nothing may be downloaded outside the registries), so the chart is rendered by
``tests/kube/gotemplate.py``, a strict renderer of the Go-template subset the chart uses (it
refuses any other construct). Every rendered manifest is validated with ``kubernetes-validate``
(strict: unknown fields are errors) against several Kubernetes versions; the custom resources
against our own CRD schemas. Then the manifests are checked for what the deployment must
guarantee: least-privilege RBAC, 2 scheduler replicas, the agent's host mounts, the guard
holder's DaemonSet (upgrade by handover, grace derived from ``handoverTimeout``, no API access),
configurations our own loaders accept, container arguments our own CLI parses.

The tests marked ``root`` run what the chart deploys for real: ``spotgpu guard-holder`` with the
rendered arguments, configuration and environment next to a runc owner container under the
guard's rule (surge upgrade, then removal without a successor); ``spotgpu-host-runtime`` (the
image's runc version check) entering another mount namespace; containerd 1.6 loading the
containerd snippet as a drop-in; the node script that lists guarded containers against a private
containerd.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import ChainMap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from gotemplate import TemplateError, parse, render_chart

from spotgpu.cli import build_parser
from spotgpu.core.config import AgentConfig
from spotgpu.core.configfile import from_mapping
from spotgpu.kube import crds
from spotgpu.kube.metrics import ControllerMetrics
from spotgpu.nri.config import NriConfig
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
        "agent": {
            "runtime": {"install": False, "config": {"lowerRuntime": "/usr/sbin/runc"}},
            "config": {"maxInactiveTime": "30m", "guard": {"handoverTimeout": "120s"}},
            "nodeSelector": {"gpu.example.com/pool": "dev"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}],
        },
        "guardHolder": {
            "logLevel": "DEBUG",
            "maxSurge": "25%",
            "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}},
        },
        "grafana": {"dashboard": False},
    },
    "agent-only": {"scheduler": {"enabled": False}, "priorityClasses": {"create": False}, "queues": []},
    "guard-off": {"agent": {"config": {"guard": {"enabled": False}}}},
    "nri": {"agent": {"runtime": {"mode": "nri", "install": False}}},
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
        if doc["kind"].startswith("ValidatingAdmissionPolicy") and version < "1.30":
            continue  # v1 since Kubernetes 1.30; older clusters set admission.enabled=false (docs/deploy.md)
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
    check, install, script = pod["initContainers"]
    assert script["command"][-2:] == [GUARDED_IN_IMAGE, "/usr/local/lib/spotgpu/spotgpu-guarded-containers"]
    assert {m["name"] for m in script["volumeMounts"]} == {"runtime-install"}
    assert check["name"] == "check-lower-runtime" and check["command"] == [HOST_RUNTIME_IN_IMAGE, "--version"]
    assert _env(check)["SPOTGPU_HOST_RUNTIME"] == "/usr/bin/runc"  # agent.runtime.config.lowerRuntime
    assert install["command"][:2] == ["spotgpu-runtime", "install-shim"]
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
            from_mapping(NriConfig, config["nri"], "nri")
            assert agent.guard.listener_path == runtime.guard_listener_path
            assert agent.guard.enabled == runtime.guard_enabled  # the installed shim knows too
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


# ----------------------------------------------------------------------------- the guard holder

HOST_RUNTIME_SCRIPT = ROOT / "deploy" / "bin" / "spotgpu-host-runtime"
HOST_RUNTIME_IN_IMAGE = "/usr/local/bin/spotgpu-host-runtime"
GUARDED_SCRIPT = ROOT / "deploy" / "node" / "spotgpu-guarded-containers"
GUARDED_IN_IMAGE = "/usr/local/share/spotgpu/spotgpu-guarded-containers"  # deploy/Dockerfile


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _node_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d.get("data", {})]
    config: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return config


def _mounts(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[dict[str, Any], str]]:
    """volume name -> (volume, mount path in the container)."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["name"]: (volumes[m["name"]], m["mountPath"]) for m in container["volumeMounts"]}


def test_the_guard_holder_is_its_own_daemonset_upgraded_by_handover(manifests: list[dict[str, Any]]) -> None:
    """docs/guard.md "Deployment notes": holder and agent in separate DaemonSets on the same nodes,
    sharing the socket directory and the configuration; the holder surges, the agent never does."""
    daemonsets = {d["metadata"]["name"].removeprefix("spotgpu-"): d for d in by_kind(manifests, "DaemonSet")}
    if "agent" not in daemonsets:
        assert "guard-holder" not in daemonsets
        return
    agent_ds = daemonsets["agent"]
    assert agent_ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    config = _node_config(manifests)
    guard = from_mapping(AgentConfig, config["agent"], "agent").guard
    holder_sas = [s for s in by_kind(manifests, "ServiceAccount") if s["metadata"]["name"].endswith("-guard-holder")]
    if not guard.enabled:
        assert "guard-holder" not in daemonsets and not holder_sas
        return
    spec = daemonsets["guard-holder"]["spec"]
    pod = spec["template"]["spec"]
    agent_pod = agent_ds["spec"]["template"]["spec"]
    surge = spec["updateStrategy"]["rollingUpdate"]["maxSurge"]
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": surge, "maxUnavailable": 0},
    }
    assert surge in (1, "25%")  # default 1; a percentage for large fleets
    assert spec["minReadySeconds"] == 10
    assert pod["hostPID"] is True and pod["priorityClassName"] == "system-node-critical"
    assert pod["terminationGracePeriodSeconds"] == int(guard.handover_timeout) + 30 > guard.handover_timeout
    assert (pod.get("nodeSelector"), pod.get("tolerations")) == (
        agent_pod.get("nodeSelector"),
        agent_pod.get("tolerations"),
    )

    (holder,) = pod["containers"]
    assert holder["args"][-3:] == ["guard-holder", "--config=/etc/spotgpu/config.yaml", "--ready-file=/ready/holder"]
    assert holder["readinessProbe"] == {"exec": {"command": ["cat", "/ready/holder"]}, "periodSeconds": 2}
    assert "livenessProbe" not in holder and "startupProbe" not in holder
    assert "ports" not in holder and "hostNetwork" not in pod  # no hostPort: it would block the surge pod
    resources = holder["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]
    assert "cpu" not in resources["limits"]  # a throttled holder delays owners' calls
    assert holder["securityContext"]["privileged"] is True and holder["securityContext"]["runAsUser"] == 0

    mounts = _mounts(pod, holder)
    agent_mounts = _mounts(agent_pod, agent_pod["containers"][0])
    assert mounts["spotgpu-run"] == agent_mounts["spotgpu-run"]  # same hostPath, same path inside
    run_dir = mounts["spotgpu-run"][1]
    assert str(guard.listener_path).startswith(run_dir + "/") and str(guard.holder_path).startswith(run_dir + "/")
    assert mounts["ready"] == ({"name": "ready", "emptyDir": {}}, "/ready")  # per pod, never the hostPath
    assert mounts["config"] == agent_mounts["config"] and mounts["config"][1] == "/etc/spotgpu"

    # the runc version check: the node's lowerRuntime, in both processes that probe support
    lower = config["runtime"]["lowerRuntime"]
    for container in (holder, agent_pod["containers"][0]):
        assert _env(container)["SPOTGPU_HOST_RUNTIME"] == lower
        assert _env(container)["SPOTGPU_HOST_RUNTIME_REPORT"] == "parent"
    assert guard.runtime_binary == HOST_RUNTIME_IN_IMAGE


def test_the_guard_holder_has_no_kubernetes_api_access(manifests: list[dict[str, Any]]) -> None:
    holders = [d for d in by_kind(manifests, "DaemonSet") if d["metadata"]["name"].endswith("-guard-holder")]
    for ds in holders:
        pod = ds["spec"]["template"]["spec"]
        name = pod["serviceAccountName"]
        assert name.endswith("-guard-holder") and pod["automountServiceAccountToken"] is False
        (account,) = [s for s in by_kind(manifests, "ServiceAccount") if s["metadata"]["name"] == name]
        assert account["automountServiceAccountToken"] is False
        for binding in by_kind(manifests, "RoleBinding") + by_kind(manifests, "ClusterRoleBinding"):
            assert all(s.get("name") != name for s in binding["subjects"]), binding["metadata"]["name"]


def test_the_guard_holder_loads_no_kubernetes_client() -> None:
    """The "no grants" above is right only if the holder never calls the API: everything its
    command imports (the CLI, the holder, the support probe) stays clear of any client library."""
    code = (
        "import sys, spotgpu.cli, spotgpu.cli.guard_holder, spotgpu.guard.holder, spotgpu.guard.support\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightkube', 'httpx', 'kubernetes')"
        " or m.startswith('spotgpu.kube')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("value", "grace"), [(60, 90), ("60s", 90), (5, 35), ("600s", 630), (None, 90)])
def test_the_holder_grace_period_is_derived_from_the_handover_timeout(value: Any, grace: int) -> None:
    """None: the key is removed (a user null, as in Helm), so GuardConfig's default (60 s) applies."""
    docs = documents(render_chart(CHART, {"agent": {"config": {"guard": {"handoverTimeout": value}}}}))
    pod = one(docs, "DaemonSet", "-guard-holder")["spec"]["template"]["spec"]
    loaded = from_mapping(AgentConfig, _node_config(docs)["agent"], "agent").guard.handover_timeout
    assert pod["terminationGracePeriodSeconds"] == grace == loaded + 30


@pytest.mark.parametrize("value", ["1m", "0", 0, "1.5s", 2.5, "soon", "-5"])
def test_a_handover_timeout_the_template_cannot_derive_from_is_refused(value: Any) -> None:
    with pytest.raises(TemplateError, match=r"agent\.config\.guard\.handoverTimeout: .* must be whole seconds"):
        render_chart(CHART, {"agent": {"config": {"guard": {"handoverTimeout": value}}}})


@pytest.mark.parametrize("surge", [0, "0", "0%", ""])
def test_a_holder_rollout_without_surge_is_refused(surge: Any) -> None:
    with pytest.raises(TemplateError, match=r"guardHolder\.maxSurge must be at least 1"):
        render_chart(CHART, {"guardHolder": {"maxSurge": surge}})


@pytest.mark.parametrize(
    ("override", "refused"),
    [
        ({"config": {"guard": {"listenerPath": "/var/run/guard.sock"}}}, "listenerPath"),
        ({"config": {"guard": {"holderPath": "/tmp/fd-holder.sock"}}}, "holderPath"),
        ({"hostPaths": {"spotgpu": "/run/spotgpu2"}}, "listenerPath"),  # a prefix, not the directory
    ],
)
def test_guard_sockets_outside_the_shared_host_directory_are_refused(override: dict[str, Any], refused: str) -> None:
    with pytest.raises(TemplateError, match=rf"agent\.config\.guard\.{refused} .* must lie in agent\.hostPaths"):
        render_chart(CHART, {"agent": override})


def test_a_moved_socket_directory_moves_every_mount_and_path() -> None:
    guard = {"listenerPath": "/var/run/sg/guard.sock", "holderPath": "/var/run/sg/fd-holder.sock"}
    docs = documents(
        render_chart(CHART, {"agent": {"hostPaths": {"spotgpu": "/var/run/sg"}, "config": {"guard": guard}}})
    )
    config = _node_config(docs)
    assert config["runtime"]["guardListenerPath"] == guard["listenerPath"]
    assert config["runtime"]["agentSocket"] == "/var/run/sg/agent.sock"
    for suffix in ("-agent", "-guard-holder"):
        pod = one(docs, "DaemonSet", suffix)["spec"]["template"]["spec"]
        assert _mounts(pod, pod["containers"][0])["spotgpu-run"][1] == "/var/run/sg"


def test_without_the_guard_the_runtime_is_told_and_no_holder_runs() -> None:
    docs = documents(render_chart(CHART, {"agent": {"config": {"guard": {"enabled": False}}}}))
    assert not [d for d in docs if d["metadata"]["name"].endswith("-guard-holder")]
    runtime = from_mapping(RuntimeConfig, _node_config(docs)["runtime"], "runtime")
    assert runtime.guard_enabled is False  # the installed shim never waits for a listener


def test_nri_mode_mounts_the_nri_socket_and_needs_no_containerd_change() -> None:
    """agent.runtime.mode: nri: the agent's configuration turns NRI on at the socket the
    DaemonSet mounts (the folder, at its host path); no shim install, no RuntimeClass handler."""
    docs = documents(render_chart(CHART, {"agent": {"runtime": {"mode": "nri", "install": False}}}))
    nri = from_mapping(NriConfig, _node_config(docs)["nri"], "nri")
    assert nri.enabled and str(nri.socket_path) == "/var/run/nri/nri.sock"
    shipped = tomllib.loads((ROOT / "deploy/containerd/nri-v3.toml").read_text())
    assert shipped["plugins"]["io.containerd.nri.v1.nri"]["socket_path"] == str(nri.socket_path)
    pod = one(docs, "DaemonSet", "-agent")["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    (agent,) = pod["containers"]
    assert volumes["nri"] == "/var/run/nri" and {"name": "nri", "mountPath": "/var/run/nri"} in agent["volumeMounts"]
    assert "initContainers" not in pod and "runtime-install" not in volumes
    wrapper = documents(render_chart(CHART))
    assert from_mapping(NriConfig, _node_config(wrapper)["nri"], "nri").enabled is False
    wrapper_pod = one(wrapper, "DaemonSet", "-agent")["spec"]["template"]["spec"]
    assert "nri" not in {v["name"] for v in wrapper_pod["volumes"]}


def test_a_runtime_mode_other_than_wrapper_or_nri_is_refused() -> None:
    with pytest.raises(TemplateError, match=r"agent\.runtime\.mode: \"kata\" must be wrapper or nri"):
        render_chart(CHART, {"agent": {"runtime": {"mode": "kata"}}})
    with pytest.raises(TemplateError, match=r"NRI mode .* uses no runtime handler"):
        render_chart(CHART, {"agent": {"runtime": {"mode": "nri"}}, "runtimeClass": {"create": True}})


def test_config_changes_roll_the_pods_that_read_them() -> None:
    """Agent and holder read the configuration only at start; a changed value must change their
    pod template (a checksum annotation), the holder's only for its own section."""

    def annotations(values: dict[str, Any]) -> tuple[str, str]:
        docs = documents(render_chart(CHART, values))
        agent = one(docs, "DaemonSet", "-agent")["spec"]["template"]["metadata"]["annotations"]
        holder = one(docs, "DaemonSet", "-guard-holder")["spec"]["template"]["metadata"]["annotations"]
        return agent["checksum/config"], holder["checksum/guard-config"]

    base = annotations({})
    other_agent = annotations({"agent": {"config": {"maxInactiveTime": "30m"}}})
    other_guard = annotations({"agent": {"config": {"guard": {"failOpenTimeout": "3s"}}}})
    assert other_agent[0] != base[0] and other_agent[1] == base[1]
    assert other_guard[0] != base[0] and other_guard[1] != base[1]


# ----------------------------------------------------------------------------- containerd


def _toml_block(markdown: Path, heading: str) -> dict[str, Any]:
    text = markdown.read_text()
    section = text[text.index(heading) :]
    match = re.search(r"```toml\n(.*?)```", section, re.S)
    assert match, f"no toml block after {heading!r} in {markdown.name}"
    return tomllib.loads(match.group(1))


def _handler(config: dict[str, Any], plugin: str = "io.containerd.grpc.v1.cri") -> dict[str, Any]:
    handler: dict[str, Any] = config["plugins"][plugin]["containerd"]["runtimes"]["spotgpu"]
    return handler


HANDLER_KEYS = ("runtime_type", "pod_annotations", "container_annotations")


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
        assert handler["pod_annotations"] == ["platform.k8s.io/*", "spotgpu.io/*"]
        assert handler["container_annotations"] == ["platform.k8s.io/*"]  # only Allocate's annotations
        for pattern in handler["pod_annotations"] + handler["container_annotations"]:
            assert pattern != "*" and not pattern.startswith("io.kubernetes")  # docs/runtime.md, rule 1
        assert cri["default_runtime_name"] == "spotgpu"


def test_the_containerd_snippets_match_the_runtime_and_deploy_docs() -> None:
    """docs/runtime.md is the runtime's specification of its handler; docs/deploy.md shows what
    to merge. Both must say exactly what deploy/containerd/ installs."""
    shipped = _handler(tomllib.loads((ROOT / "deploy/containerd/spotgpu-runtime.toml").read_text()))
    for doc, heading in (
        (ROOT / "docs/runtime.md", "## containerd configuration"),
        (ROOT / "docs/deploy.md", "Register the runtime with containerd"),
    ):
        documented = _handler(_toml_block(doc, heading))
        for key in HANDLER_KEYS:
            assert documented[key] == shipped[key], f"{doc.name}: {key}"
        assert documented["options"]["BinaryName"] == shipped["options"]["BinaryName"], doc.name
    v3 = _handler(
        tomllib.loads((ROOT / "deploy/containerd/spotgpu-runtime-v3.toml").read_text()), "io.containerd.cri.v1.runtime"
    )
    assert v3 == shipped


@pytest.mark.skipif(shutil.which("containerd") is None, reason="containerd is not installed")
def test_containerd_loads_the_snippet_as_a_drop_in(tmp_path: Path) -> None:
    """The real containerd (1.6 here) decodes the snippet imported by a main config that names
    runc as its default: every field lands where the runtime needs it, and the drop-in wins."""
    snippet = ROOT / "deploy/containerd/spotgpu-runtime.toml"
    main = tmp_path / "config.toml"
    main.write_text(
        f'version = 2\nimports = ["{snippet}"]\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "runc"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n'
    )
    dump = subprocess.run(
        ["containerd", "--config", str(main), "config", "dump"], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = tomllib.loads(dump.stdout)
    assert loaded["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"] == "spotgpu"
    decoded, shipped = _handler(loaded), _handler(tomllib.loads(snippet.read_text()))
    for key in HANDLER_KEYS:
        assert decoded[key] == shipped[key], key
    assert decoded["options"] == shipped["options"]


# ----------------------------------------------------------------------------- image


def test_dockerfile_installs_the_package_and_runs_the_cli() -> None:
    text = (ROOT / "deploy/Dockerfile").read_text()
    assert 'ENTRYPOINT ["spotgpu"]' in text
    assert re.search(r"pip install .*--no-index \.(\s|$)", text, re.M)  # this source, nothing fetched
    assert "USER 65532" in text
    # the guard's runc check: the script the chart names, installed where the chart looks
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["agent"]["config"]["guard"]["runtimeBinary"] == HOST_RUNTIME_IN_IMAGE
    assert f"COPY deploy/bin/spotgpu-host-runtime {HOST_RUNTIME_IN_IMAGE}" in text
    assert "nsenter --version" in text  # the build fails where nsenter is missing
    assert f"COPY deploy/node/spotgpu-guarded-containers {GUARDED_IN_IMAGE}" in text  # the chart installs it


def test_the_build_context_keeps_what_the_dockerfile_copies() -> None:
    """deploy/Dockerfile.dockerignore excludes everything, then lets back in what is copied."""
    rules = [
        line.strip()
        for line in (ROOT / "deploy/Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*"
    kept = [r[1:] for r in rules if r.startswith("!")]
    copies = re.findall(r"^COPY (?!--from)(.+)$", (ROOT / "deploy/Dockerfile").read_text(), re.M)
    sources = [src for line in copies for src in line.split()[:-1]]
    assert sources
    for source in sources:
        src = source.rstrip("/")
        assert (ROOT / src).exists(), src
        assert any(src == k or src.startswith(k + "/") for k in kept), f"{src} is not in the build context"


@pytest.mark.parametrize("script", [HOST_RUNTIME_SCRIPT, GUARDED_SCRIPT], ids=lambda p: p.name)
def test_the_shipped_scripts_are_executable_posix_sh(script: Path) -> None:
    assert os.access(script, os.X_OK)
    assert script.read_text().startswith("#!/bin/sh\n")
    subprocess.run(["sh", "-n", str(script)], check=True, timeout=30)


def test_the_host_runtime_check_accepts_only_version() -> None:
    out = subprocess.run(
        [str(HOST_RUNTIME_SCRIPT), "exec", "x"], check=False, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2 and "usage: spotgpu-host-runtime --version" in out.stderr


# ----------------------------------------------------------------------------- dashboard

GUARD_METRICS = {
    "spotgpu_guard_available",
    "spotgpu_guard_holder_attached",
    "spotgpu_guard_notify_fds",
    "spotgpu_guard_lost_notify_fds",
    "spotgpu_guard_notifications_total",
    "spotgpu_guard_owner_back_total",
    "spotgpu_guard_releases_total",
    "spotgpu_guard_fail_open_total",
    "spotgpu_guard_hold_seconds_bucket",
}


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
    assert sorted(GUARD_METRICS - used) == []  # every guard metric is on the dashboard


def test_dashboard_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = json.loads((CHART / "dashboards/spotgpu.json").read_text())["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


# ----------------------------------------------------------------------------- renderer


def _render_text(source: str, values: dict[str, Any] | None = None) -> str:
    from gotemplate import Renderer

    root, defines = parse(source)
    top = {"Values": values or {}}
    return Renderer(defines).render(root, top, ChainMap({"$": top}))


def test_the_renderer_refuses_what_it_does_not_implement() -> None:
    with pytest.raises(TemplateError, match="not supported"):
        _render_text("{{ .Values.x | sha1sum }}", {"x": "a"})
    with pytest.raises(TemplateError, match="unclosed"):
        parse("{{ if .x }}never closed")
    with pytest.raises(TemplateError, match="undefined variable"):
        _render_text("{{ $never = 1 }}")


def test_the_renderer_follows_go_and_sprig_where_the_chart_relies_on_them() -> None:
    # `=` assigns the variable of the enclosing block; `:=` declares a new one in the inner block
    assert _render_text('{{ $a := "1" }}{{ if true }}{{ $a = "2" }}{{ end }}{{ $a }}') == "2"
    assert _render_text('{{ $a := "1" }}{{ if true }}{{ $a := "2" }}{{ $a }}{{ end }}{{ $a }}') == "21"
    assert _render_text('{{ add 60 30 }} {{ add ("45" | int) 1 }}') == "90 46"
    assert _render_text('{{ regexMatch "^[0-9]+s?$" "60s" }} {{ regexMatch "^[0-9]+$" "1m" }}') == "true false"
    assert _render_text('{{ hasPrefix "/run/a/" "/run/a/x.sock" }} {{ hasPrefix "/run/a/" "/run/ab" }}') == "true false"
    assert _render_text('{{ "abc" | sha256sum }}') == hashlib.sha256(b"abc").hexdigest()
    with pytest.raises(TemplateError, match="fail: stop here"):
        _render_text('{{ if true }}{{ fail "stop here" }}{{ end }}')


# ----------------------------------------------------------------------------- real processes (root)


def _fake_runc(directory: Path, version: str, libseccomp: str) -> None:
    directory.mkdir(parents=True)
    runc = directory / "runc"
    runc.write_text(
        "#!/bin/sh\n"
        f"printf 'runc version {version}\\ncommit: v{version}\\nspec: 1.0.2-dev\\n"
        f"go: go1.22.2\\nlibseccomp: {libseccomp}\\n'\n"
    )
    runc.chmod(0o755)


@contextlib.contextmanager
def _node_namespace(base: Path, version: str, libseccomp: str) -> Iterator[tuple[int, Path]]:
    """A process in a private mount namespace where ``<base>/node/runc`` is a runc reporting
    ``version``/``libseccomp``; in this test's namespace that path does not exist. Yields the
    process's PID and the path."""
    _fake_runc(base / "node-bin", version, libseccomp)
    only_there = base / "node"
    only_there.mkdir()
    proc = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount --bind "$0" "$1" && echo ready && exec sleep 600',
            str(base / "node-bin"),
            str(only_there),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield proc.pid, only_there / "runc"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.root
@pytest.mark.parametrize(
    ("version", "libseccomp", "refused"),
    [
        ("1.1.12", "2.5.4", None),
        ("1.2.5", "2.5.5", None),
        ("1.0.2", "2.5.1", "runc 1.0.2 is older than 1.1"),
        ("1.1.4", "2.4.4", "libseccomp 2.4.4 is older than 2.5"),
    ],
)
def test_the_guard_checks_the_node_runc_not_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, libseccomp: str, refused: str | None
) -> None:
    """``runtimeBinary`` as the chart sets it: the guard's own probe runs the image's script,
    which runs the runc of the *node's* mount namespace (here another process's, where a runc
    exists that this test's namespace does not have) and reports its versions."""
    from spotgpu.guard.support import probe

    with _node_namespace(tmp_path, version, libseccomp) as (pid, runc):
        assert not runc.exists()  # only the "node" has it
        monkeypatch.setenv("SPOTGPU_HOST_PID", str(pid))
        monkeypatch.setenv("SPOTGPU_HOST_RUNTIME", str(runc))
        support = probe(str(HOST_RUNTIME_SCRIPT))
    assert (support.runtime_version, support.libseccomp_version) == (version, libseccomp)
    if refused is None:
        assert support.available, support.summary()
    else:
        assert not support.available and any(refused in r for r in support.reasons), support.reasons


def _chart_env(container: dict[str, Any], **overrides: str) -> dict[str, str]:
    """The container's environment from the manifest, for a process started here: the image's
    PATH, this machine's node PID (this test's own: the same mount namespace as the "node")."""
    env = {"PATH": os.environ["PATH"], "SPOTGPU_HOST_PID": str(os.getpid()), **_env(container)}
    env.update(overrides)
    return env


@pytest.mark.root
def test_the_lower_runtime_check_passes_on_this_node_and_refuses_a_wrong_path() -> None:
    """The agent's check-lower-runtime init container, as rendered: it passes with the node's
    real runc and fails (so the shim is not installed) with a path the node does not have,
    saying where the node's runc is."""
    runc = shutil.which("runc")
    assert runc is not None
    for lower, ok in ((runc, True), ("/opt/nowhere/runc", False)):
        docs = documents(render_chart(CHART, {"agent": {"runtime": {"config": {"lowerRuntime": lower}}}}))
        pod = one(docs, "DaemonSet", "-agent")["spec"]["template"]["spec"]
        check = pod["initContainers"][0]
        command = [str(HOST_RUNTIME_SCRIPT), *check["command"][1:]]
        out = subprocess.run(command, check=False, env=_chart_env(check), capture_output=True, text=True, timeout=30)
        if ok:
            assert out.returncode == 0 and out.stdout.startswith("runc version 1."), out.stderr
        else:
            assert out.returncode == 1
            assert "cannot run '/opt/nowhere/runc --version'" in out.stderr
            assert re.search(r"the node's runc is /\S*runc: set agent\.runtime\.config\.lowerRuntime", out.stderr), (
                out.stderr
            )


class _Holder:
    """``spotgpu guard-holder`` started from the rendered DaemonSet: its args, its environment,
    its configuration with the host paths moved under ``base``."""

    def __init__(self, container: dict[str, Any], config: Path, base: Path, name: str, **env: str) -> None:
        self.ready = base / f"{name}.ready"
        self.log_path = base / f"{name}.log"
        args = [
            a.replace("/etc/spotgpu/config.yaml", str(config)).replace("/ready/holder", str(self.ready))
            for a in container["args"]
        ]
        probe_cmd = container["readinessProbe"]["exec"]["command"]
        self.readiness = [a.replace("/ready/holder", str(self.ready)) for a in probe_cmd]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "spotgpu", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_chart_env(container, **env),
            )

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while subprocess.run(self.readiness, capture_output=True, check=False).returncode != 0:
            assert self.proc.poll() is None, f"the holder exited: {self.log()}"
            assert time.monotonic() < deadline, f"the holder did not turn ready: {self.log()}"
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _deployed_holder(base: Path, handover: int, **values: Any) -> tuple[dict[str, Any], int, Path]:
    """Render the chart; return the holder container, its grace period, and its configuration
    written under ``base`` (the host directory /run/spotgpu moved to ``base/run``; the image's
    runc check replaced by this checkout's script)."""
    docs = documents(render_chart(CHART, {"agent": {"config": {"guard": {"handoverTimeout": handover}}}, **values}))
    pod = one(docs, "DaemonSet", "-guard-holder")["spec"]["template"]["spec"]
    config = _node_config(docs)
    text = yaml.safe_dump(config).replace("/run/spotgpu/", f"{base}/run/")
    text = text.replace(HOST_RUNTIME_IN_IMAGE, str(HOST_RUNTIME_SCRIPT))
    path = base / "config.yaml"
    path.write_text(text)
    return pod["containers"][0], pod["terminationGracePeriodSeconds"], path


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths must stay under 108 bytes: a short private directory."""
    path = Path(tempfile.mkdtemp(prefix="sgchart-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.root
@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the stand-in GPU client")
def test_the_deployed_holder_upgrades_by_surge_and_is_removed_last(short_dir: Path) -> None:
    """The holder DaemonSet's life on one node, with the rendered command, config and env:
    install (it serves, Ready), an owner container under the guard's rule, a surge upgrade
    (the new pod takes the owner's fd over, the old one leaves at once on SIGTERM), then the
    uninstall with no agent: the last holder keeps serving ``handoverTimeout``, exits before the
    pod's grace period ends, and the guarded owner's next session start fails with ENOSYS (what
    docs/deploy.md tells operators to avoid by restarting such owners first)."""
    from spotgpu.core.refs import ContainerRef
    from spotgpu.guard.rule import listener_ready
    from spotgpu.testing import standin
    from spotgpu.testing.containerd import make_rootfs
    from spotgpu.testing.guard_testbed import OwnerContainer

    handover = 3
    runc = shutil.which("runc")
    assert runc is not None
    container, grace, config = _deployed_holder(short_dir, handover)
    assert grace == handover + 30
    listener = short_dir / "run" / "guard.sock"
    rootfs = make_rootfs(short_dir / "rootfs", [(standin.build_probe(short_dir / "probe"), "/bin/guardprobe")])
    holders: list[_Holder] = []
    owner: OwnerContainer | None = None
    try:
        old = _Holder(container, config, short_dir, "old", SPOTGPU_HOST_RUNTIME=runc)
        holders.append(old)
        old.wait_ready()
        assert listener_ready(str(listener)), old.log()  # the node's runc passed the check
        owner = OwnerContainer(short_dir, rootfs, "owner", listener=listener, owner=ContainerRef("ml", "dev-0", "main"))
        owner.start()
        assert owner.call(standin.CHECK_VERSION_STR)["errno"] == errno.ENOTTY  # answered: reached the "driver"

        new = _Holder(container, config, short_dir, "new", SPOTGPU_HOST_RUNTIME=runc)  # the surge pod
        holders.append(new)
        new.wait_ready()
        assert "took over 1 notify fds" in new.log(), new.log()
        assert owner.call(standin.CHECK_VERSION_STR)["errno"] == errno.ENOTTY
        old.proc.send_signal(signal.SIGTERM)  # minReadySeconds later the controller deletes the old pod
        assert old.proc.wait(10) == 0 and "exiting (successor-holds)" in old.log()
        assert owner.call(standin.CHECK_VERSION_STR)["errno"] == errno.ENOTTY

        asked = time.monotonic()
        new.proc.send_signal(signal.SIGTERM)  # helm uninstall: no successor, no agent attached
        assert new.proc.wait(grace) == 0
        took = time.monotonic() - asked
        assert handover - 0.5 <= took < grace, took
        assert f"no successor holder within {handover}s and no guard attached" in new.log(), new.log()
        assert owner.call(standin.CHECK_VERSION_STR)["errno"] == errno.ENOSYS
    finally:
        if owner is not None:
            owner.close()
        for holder in holders:
            holder.stop()


@pytest.mark.root
def test_a_holder_on_a_node_without_usable_runc_says_why_and_opens_no_listener(short_dir: Path) -> None:
    """With the node's runc missing, the holder still serves its control socket (Ready; the agent
    falls back to polling), keeps the listener closed so no owner gets the rule, and its log
    carries the script's exact reason next to the guard's summary."""
    from spotgpu.guard.rule import listener_ready

    container, _grace, config = _deployed_holder(short_dir, 60)
    holder = _Holder(container, config, short_dir, "holder", SPOTGPU_HOST_RUNTIME="/opt/nowhere/runc")
    try:
        holder.wait_ready()
        assert not listener_ready(str(short_dir / "run" / "guard.sock"))
        log = holder.log()
        assert "spotgpu-host-runtime: cannot run '/opt/nowhere/runc --version'" in log, log
        assert "return guard NOT available" in log and "not opening" in log, log
        holder.proc.send_signal(signal.SIGTERM)
        assert holder.proc.wait(10) == 0  # nothing held: it leaves at once
    finally:
        holder.stop()


@pytest.mark.root
def test_the_node_script_lists_the_running_guarded_containers(tmp_path: Path) -> None:
    """deploy/node/spotgpu-guarded-containers against a private containerd: only running
    containers whose spec carries spotgpu.io/guarded are listed, with their owner."""
    from spotgpu.testing.containerd import Containerd, make_rootfs

    rootfs = make_rootfs(tmp_path / "rootfs")
    guarded = ["--annotation", "spotgpu.io/guarded=ml/dev-0/main"]
    with Containerd(tmp_path / "containerd") as containerd:
        containerd.run_detached("owner", rootfs, ["sleep", "60"], namespace="k8s.io", extra=guarded)
        containerd.run_detached("other", rootfs, ["sleep", "60"], namespace="k8s.io")
        containerd.ctr(
            "containers", "create", "--rootfs", *guarded, str(rootfs), "stopped", "sleep", "1", namespace="k8s.io"
        )
        out = subprocess.run(
            [str(GUARDED_SCRIPT), "--address", containerd.address],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "CONTAINERD_NAMESPACE": ""},
            check=True,
        )
    assert out.stdout.splitlines() == ["owner ml/dev-0/main"], out.stderr
