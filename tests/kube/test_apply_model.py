"""The Kubernetes applier against the model-level applier: one CycleResult, applied through the API
(the HTTP API double, through the real client) and through :func:`spotgpu.scheduler.apply_result`;
the snapshot built back from the API objects must be the model the pure applier says.

Compared: every pod's node, devices, eviction state and nomination; every ShadowPod's node,
devices, gang and deletion state; every PodGroup's phase; every GPU's owner. Not compared: times
the API server stamps (creation, start) and twin health, which only the node agent reports.
"""

from __future__ import annotations

import json
from typing import Any

from spotgpu.core import keys
from spotgpu.core.shadow import shadow_labels
from spotgpu.kube.apply import Applier, ApplyConfig, EvictionMode
from spotgpu.kube.client import Connection
from spotgpu.kube.snapshot import build_snapshot
from spotgpu.scheduler import Snapshot, run_cycle
from spotgpu.scheduler.apply import apply_result
from spotgpu.testing.kubeapi import KubeApiServer

CRD = f"{keys.API_GROUP}/v1alpha1"
NOW = 1_900_000_000.0


def node(name: str, gpus: dict[str, str | None], *, lending: bool = False) -> dict[str, Any]:
    state = {g: {"owner": owner or "IdleSpace", "health": "Healthy"} for g, owner in gpus.items()}
    annotations = {
        keys.NODE_SPOT_GPU_STATE: json.dumps(state),
        keys.NODE_LOWPOWER_SPOT: str(lending).lower(),
        keys.NODE_SPOT_PREFER: "lowpower" if lending else "idle",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def podgroup(name: str, queue: str, members: int, priority: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"queue": queue, "minMember": members}
    if priority:
        spec["priorityClassName"] = priority
    return {"apiVersion": CRD, "kind": "PodGroup", "metadata": {"name": name, "namespace": "ml"}, "spec": spec}


def pod(name: str, group: str, resource: str, count: int, **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "labels": {keys.POD_GROUP: group}, "annotations": {}},
        "spec": {
            "schedulerName": "spotgpu",
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {resource: str(count)}}}],
        },
    }
    if "node" in extra:
        obj["spec"]["nodeName"] = extra["node"]
        obj["metadata"]["annotations"][keys.ASSIGNED_DEVICES] = json.dumps({resource: extra["devices"]})
        obj["metadata"]["annotations"][keys.DEVICE_OWNER] = json.dumps(extra["owners"])
        obj["status"] = {"phase": "Running"}
    return obj


def shadow(name: str, node_name: str, devices: list[str], group: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": keys.DEFAULT_SHADOW_NAMESPACE,  # authentic: the scheduler-only namespace and label
            "labels": shadow_labels(),
            "annotations": {
                keys.POD_DEVICE_TYPE: "shadow",
                keys.ASSIGNED_DEVICES: json.dumps({"nvidia.com/gpu": devices}),
                keys.SHADOW_FOR: f"ml/{group}",
            },
        },
        "spec": {
            "nodeName": node_name,
            "schedulerName": "spotgpu",
            "containers": [{"name": "main", "image": "pause"}],
        },
        "status": {"phase": "Running"},
    }


def cluster(api: KubeApiServer) -> None:
    """A node whose GPUs a running spot gang holds through a ShadowPod, free nodes, a lending
    node with an idle owner; a pending reserved gang that must preempt, pending spot gangs."""
    holder = f"{keys.DEFAULT_SHADOW_NAMESPACE}/old-shadow/main"
    api.put(node("busy", {"GPU-a": holder, "GPU-b": holder}))
    api.put(node("free", {"GPU-c": None, "GPU-d": None}))
    api.put(node("free2", {"GPU-g": None, "GPU-h": None}))
    api.put(node("free3", {"GPU-i": None}))
    api.put(node("dev", {"GPU-e": "team/alice/main", "GPU-f": "team/alice/main"}, lending=True))
    for name, qtype in (("spot-queue", "spot"), ("default", "reserved")):
        api.put({"apiVersion": CRD, "kind": "Queue", "metadata": {"name": name}, "spec": {"type": qtype}})
    api.put(podgroup("old", "spot-queue", 1, "spotlow"))
    api.put(shadow("old-shadow", "busy", ["GPU-a", "GPU-b"], "old"))
    owners = {"GPU-a": holder, "GPU-b": holder}
    api.put(
        pod("old-0", "old", "platform/spot-gpu", 2, node="busy", devices=["spot-GPU-a", "spot-GPU-b"], owners=owners)
    )
    api.put(podgroup("train", "default", 3))
    for i in range(3):
        api.put(pod(f"train-{i}", "train", "nvidia.com/gpu", 2))
    api.put(podgroup("spot1", "spot-queue", 1, "spotmid"))
    api.put(pod("s1-0", "spot1", "platform/spot-gpu", 1))
    api.put(podgroup("spot2", "spot-queue", 2, "spotmid"))
    api.put(pod("s2-0", "spot2", "platform/spot-gpu", 1))
    api.put(pod("s2-1", "spot2", "platform/spot-gpu", 1))


EXTERNAL = {"GPU-e": "team/alice/main", "GPU-f": "team/alice/main"}
"""GPUs a pod of another scheduler holds (a developer machine)."""


def play_agent(api: KubeApiServer) -> None:
    """The kubelet allocates what the scheduler assigned, the agent reports the owners."""
    held: dict[str, str] = dict(EXTERNAL)
    for p in api.objects("", "pods"):
        meta = p["metadata"]
        assigned = json.loads(meta.get("annotations", {}).get(keys.ASSIGNED_DEVICES, "{}"))
        container = p["spec"]["containers"][0]["name"]
        for resource, devices in assigned.items():
            if resource == "nvidia.com/gpu" and p["spec"].get("nodeName"):
                held.update(dict.fromkeys(devices, f"{meta['namespace']}/{meta['name']}/{container}"))

    for n in api.objects("", "nodes"):

        def report(obj: dict[str, Any]) -> None:
            ann = obj["metadata"]["annotations"]
            state = json.loads(ann[keys.NODE_SPOT_GPU_STATE])
            for device, entry in state.items():
                entry["owner"] = held.get(device, "IdleSpace")
            ann[keys.NODE_SPOT_GPU_STATE] = json.dumps(state)

        api.mutate("", "nodes", n["metadata"]["name"], report)


def observed(api: KubeApiServer) -> Snapshot:
    return build_snapshot(
        nodes=api.objects("", "nodes"),
        pods=api.objects("", "pods"),
        podgroups=api.objects(keys.API_GROUP, "podgroups"),
        queues=api.objects(keys.API_GROUP, "queues"),
    ).snapshot


def model(snap: Snapshot) -> dict[str, Any]:
    return {
        "pods": {p.ref: (p.node, p.devices, p.evicting, p.nominated) for p in snap.pods},
        "shadows": {s.ref: (s.node, s.devices, s.group, s.deleting) for s in snap.shadows},
        "phases": {g.ref: g.phase for g in snap.groups},
        "owners": {g.id: g.owner for n in snap.nodes for g in n.gpus},
    }


def test_the_kubernetes_applier_makes_the_model_the_pure_applier_says(api: KubeApiServer, conn: Connection) -> None:
    cluster(api)
    before = observed(api)
    assert [p.ref.name for p in before.pods if p.node is not None] == ["old-0"]
    applier = Applier(conn, config=ApplyConfig(eviction_mode=EvictionMode.DELETE))
    now = NOW
    kinds: set[str] = set()
    for _ in range(3):  # evict + nominate, delete the ShadowPod, bind the preemptor
        result = run_cycle(before, now=now)
        kinds.update(type(d).__name__ for d in result.decisions())
        report = applier.apply(result.decisions())
        assert report.failed == [] and report.skipped == []
        play_agent(api)
        after = observed(api)
        assert model(after) == model(apply_result(before, result, now, evicted="gone"))
        before, now = after, now + 10
    placed = {p.ref.name: p.node for p in before.pods if p.node is not None}
    assert {"train-0", "train-1", "train-2", "s1-0", "s2-0", "s2-1"} == placed.keys()
    assert {placed[f"train-{i}"] for i in range(3)} == {"busy", "free", "free2"}
    assert kinds == {
        "Evict",
        "Nominate",
        "DeleteShadowPod",
        "ClearNomination",
        "CreateShadowPod",
        "Bind",
        "PodGroupStatus",
    }
