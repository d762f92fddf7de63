"""The operator CLI and the ``spotgpu scheduler`` process against the HTTP API double.

``spotgpu status`` and ``spotgpu gangjob`` run in-process (``main([...])``) and print tables or
JSON; ``spotgpu scheduler`` runs as two real processes sharing one Lease, so leader election,
signal handling and the GangJob controller are exercised exactly as deployed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from kubehelpers import wait_for

from spotgpu.cli import main
from spotgpu.core import keys
from spotgpu.testing.kubeapi import KubeApiServer

CRD = f"{keys.API_GROUP}/v1alpha1"


def seed(api: KubeApiServer) -> None:
    state = {
        "GPU-a": {"owner": "dev/alice/main", "state": "idle", "health": "Healthy", "users": 1},
        "GPU-b": {"owner": "dev/alice/main", "state": "active", "health": "Unhealthy", "users": 0},
        "GPU-c": {"owner": "IdleSpace", "state": "unallocated", "health": "Healthy", "users": 0},
    }
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "gpu-1",
                "annotations": {keys.NODE_SPOT_GPU_STATE: json.dumps(state), keys.NODE_LOWPOWER_SPOT: "true"},
            },
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-1"}})  # no agent: not shown
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "job-0-0",
                "namespace": "ml",
                "annotations": {keys.ASSIGNED_DEVICES: json.dumps({"platform/spot-gpu": ["spot-GPU-a"]})},
            },
            "spec": {"nodeName": "gpu-1", "schedulerName": "spotgpu", "containers": [{"name": "main", "image": "x"}]},
        }
    )
    api.put({"apiVersion": CRD, "kind": "Queue", "metadata": {"name": "spot-queue"}, "spec": {"type": "spot"}})
    api.put(
        {
            "apiVersion": CRD,
            "kind": "PodGroup",
            "metadata": {"name": "job-0", "namespace": "ml"},
            "spec": {"queue": "spot-queue", "minMember": 1},
            "status": {"phase": "Running"},
        }
    )
    api.put(
        {
            "apiVersion": CRD,
            "kind": "PodGroup",
            "metadata": {"name": "other-0", "namespace": "ml"},
            "spec": {"queue": "spot-queue", "minMember": 2},
        }
    )


def test_status_json_and_table(api: KubeApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    seed(api)
    assert main(["status", "--server", api.url, "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (node,) = report["nodes"]
    assert (node["name"], node["total"], node["lendable"], node["lent"]) == ("gpu-1", 3, 2, 1)
    gpu_a = node["gpus"][0]
    assert gpu_a["owner"] == "dev/alice/main" and gpu_a["state"] == "idle" and gpu_a["users"] == ["ml/job-0-0"]
    assert node["gpus"][2]["owner"] is None
    (queue,) = report["queues"]
    assert (queue["name"], queue["type"], queue["pending"], queue["running"]) == ("spot-queue", "spot", 1, 1)
    assert main(["status", "--server", api.url]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NODE", "STATUS", "GPUS", "LENDABLE", "LENT", "LENT", "TO", "OWNERS", "MODE"]
    assert table[1].split()[:6] == ["gpu-1", "Ready", "3", "2", "1", "ml/job-0-0"]
    assert "active=1 idle=1 unallocated=1" in table[1]


def test_status_reports_an_unreachable_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--server", "http://127.0.0.1:9", "--request-timeout", "1"]) == 1
    assert "no answer from the API server" in capsys.readouterr().err


def test_gangjob_submit_and_list(api: KubeApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    api.put({"apiVersion": CRD, "kind": "Queue", "metadata": {"name": "spot-queue"}, "spec": {"type": "spot"}})
    argv = ["gangjob", "submit", "--server", api.url, "-n", "ml", "--queue", "spot-queue", "--replicas", "4"]
    argv += ["--gpus", "2", "--priority", "spothigh", "--image", "trainer:1", "--env", "EPOCHS=3", "-o", "json"]
    assert main([*argv, "--", "python", "train.py", "--lr", "0.1"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["metadata"]["name"].startswith("gangjob-")
    spec = created["spec"]
    assert (spec["replicas"], spec["gpus"], spec["priorityClassName"], spec["queue"]) == (
        4,
        2,
        "spothigh",
        "spot-queue",
    )
    container = spec["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "train.py", "--lr", "0.1"]
    assert container["env"] == [{"name": "EPOCHS", "value": "3"}]
    assert api.get(keys.API_GROUP, "gangjobs", created["metadata"]["name"], "ml") is not None
    assert main(["gangjob", "list", "--server", api.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["NAMESPACE", "NAME", "QUEUE"]
    assert lines[1].split()[2:6] == ["spot-queue", "spothigh", "4x2", "Pending"]


def test_gangjob_submit_refuses_bad_input_before_any_request(
    api: KubeApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["gangjob", "submit", "--server", api.url, "--replicas", "2", "--gpus", "1", "--image", "x"]
    assert main([*argv, "--min-available", "3"]) == 2
    assert "exceeds spec.replicas" in capsys.readouterr().err
    assert main([*argv, "--name", "x" * 60]) == 2
    assert api.requests("POST") == []


# ------------------------------------------------------------------------------ the scheduler process


@pytest.fixture
def schedulers(api: KubeApiServer) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(identity: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "spotgpu", "--log-level", "WARNING", "scheduler", "--server", api.url]
        cmd += ["--identity", identity, "--lease-namespace", "spotgpu-system", "--metrics-port", "0"]
        cmd += ["--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.2", "--period", "0.5"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ})
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


def holder(api: KubeApiServer) -> str | None:
    lease = api.get("coordination.k8s.io", "leases", "spotgpu-scheduler", "spotgpu-system")
    return None if lease is None else lease["spec"].get("holderIdentity") or None


def test_two_scheduler_processes_one_leader_and_handover_on_sigterm(
    api: KubeApiServer, schedulers: Callable[[str], subprocess.Popen[bytes]]
) -> None:
    first = schedulers("replica-a")
    wait_for(lambda: holder(api) == "replica-a")
    second = schedulers("replica-b")
    time.sleep(1.5)
    assert holder(api) == "replica-a"  # the standby does not take a live Lease
    # the leader's GangJob controller acts; the standby does not
    api.put(
        {
            "apiVersion": CRD,
            "kind": "GangJob",
            "metadata": {"name": "demo", "namespace": "ml"},
            "spec": {"replicas": 1, "gpus": 1, "template": {"spec": {"containers": [{"name": "main", "image": "x"}]}}},
        }
    )
    wait_for(lambda: api.get("", "pods", "demo-0-0", "ml") is not None)
    started = time.monotonic()
    first.send_signal(signal.SIGTERM)
    assert first.wait(15) == 0
    wait_for(lambda: holder(api) == "replica-b")
    assert time.monotonic() - started < 4.0  # released: no wait for the 4 s lease to expire
    second.send_signal(signal.SIGTERM)
    assert second.wait(15) == 0
    assert holder(api) is None  # released on the way out
