"""The scheduler control loop against the HTTP API double, with the real scheduler core.

The test plays the node agent (the ``spotgpu.io/spot-gpu-state`` node annotation) and the
kubelet (removing evicted pods); the loop lists and watches, builds the snapshot, runs
``spotgpu.scheduler.run_cycle`` and applies its decisions through the real client: ShadowPod
creation, Binding with the device-owner annotation, preemption through the Eviction API with
the DisruptionTarget reason, nominations, PodGroup status; 409 and 5xx are retried; nothing
happens while not leader.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from spotgpu.core import keys
from spotgpu.kube.apply import ApplyConfig, EvictionMode
from spotgpu.kube.client import Backoff, Connection, Retrier
from spotgpu.kube.events import EventRecorder
from spotgpu.kube.scheduler_loop import Assumptions, SchedulerLoop
from spotgpu.testing.kubeapi import KubeApiServer

CRD = f"{keys.API_GROUP}/v1alpha1"


def node(name: str, gpus: dict[str, str | None], *, lending: bool = False) -> dict:
    state = {
        g: {"owner": owner or "IdleSpace", "state": "idle" if owner else "unallocated", "health": "Healthy", "users": 0}
        for g, owner in gpus.items()
    }
    annotations = {keys.NODE_SPOT_GPU_STATE: json.dumps(state), keys.NODE_LOWPOWER_SPOT: str(lending).lower()}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def queue(name: str, qtype: str) -> dict:
    return {"apiVersion": CRD, "kind": "Queue", "metadata": {"name": name}, "spec": {"type": qtype, "weight": 1}}


def podgroup(name: str, queue_name: str, members: int, priority: str | None = None) -> dict:
    spec: dict = {"queue": queue_name, "minMember": members}
    if priority:
        spec["priorityClassName"] = priority
    return {"apiVersion": CRD, "kind": "PodGroup", "metadata": {"name": name, "namespace": "ml"}, "spec": spec}


def pod(name: str, group: str, resource: str, count: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "labels": {keys.POD_GROUP: group}},
        "spec": {
            "schedulerName": "spotgpu",
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {resource: str(count)}}}],
        },
    }


@pytest.fixture
def loop(conn: Connection, leader: threading.Event) -> Iterator[SchedulerLoop]:
    lp = SchedulerLoop(
        conn,
        may_act=leader.is_set,
        idle_timeout=0.3,
        retrier=Retrier(Backoff(base=0.01, cap=0.05, attempts=5)),
        events=EventRecorder(conn, component="spotgpu-scheduler"),
    ).start(run_thread=False)
    yield lp
    lp.stop()


def cluster(api: KubeApiServer) -> None:
    api.put(node("n1", {"GPU-a": None, "GPU-b": None}))
    api.put(queue("spot-queue", "spot"))
    api.put(queue("default", "reserved"))


def settle(api: KubeApiServer, loop: SchedulerLoop) -> None:
    """Wait until every informer has caught up with the double's latest version."""
    import time

    deadline = time.monotonic() + 5
    target = str(api.resource_version)
    while time.monotonic() < deadline:
        if all(i.synced for i in loop.informers) and max(int(i.resource_version or 0) for i in loop.informers) >= int(
            target
        ):
            time.sleep(0.05)
            return
        time.sleep(0.01)
    raise AssertionError("informers did not catch up")


def spot_gang(api: KubeApiServer) -> None:
    api.put(podgroup("spot1", "spot-queue", 2, "spotlow"))
    api.put(pod("s-0", "spot1", "platform/spot-gpu", 1))
    api.put(pod("s-1", "spot1", "platform/spot-gpu", 1))


def test_a_spot_gang_gets_a_shadow_pod_and_bindings_with_device_owners(api: KubeApiServer, loop: SchedulerLoop) -> None:
    cluster(api)
    spot_gang(api)
    settle(api, loop)
    out = loop.run_once()
    assert out.report is not None and out.report.failed == []
    system = keys.DEFAULT_SHADOW_NAMESPACE  # never the gang's namespace: only the scheduler writes there
    (shadow,) = [p for p in api.objects("", "pods", system) if p["metadata"]["name"].startswith("spot1-shadow")]
    assert shadow["spec"]["nodeName"] == "n1"
    assert shadow["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert shadow["metadata"]["annotations"][keys.POD_DEVICE_TYPE] == "shadow"
    assert shadow["metadata"]["labels"][keys.SHADOW_POD_LABEL] == "true"
    owners = {}
    for name in ("s-0", "s-1"):
        bound = api.get("", "pods", name, "ml")
        assert bound is not None and bound["spec"]["nodeName"] == "n1"
        owners.update(json.loads(bound["metadata"]["annotations"][keys.DEVICE_OWNER]))
    shadow_container = f"{system}/{shadow['metadata']['name']}/main"
    assert owners == {"GPU-a": shadow_container, "GPU-b": shadow_container}
    group = api.get(keys.API_GROUP, "podgroups", "spot1", "ml")
    assert group is not None and group["status"]["phase"] == "Running"
    spot_queue = api.get(keys.API_GROUP, "queues", "spot-queue")
    assert spot_queue is not None and spot_queue["status"] == {"pending": 0, "running": 1}
    scheduled = [e for e in api.objects("", "events", "ml") if e["reason"] == "Scheduled"]
    assert sorted(e["involvedObject"]["name"] for e in scheduled) == ["s-0", "s-1"]
    # one Binding POST per pod carried the annotations: never a bound pod without its owner
    assert len(api.requests("POST", r"/pods/s-0/binding$")) == 1
    # the next cycle, before or after the caches caught up, decides nothing new
    again = loop.run_once()
    assert again.result is not None and list(again.result.decisions()) == []
    settle(api, loop)
    again = loop.run_once()
    assert again.result is not None and [type(d).__name__ for d in again.result.decisions()] == []


def test_a_podgroup_phase_the_cache_has_not_seen_yet_is_not_set_again(api: KubeApiServer, loop: SchedulerLoop) -> None:
    """The PodGroup informer lags behind our own status patch (its watch event comes later): the
    next cycle must assume the phase it set, as it assumes its binds, and decide nothing new."""
    cluster(api)
    spot_gang(api)
    settle(api, loop)
    stale = loop.podgroups.store.get("ml/spot1")
    assert stale is not None and (stale.get("status") or {}).get("phase") in (None, "Pending")
    out = loop.run_once()
    assert out.result is not None and any(type(d).__name__ == "PodGroupStatus" for d in out.result.decisions())
    settle(api, loop)
    loop.podgroups.store.upsert(stale)  # the watch event of our status patch has not arrived yet
    again = loop.run_once()
    assert again.result is not None and list(again.result.decisions()) == []


def test_a_reserved_gang_preempts_the_spot_gang_through_the_eviction_api(
    api: KubeApiServer, loop: SchedulerLoop
) -> None:
    cluster(api)
    spot_gang(api)
    settle(api, loop)
    loop.run_once()
    settle(api, loop)
    api.put(podgroup("train", "default", 1))
    api.put(pod("r-0", "train", "nvidia.com/gpu", 2))
    settle(api, loop)
    out = loop.run_once()
    assert out.result is not None
    kinds = [type(d).__name__ for d in out.result.decisions()]
    assert kinds.count("Evict") == 2 and "Nominate" in kinds
    assert out.report is not None and out.report.failed == []
    remaining = {p["metadata"]["name"] for p in api.objects("", "pods", "ml")}
    assert "s-0" not in remaining and "s-1" not in remaining  # evicted (the double deletes at once)
    evictions = api.requests("POST", r"/pods/s-[01]/eviction$")
    assert len(evictions) == 2
    marks = [r.body for r in api.requests("PATCH", r"/pods/s-0/status$")]
    assert marks[-1]["status"]["conditions"][0]["reason"] == "ReservedPreempt"
    r0 = api.get("", "pods", "r-0", "ml")
    assert r0 is not None and json.loads(r0["metadata"]["annotations"][keys.NOMINATED_DEVICES])["node"] == "n1"
    assert r0["status"]["nominatedNodeName"] == "n1"
    preempted = [e for e in api.objects("", "events", "ml") if e["reason"] == "Preempted"]
    assert sorted(e["involvedObject"]["name"] for e in preempted) == ["s-0", "s-1"]
    assert all(e["type"] == "Warning" and e["source"]["component"] == "spotgpu-scheduler" for e in preempted)
    assert (
        loop.metrics.registry.get_sample_value(
            "spotgpu_scheduler_evictions_total", {"reason": "ReservedPreempt", "method": "evict"}
        )
        == 2
    )


def test_nothing_is_written_while_not_leader(api: KubeApiServer, loop: SchedulerLoop, leader: threading.Event) -> None:
    cluster(api)
    spot_gang(api)
    settle(api, loop)
    leader.clear()
    writes_before = len(api.requests("POST")) + len(api.requests("PATCH"))
    out = loop.run_once()
    assert out.skipped and out.result is None
    assert len(api.requests("POST")) + len(api.requests("PATCH")) == writes_before
    leader.set()
    assert loop.run_once().report is not None


def test_conflicts_and_server_errors_on_binding_are_retried(api: KubeApiServer, loop: SchedulerLoop) -> None:
    cluster(api)
    spot_gang(api)
    settle(api, loop)
    conflict = api.inject_fault("POST", r"/pods/s-0/binding$", 409, reason="Conflict", times=1)
    flaky = api.inject_fault("POST", r"/pods/s-1/binding$", 503, times=2)
    out = loop.run_once()
    assert out.report is not None and out.report.failed == []
    assert conflict.hits == 1 and flaky.hits == 2
    for name in ("s-0", "s-1"):
        got = api.get("", "pods", name, "ml")
        assert got is not None and got["spec"]["nodeName"] == "n1"


def test_a_failed_shadow_pod_blocks_the_binds_that_need_it(api: KubeApiServer, loop: SchedulerLoop) -> None:
    cluster(api)
    spot_gang(api)
    settle(api, loop)
    api.inject_fault("POST", rf"/namespaces/{keys.DEFAULT_SHADOW_NAMESPACE}/pods$", 403, reason="Forbidden", times=-1)
    out = loop.run_once()
    assert out.report is not None
    assert [type(d).__name__ for d, _ in out.report.failed] == ["CreateShadowPod"]
    assert [type(d).__name__ for d, _ in out.report.skipped] == ["Bind", "Bind"]
    assert all(not (api.get("", "pods", n, "ml") or {}).get("spec", {}).get("nodeName") for n in ("s-0", "s-1"))


def test_delete_mode_and_disruption_budgets(api: KubeApiServer, conn: Connection) -> None:
    from spotgpu.core.refs import PodRef
    from spotgpu.core.types import EvictionReason
    from spotgpu.kube.apply import Applier
    from spotgpu.kube.client import TooManyRequests
    from spotgpu.scheduler.decisions import Evict

    api.put(pod("a", "g", "platform/spot-gpu", 1))
    api.put(pod("b", "g", "platform/spot-gpu", 1))
    evict = Applier(conn, retrier=Retrier(Backoff(base=0.01, cap=0.02, attempts=2)))
    api.block_evictions("ml", "a", times=5)
    decision = Evict(PodRef("ml", "a"), PodRef("ml", "g"), None, (), EvictionReason.RESERVED_PREEMPT, "needed")
    with pytest.raises(TooManyRequests):
        evict.evict(decision)
    held = api.get("", "pods", "a", "ml")
    assert held is not None  # the budget held; the next cycle tries again
    (cond,) = [c for c in held["status"]["conditions"] if c["type"] == keys.DISRUPTION_CONDITION]
    assert (cond["status"], cond["reason"]) == ("False", "EvictionBlocked")  # no longer counted as leaving
    delete = Applier(conn, config=ApplyConfig(eviction_mode=EvictionMode.DELETE))
    delete.evict(Evict(PodRef("ml", "b"), PodRef("ml", "g"), None, (), EvictionReason.RESERVED_PREEMPT, "needed"))
    assert api.get("", "pods", "b", "ml") is None
    assert api.requests("POST", r"/pods/b/eviction$") == []


def test_assumptions_hide_cache_lag_until_confirmed() -> None:
    a = Assumptions(ttl=30.0)
    pending = {"metadata": {"name": "p", "namespace": "ml"}, "spec": {}}
    bound = {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"nodeName": "n1"}}
    a.add("ml/p", "bind", bound, now=0.0)
    assert a.overlay([pending], now=1.0) == [bound]  # cache still says pending: use what we did
    assert a.overlay([bound], now=2.0) == [bound]  # confirmed: dropped
    assert a.items == {}
    a.add("ml/p", "bind", bound, now=0.0)
    assert a.overlay([pending], now=31.0) == [pending]  # expired: trust the cache again
    a.add("ml/shadow", "create", {"metadata": {"name": "shadow", "namespace": "ml"}}, now=0.0)
    assert [p["metadata"]["name"] for p in a.overlay([], now=1.0)] == ["shadow"]


def test_events_are_deduplicated_and_failures_never_raise(api: KubeApiServer, conn: Connection) -> None:
    from spotgpu.core.clock import ManualClock
    from spotgpu.kube.events import pod_reference

    clock = ManualClock()
    rec = EventRecorder(conn, component="test", clock=clock, dedupe_window=60)
    ref = pod_reference("ml", "p")
    assert rec.record(ref, reason="Unschedulable", message="no GPUs") is True
    assert rec.record(ref, reason="Unschedulable", message="no GPUs") is False
    assert rec.record(ref, reason="Unschedulable", message="other") is True
    clock.advance(61)
    assert rec.record(ref, reason="Unschedulable", message="no GPUs") is True
    assert len(api.objects("", "events", "ml")) == 3
    api.inject_fault("POST", r"/events$", 500, times=-1)
    assert rec.record(ref, reason="X", message="y") is False


def test_metrics_are_served_over_http(api: KubeApiServer, loop: SchedulerLoop) -> None:
    import httpx2

    from spotgpu.kube.metrics import serve

    cluster(api)
    spot_gang(api)
    settle(api, loop)
    loop.run_once()
    server = serve(loop.metrics, 0, "127.0.0.1")
    try:
        text = httpx2.get(f"http://127.0.0.1:{server.server_port}/metrics").text
    finally:
        server.shutdown()
        server.server_close()
    assert "spotgpu_scheduler_leader 1.0" in text
    assert 'spotgpu_scheduler_binds_total{kind="spot"} 2.0' in text
    assert 'spotgpu_scheduler_cycles_total{result="ok"} 1.0' in text


def test_a_bind_lost_to_another_node_fails_and_a_lost_answer_succeeds(api: KubeApiServer, conn: Connection) -> None:
    from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, DeviceID, NodeName
    from spotgpu.core.refs import PodRef
    from spotgpu.kube.apply import Applier
    from spotgpu.scheduler.decisions import Bind

    api.put(pod("a", "g", "nvidia.com/gpu", 1))
    api.put(pod("b", "g", "nvidia.com/gpu", 1))
    applier = Applier(conn, retrier=Retrier(Backoff(base=0.01, cap=0.02, attempts=3)))

    def bind(name: str) -> Bind:
        return Bind(PodRef("ml", name), PodRef("ml", "g"), NodeName("n1"), NVIDIA_GPU_RESOURCE, (DeviceID("GPU-a"),))

    api.mutate("", "pods", "a", lambda o: o["spec"].update(nodeName="n2"), namespace="ml")
    report = applier.apply([bind("a")])
    assert [str(msg) for _, msg in report.failed] == ["bind pod ml/a to n1: the pod is bound to 'n2' already"]
    api.inject_fault("POST", r"/pods/b/binding$", 504, after_serving=True)
    assert applier.apply([bind("b")]).failed == []
    got = api.get("", "pods", "b", "ml")
    assert got is not None and got["spec"]["nodeName"] == "n1"
    assert len(api.requests("POST", r"/pods/b/binding$")) == 2  # the lost one, then one 409: no more


def test_the_background_loop_schedules_on_changes(api: KubeApiServer, conn: Connection) -> None:
    from kubehelpers import wait_for

    cluster(api)
    lp = SchedulerLoop(conn, idle_timeout=0.3, period=5.0, min_interval=0.05).start()
    try:
        assert lp.wait_synced(5)
        spot_gang(api)  # the informers' events wake the loop well before its 5 s period
        wait_for(
            lambda: all((api.get("", "pods", n, "ml") or {}).get("spec", {}).get("nodeName") for n in ("s-0", "s-1"))
        )
    finally:
        lp.stop()
