"""The GangJob controller end to end against the HTTP API double (real client, real HTTP).

The test plays kubelet (pods go Running) and scheduler (the Eviction API), and checks that the
controller creates the gang, follows its phase, tears down and requeues an evicted gang with
the backoff, counts evictions, honours the retry limit, and does nothing while not leader.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from kubehelpers import wait_for

from spotgpu.core import keys
from spotgpu.core.clock import ManualClock
from spotgpu.kube.client import Connection
from spotgpu.kube.events import EventRecorder
from spotgpu.kube.gangjob_controller import GangJobController, WorkQueue
from spotgpu.kube.metrics import ControllerMetrics
from spotgpu.testing.kubeapi import KubeApiServer

GROUP = keys.API_GROUP


def gangjob(name: str = "train", **spec: object) -> dict:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "GangJob",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "replicas": 2,
            "queue": "spot-queue",
            "priorityClassName": "spotlow",
            "gpus": 1,
            "retryLimit": 1,
            "requeueBackoffSeconds": 0,
            "template": {"spec": {"containers": [{"name": "main", "image": "img", "command": ["sleep", "1d"]}]}},
            **spec,
        },
    }


def pod_names(api: KubeApiServer) -> list[str]:
    return [p["metadata"]["name"] for p in api.objects("", "pods", "ml") if not p["metadata"].get("deletionTimestamp")]


def status(api: KubeApiServer, name: str = "train") -> dict:
    obj = api.get(GROUP, "gangjobs", name, "ml")
    return (obj or {}).get("status") or {}


@pytest.fixture
def controller(conn: Connection, leader: threading.Event) -> Iterator[GangJobController]:
    c = GangJobController(
        conn,
        may_act=leader.is_set,
        metrics=ControllerMetrics(),
        idle_timeout=0.3,
        error_backoff=0.05,
        events=EventRecorder(conn, component="spotgpu-scheduler"),
    ).start()
    assert c.wait_synced(5)
    yield c
    c.stop()


def run_members(api: KubeApiServer) -> None:
    for name in pod_names(api):
        api.mutate("", "pods", name, lambda o: o["status"].update(phase="Running"), namespace="ml")


def evict(conn: Connection, name: str) -> None:
    conn.post(
        f"/api/v1/namespaces/ml/pods/{name}/eviction",
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "ml"}},
        f"evict {name}",
    )


def test_gang_lifecycle_with_eviction_requeue_and_retry_limit(
    api: KubeApiServer, conn: Connection, controller: GangJobController
) -> None:
    api.put(gangjob())
    wait_for(lambda: pod_names(api) == ["train-0-0", "train-0-1"])
    assert [g["metadata"]["name"] for g in api.objects(GROUP, "podgroups", "ml")] == ["train-0"]
    pod = api.get("", "pods", "train-0-0", "ml")
    assert pod is not None and pod["spec"]["schedulerName"] == "spotgpu"
    wait_for(lambda: status(api).get("phase") == "Pending")

    run_members(api)
    wait_for(lambda: status(api).get("phase") == "Running" and status(api).get("running") == 2)

    evict(conn, "train-0-0")  # the scheduler preempts one member: the whole gang goes
    wait_for(lambda: status(api).get("evictions") == 1)
    wait_for(lambda: pod_names(api) == ["train-1-0", "train-1-1"])  # backoff 0: next attempt at once
    assert [g["metadata"]["name"] for g in api.objects(GROUP, "podgroups", "ml")] == ["train-1"]
    wait_for(lambda: status(api).get("attempt") == 1)  # pods are created before the status is written
    st = status(api)
    assert st["retries"] == 1 and st["lastEvictionReason"] == "EvictionByEvictionAPI"

    run_members(api)
    wait_for(lambda: status(api).get("phase") == "Running")
    api.remove("", "pods", "train-1-1", "ml")  # deleted behind our back (e.g. by the node agent)
    wait_for(lambda: status(api).get("phase") == "Failed")
    st = status(api)
    assert st["evictions"] == 2 and "retryLimit 1" in st["message"]
    wait_for(lambda: pod_names(api) == [])
    metrics = controller.metrics
    assert metrics is not None

    def evictions(reason: str) -> float | None:
        return metrics.registry.get_sample_value("spotgpu_gangjob_evictions_total", {"reason": reason})

    wait_for(lambda: evictions("deleted") == 1)  # counted just after the status write
    assert evictions("EvictionByEvictionAPI") == 1

    def reasons() -> list[str]:
        return sorted(e["reason"] for e in api.objects("", "events", "ml") if e["involvedObject"]["kind"] == "GangJob")

    wait_for(lambda: reasons() == ["Failed", "Requeued"])  # the event follows the metric (controller order)
    assert reasons() == ["Failed", "Requeued"]


def test_requeue_waits_for_the_backoff(api: KubeApiServer, conn: Connection, controller: GangJobController) -> None:
    api.put(gangjob(requeueBackoffSeconds=1, retryLimit=3))
    wait_for(lambda: pod_names(api) == ["train-0-0", "train-0-1"])
    run_members(api)
    evict(conn, "train-0-1")
    wait_for(lambda: status(api).get("phase") == "Requeued")
    evicted_at = time.monotonic()
    assert pod_names(api) == []
    wait_for(lambda: pod_names(api) == ["train-1-0", "train-1-1"], timeout=5)
    assert time.monotonic() - evicted_at >= 0.5  # nextAttemptTime has 1 s resolution


def test_nothing_happens_while_not_leader(
    api: KubeApiServer, leader: threading.Event, controller: GangJobController
) -> None:
    leader.clear()
    api.put(gangjob())
    time.sleep(0.5)
    assert pod_names(api) == []
    leader.set()
    wait_for(lambda: pod_names(api) == ["train-0-0", "train-0-1"])


def test_temporary_api_errors_are_retried(api: KubeApiServer, controller: GangJobController) -> None:
    fault = api.inject_fault("POST", r"/namespaces/ml/pods$", 500, times=3)
    api.put(gangjob())
    wait_for(lambda: pod_names(api) == ["train-0-0", "train-0-1"])
    assert fault.hits == 3


def test_work_queue_deduplicates_and_delays() -> None:
    clock = ManualClock()
    q = WorkQueue(clock)
    q.add("a")
    q.add("a")
    q.add_after("b", 10)
    assert q.get(timeout=0.01) == "a"
    assert q.get(timeout=0.01) is None
    clock.advance(10)
    assert q.get(timeout=0.01) == "b"


SCHEDULER_ONLY = [
    *(("annotations", k) for k in (*keys.SCHEDULER_ANNOTATIONS, *keys.RUNTIME_WRITTEN)),
    *(("annotations", f"{p}.main") for p in keys.SCHEDULER_ANNOTATION_PREFIXES),
    *(("labels", k) for k in keys.SCHEDULER_LABELS),
]


def test_a_template_with_scheduler_metadata_or_a_node_name_never_yields_a_pod(
    api: KubeApiServer, controller: GangJobController
) -> None:
    """The controller's pods are the scheduler's service account's, which admission lets write the
    scheduler's metadata: through a GangJob a tenant must get none of it onto a pod."""
    attacks = {}
    for i, (where, key) in enumerate(SCHEDULER_ONLY):
        template = {"metadata": {where: {key: "true"}}, "spec": {"containers": [{"name": "main", "image": "img"}]}}
        attacks[f"attack-{i}"] = key
        api.put(gangjob(f"attack-{i}", template=template))
    node_template = {"spec": {"nodeName": "gpu-1", "containers": [{"name": "main", "image": "img"}]}}
    attacks["attack-node"] = "spec.nodeName"
    api.put(gangjob("attack-node", template=node_template))
    api.put(gangjob())  # a plain one beside them: created as always
    wait_for(lambda: all(status(api, name).get("phase") == "Failed" for name in attacks))
    wait_for(lambda: sorted(pod_names(api)) == ["train-0-0", "train-0-1"])
    for name, key in attacks.items():
        st = status(api, name)
        (condition,) = st["conditions"]
        assert condition["type"] == "TemplateAccepted" and condition["status"] == "False", name
        assert condition["reason"] == "SchedulerOnlyMetadata" and key in condition["message"], name
    groups = [g["metadata"]["name"] for g in api.objects(GROUP, "podgroups", "ml")]
    assert groups == ["train-0"]
    metrics = controller.metrics
    assert metrics is not None
    refused = "spotgpu_gangjob_templates_refused_total"
    wait_for(lambda: metrics.registry.get_sample_value(refused) == len(attacks))

    def refusal_events() -> list[dict]:
        return [e for e in api.objects("", "events", "ml") if e["reason"] == "TemplateRefused"]

    wait_for(lambda: len(refusal_events()) == len(attacks))
    assert all(e["type"] == "Warning" for e in refusal_events())
    time.sleep(0.5)  # no write loop: the refusals are written (and counted) once
    assert metrics.registry.get_sample_value(refused) == len(attacks)
    assert sorted(pod_names(api)) == ["train-0-0", "train-0-1"]
