"""The chart's RBAC is sufficient and minimal for what the components really request.

Each component runs a representative scenario against the HTTP API double; every request it
makes is turned into the (API group, resource, verb) that RBAC would check, and the rendered
roles of that component must allow each one and grant nothing the scenario never used.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from gotemplate import render_chart
from kubehelpers import wait_for
from rbaceval import Attributes, attributes, service_account
from rbaceval import allowed as rbac_allows

from spotgpu.core import keys
from spotgpu.core.ids import NodeName
from spotgpu.core.refs import PodRef
from spotgpu.core.types import EvictionReason
from spotgpu.kube.agent_port import KubeAgentPort
from spotgpu.kube.client import Backoff, Connection, Retrier
from spotgpu.kube.events import EventRecorder
from spotgpu.kube.gangjob_controller import GangJobController
from spotgpu.kube.leader import ElectionConfig, LeaderElector
from spotgpu.kube.scheduler_loop import SchedulerLoop
from spotgpu.testing.kubeapi import KubeApiServer, RecordedRequest

CHART = Path(__file__).resolve().parents[2] / "deploy" / "chart" / "spotgpu"
CRD = f"{keys.API_GROUP}/v1alpha1"
Permission = tuple[str, str, str]


def permission(r: RecordedRequest) -> Permission:
    a = attributes(r)
    return a.group, a.resource, a.verb


def granted(docs: list[dict[str, Any]], component: str) -> set[Permission]:
    out: set[Permission] = set()
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["name"].startswith(f"spotgpu-{component}"):
            for rule in doc["rules"]:
                for g in rule["apiGroups"]:
                    for res in rule["resources"]:
                        out |= {(g, res, v) for v in rule["verbs"]}
    return out


def rendered() -> list[dict[str, Any]]:
    values = {"scheduler": {"gangjobNamespaces": ["ml"]}}  # the namespace of the scenario's GangJob
    return [d for text in render_chart(CHART, values).values() for d in yaml.safe_load_all(text) if d]


def node(name: str) -> dict[str, Any]:
    state = {
        g: {"owner": "IdleSpace", "state": "unallocated", "health": "Healthy", "users": 0} for g in ("GPU-a", "GPU-b")
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {keys.NODE_SPOT_GPU_STATE: json.dumps(state)}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def check(api: KubeApiServer, component: str) -> None:
    """Every request the component made is allowed, namespace and name considered, to its own
    service account (rbaceval: bindings, Roles per namespace, resourceNames), and its roles grant
    no (group, resource, verb) it never used."""
    docs = rendered()
    user, groups = service_account("spotgpu-system", f"spotgpu-{component}")
    requests = [r for r in api.requests() if not r.path.startswith("/version")]
    refused = sorted({str(attributes(r)) for r in requests if not rbac_allows(docs, user, groups, attributes(r))})
    assert not refused, f"{component} is refused {refused}"
    used = {permission(r) for r in requests}
    allowed = granted(docs, component)
    missing = sorted(used - allowed)
    assert not missing, f"{component} lacks RBAC for {missing}"
    unused = sorted(allowed - used)
    assert not unused, f"{component} is granted what it never used: {unused}"


def test_scheduler_rbac_covers_exactly_what_it_uses(api: KubeApiServer, conn: Connection) -> None:
    api.put(node("n1"))
    for name, qtype in (("spot-queue", "spot"), ("default", "reserved")):
        api.put({"apiVersion": CRD, "kind": "Queue", "metadata": {"name": name}, "spec": {"type": qtype}})
    api.put(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "high"},
            "value": 5000,
        }
    )
    fast = ElectionConfig(lease_duration=3.0, renew_deadline=2.0, retry_period=0.1)
    elector = LeaderElector(conn, name="spotgpu-scheduler", namespace="spotgpu-system", identity="a", config=fast)
    assert elector.try_once() and elector.try_once()  # create, then get + update
    events = EventRecorder(conn, component="spotgpu-scheduler")
    retry = Retrier(Backoff(base=0.01, cap=0.05, attempts=3))
    loop = SchedulerLoop(conn, may_act=elector.is_leader, idle_timeout=0.3, retrier=retry, events=events)
    controller = GangJobController(conn, may_act=lambda: True, idle_timeout=0.3, error_backoff=0.05, events=events)
    loop.start(run_thread=False)
    controller.start()
    try:
        assert loop.wait_synced(5) and controller.wait_synced(5)
        api.put(
            {
                "apiVersion": CRD,
                "kind": "GangJob",
                "metadata": {"name": "job", "namespace": "ml"},
                "spec": {
                    "replicas": 2,
                    "gpus": 1,
                    "queue": "spot-queue",
                    "retryLimit": 0,
                    "template": {"spec": {"containers": [{"name": "main", "image": "x"}]}},
                },
            }
        )
        wait_for(lambda: len(loop.pods.store) == 2 and len(loop.podgroups.store) == 1)
        # one Binding goes through but its answer is lost: the retries then hear 409 "already
        # assigned", and the applier reads the pod to see that it is bound where it wanted
        lost = api.inject_fault("POST", r"/pods/job-0-0/binding$", 504, times=1, after_serving=True)
        report = loop.run_once().report  # ShadowPod, binds, PodGroup and Queue status
        assert report is not None and report.failed == [] and lost.hits == 1
        api.put(
            {
                "apiVersion": CRD,
                "kind": "PodGroup",
                "metadata": {"name": "r", "namespace": "ml"},
                "spec": {"queue": "default", "minMember": 1, "priorityClassName": "high"},
            }
        )
        api.put(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "r-0", "namespace": "ml", "labels": {keys.POD_GROUP: "r"}},
                "spec": {
                    "schedulerName": "spotgpu",
                    "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
                },
            }
        )
        wait_for(lambda: len(loop.pods.store) == 4)
        out = loop.run_once()  # preemption: evictions, nomination
        assert out.result is not None and out.result.evictions
        wait_for(
            lambda: (api.get(keys.API_GROUP, "gangjobs", "job", "ml") or {}).get("status", {}).get("phase") == "Failed"
        )
        system = keys.DEFAULT_SHADOW_NAMESPACE  # ShadowPods live where only the scheduler writes
        shadow = next(p for p in api.objects("", "pods", system) if "shadow" in p["metadata"]["name"])
        api.mutate(
            "",
            "pods",
            shadow["metadata"]["name"],
            lambda o: o["metadata"].update(creationTimestamp="2000-01-01T00:00:00Z"),
            namespace=system,
        )
        wait_for(
            lambda: (
                len(loop.pods.store) == 2 and loop.pods.store.get(f"{system}/{shadow['metadata']['name']}") is not None
            )
        )
        api.remove("", "pods", shadow["metadata"]["name"], system)  # gone: the GPUs free up for r-0
        api.put(node("n1"))
        wait_for(lambda: len(loop.pods.store) == 1)
        loop.run_once()
    finally:
        controller.stop()
        loop.stop()
        elector.stop()
    check(api, "scheduler")


def test_agent_rbac_covers_exactly_what_it_uses(api: KubeApiServer, conn: Connection) -> None:
    import threading

    api.put(node("gpu-1"))
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "spot", "namespace": "ml"},
            "spec": {"nodeName": "gpu-1", "containers": [{"name": "main", "image": "x"}]},
        }
    )
    port = KubeAgentPort(conn, watch_idle_timeout=0.3)
    port.patch_node_annotations(NodeName("gpu-1"), {keys.NODE_SPOT_GPU_STATE: "{}"})
    assert [p.ref.name for p in port.list_node_pods(NodeName("gpu-1"))] == ["spot"]
    seen: list[str] = []
    stop = threading.Event()
    t = threading.Thread(
        target=port.watch_node_pods, args=(NodeName("gpu-1"), lambda e: seen.append(e.pod.ref.name), stop.is_set)
    )
    t.start()
    wait_for(lambda: seen == ["spot"])
    port.delete_pod(PodRef("ml", "spot"), reason=EvictionReason.OWNER_BACK, message="owner back")
    stop.set()
    t.join(5)
    check(api, "agent")


def test_the_permission_mapping() -> None:
    def req(method: str, path: str, **query: str) -> RecordedRequest:
        return RecordedRequest(method, path, query, "", None)

    assert permission(req("POST", "/api/v1/namespaces/ml/pods/p/binding")) == ("", "pods/binding", "create")
    assert attributes(req("DELETE", "/api/v1/namespaces/ml/pods/p")) == Attributes("delete", "", "pods", "ml", "p")
    assert attributes(req("GET", "/api/v1/namespaces/ml/pods")) == Attributes("list", "", "pods", "ml")
    assert permission(req("GET", "/api/v1/pods", watch="true")) == ("", "pods", "watch")
    assert permission(req("GET", "/apis/scheduling.spotgpu.io/v1alpha1/queues")) == (keys.API_GROUP, "queues", "list")
    assert permission(req("PATCH", "/apis/scheduling.spotgpu.io/v1alpha1/queues/q/status")) == (
        keys.API_GROUP,
        "queues/status",
        "patch",
    )
    assert permission(req("PUT", "/apis/coordination.k8s.io/v1/namespaces/s/leases/l")) == (
        "coordination.k8s.io",
        "leases",
        "update",
    )
    assert re.match(r"spotgpu-", "spotgpu-scheduler")
