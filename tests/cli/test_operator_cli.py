"""``spotgpu status``, ``gangjob`` and ``agent --check`` as an operator runs them (real
subprocesses; the cluster is the HTTP API double): quiet unless ``-v``, errors that name the
server and the cause, names and queues checked before anything is created."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotgpu.core import keys
from spotgpu.kube import crds
from spotgpu.testing.kubeapi import KubeApiServer

SPOTGPU = [sys.executable, "-m", "spotgpu"]
CRD = f"{keys.API_GROUP}/v1alpha1"


def spotgpu(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPOTGPU, *args], capture_output=True, text=True, timeout=60, check=False, env=env)


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer(crd_schemas=crds.schemas()) as server:
        yield server


def kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def test_status_against_an_unreachable_server_names_it_and_the_cause(tmp_path: Path) -> None:
    server = "https://127.0.0.1:9"
    run = spotgpu("status", "--kubeconfig", str(kubeconfig(tmp_path, server)), "--request-timeout", "2")
    assert run.returncode != 0
    assert run.stderr.strip().splitlines() == [
        f"spotgpu status: list nodes at {server}: no answer from the API server: connection refused"
    ]
    assert "INFO" not in run.stderr and "Traceback" not in run.stderr


def test_status_is_quiet_unless_verbose_and_explains_an_empty_cluster(api: KubeApiServer) -> None:
    run = spotgpu("status", "--server", api.url)
    assert run.returncode == 0, run.stderr
    assert "INFO" not in run.stderr and "HTTP Request" not in run.stderr
    assert "spotgpu status: no node runs the spotgpu agent" in run.stderr
    assert "spotgpu status: no queues" in run.stderr
    verbose = spotgpu("status", "-v", "--server", api.url)
    assert verbose.returncode == 0 and "HTTP Request: GET" in verbose.stderr


def test_gangjob_submit_refuses_an_invalid_name_or_namespace_before_any_request(api: KubeApiServer) -> None:
    argv = ["gangjob", "submit", "--server", api.url, "--replicas", "1", "--gpus", "1", "--image", "x"]
    for flag, value in (("--name", "Bad_Name"), ("--name", "x" * 51), ("--namespace", "ml.team"), ("--queue", "Q")):
        run = spotgpu(*argv, flag, value)
        assert run.returncode == 2, (flag, value)
        (line,) = run.stderr.strip().splitlines()
        assert line.startswith(f"spotgpu gangjob: {flag} '{value[:70]}' ") and "Traceback" not in run.stderr
    assert api.requests() == []


def test_gangjob_submit_refuses_a_queue_the_cluster_lacks(api: KubeApiServer) -> None:
    api.put({"apiVersion": CRD, "kind": "Queue", "metadata": {"name": "spot-queue"}, "spec": {"type": "spot"}})
    argv = ["gangjob", "submit", "--server", api.url, "--replicas", "1", "--gpus", "1", "--image", "x"]
    run = spotgpu(*argv, "--queue", "spot-queeu")
    assert run.returncode == 2
    assert run.stderr.strip() == (
        "spotgpu gangjob: --queue 'spot-queeu': no such Queue in the cluster; it has spot-queue"
    )
    assert api.requests("POST") == []
    assert spotgpu(*argv, "--queue", "spot-queue").returncode == 0
    assert len(api.requests("POST")) == 1


def test_agent_check_takes_the_node_from_the_environment_or_says_what_it_needs(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("agent: {}\n")
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    run = spotgpu("agent", "--config", str(config), "--check", env=env)
    assert run.returncode == 2
    assert f"configuration {config} OK (no node name yet)" in run.stdout
    assert "no node name: set agent.nodeName, --node or $NODE_NAME" in run.stderr
    run = spotgpu("agent", "--config", str(config), "--check", env={**env, "NODE_NAME": "gpu-7"})
    assert run.returncode == 0 and f"configuration {config} OK for node gpu-7" in run.stdout
    missing = spotgpu("agent", "--check", env=env)  # the chart's path, absent here
    assert missing.returncode == 2 and "/etc/spotgpu/config.yaml: cannot read configuration" in missing.stderr
