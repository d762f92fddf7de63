"""The agent's KubePort over the real client library against the HTTP API double."""

from __future__ import annotations

import threading

import pytest
from kubehelpers import wait_for

from spotgpu.core import keys
from spotgpu.core.errors import TemporaryError
from spotgpu.core.ids import NodeName
from spotgpu.core.refs import PodRef
from spotgpu.core.types import EvictionReason
from spotgpu.kube.agent_port import KubeAgentPort
from spotgpu.kube.client import Backoff, Connection, Retrier
from spotgpu.ports.kube import KubePort, PodEvent, PodEventType
from spotgpu.testing.kubeapi import KubeApiServer

NODE = NodeName("gpu-1")


def pod(name: str, node: str | None = NODE, *, gpus: int = 0) -> dict:
    container: dict = {"name": "main", "image": "busybox"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    spec: dict = {"containers": [container]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team"}, "spec": spec}


def node(name: str = NODE) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": {"keep": "1"}}}


@pytest.fixture
def port(conn: Connection) -> KubeAgentPort:
    return KubeAgentPort(conn, retrier=Retrier(Backoff(base=0.01, cap=0.05, attempts=4)), watch_idle_timeout=0.3)


def test_is_a_kubeport(port: KubeAgentPort) -> None:
    ported: KubePort = port
    assert ported is port


def test_patch_node_annotations_merges_and_removes(api: KubeApiServer, port: KubeAgentPort) -> None:
    api.put(node())
    api.mutate("", "nodes", NODE, lambda o: o["metadata"]["annotations"].update(old="x"))
    port.patch_node_annotations(NODE, {keys.NODE_SPOT_GPU_STATE: "{}", "old": None})
    port.patch_node_annotations(NODE, {keys.NODE_SPOT_GPU_STATE: "{}", "old": None})  # idempotent
    got = api.get("", "nodes", NODE)
    assert got is not None
    assert got["metadata"]["annotations"] == {"keep": "1", keys.NODE_SPOT_GPU_STATE: "{}"}


def test_patch_retries_conflicts_and_server_errors(api: KubeApiServer, port: KubeAgentPort) -> None:
    api.put(node())
    fault = api.inject_fault("PATCH", r"/nodes/gpu-1$", 409, reason="Conflict", times=2)
    port.patch_node_annotations(NODE, {"a": "1"})
    assert fault.hits == 2
    api.inject_fault("PATCH", r"/nodes/gpu-1$", 500, times=-1)
    with pytest.raises(TemporaryError, match="500"):
        port.patch_node_annotations(NODE, {"a": "2"})


def test_delete_pod_marks_disruption_target_then_deletes(api: KubeApiServer, port: KubeAgentPort) -> None:
    api.graceful_pod_deletion = True  # as a real server: a bound pod lingers until its kubelet confirms
    api.put(pod("spot-1"))
    port.delete_pod(PodRef("team", "spot-1"), reason=EvictionReason.OWNER_BACK, message="owner back", grace_seconds=5)
    got = api.get("", "pods", "spot-1", "team")
    assert got is not None and got["metadata"]["deletionTimestamp"]
    (cond,) = [c for c in got["status"]["conditions"] if c["type"] == keys.DISRUPTION_CONDITION]
    assert (cond["status"], cond["reason"], cond["message"]) == ("True", "OwnerBack", "owner back")
    (event,) = api.objects("", "events", "team")
    assert (event["reason"], event["type"], event["involvedObject"]["name"]) == ("OwnerBack", "Warning", "spot-1")
    deletes = api.requests("DELETE", r"/pods/spot-1$")
    assert deletes[-1].query["gracePeriodSeconds"] == "5"
    api.remove("", "pods", "spot-1", "team")
    port.delete_pod(PodRef("team", "spot-1"), reason=EvictionReason.OWNER_BACK, message="again")  # gone: success


def test_record_node_event_writes_a_warning_about_the_node(api: KubeApiServer, port: KubeAgentPort) -> None:
    port.record_node_event(NODE, reason="OwnerUnguarded", message="team/dev/main: not lent")
    port.record_node_event(NODE, reason="OwnerUnguarded", message="team/dev/main: not lent")  # deduplicated
    (event,) = api.objects("", "events", "default")
    assert (event["reason"], event["type"], event["message"]) == (
        "OwnerUnguarded",
        "Warning",
        "team/dev/main: not lent",
    )
    assert (event["involvedObject"]["kind"], event["involvedObject"]["name"]) == ("Node", NODE)


def test_list_node_pods_selects_by_node(api: KubeApiServer, port: KubeAgentPort) -> None:
    api.put(pod("owner", gpus=2))
    api.put(pod("elsewhere", node="gpu-2"))
    api.put(pod("pending", node=None))
    api.mutate(
        "",
        "pods",
        "owner",
        lambda o: o["status"].update(
            phase="Running", containerStatuses=[{"name": "main", "containerID": "containerd://abc"}]
        ),
        namespace="team",
    )
    (info,) = port.list_node_pods(NODE)
    assert info.ref == PodRef("team", "owner") and info.node == NODE and info.phase == "Running"
    assert info.containers[0].container_id == "abc"
    assert info.containers[0].requests == {"nvidia.com/gpu": 2}


def test_watch_node_pods_follows_changes_and_survives_410(api: KubeApiServer, port: KubeAgentPort) -> None:
    api.put(pod("a"))
    events: list[PodEvent] = []
    stop = threading.Event()
    t = threading.Thread(target=port.watch_node_pods, args=(NODE, events.append, stop.is_set))
    t.start()
    try:
        wait_for(lambda: [e.pod.ref.name for e in events] == ["a"])
        api.put(pod("b"))
        api.put(pod("other", node="gpu-2"))
        wait_for(lambda: [e.pod.ref.name for e in events] == ["a", "b"])
        blocked = api.inject_fault("WATCH", r"/api/v1/pods$", 503, times=-1)
        api.drop_watches()
        wait_for(lambda: blocked.hits > 0)
        api.remove("", "pods", "a", "team")
        api.compact()
        blocked.times = 0
        wait_for(lambda: any(e.type is PodEventType.DELETED and e.pod.ref.name == "a" for e in events))
        assert events[0].type is PodEventType.ADDED
    finally:
        stop.set()
        t.join(5)
    assert not t.is_alive()
