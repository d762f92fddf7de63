"""Translation of API JSON into the scheduler core's snapshot (pure, no server needed)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core import keys
from spotgpu.core.errors import ValidationError
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import Health, NodeStrategy, QueueType, SpotPriority
from spotgpu.kube.nodestate import parse_node_state
from spotgpu.kube.objects import container_requests, quantity
from spotgpu.kube.snapshot import build_snapshot
from spotgpu.scheduler.model import GPURequest, Nomination

CRD = f"{keys.API_GROUP}/v1alpha1"


def node(name: str = "n1", state: Any = None, **annotations: str) -> dict[str, Any]:
    if state is None:
        state = {
            "GPU-a": {"owner": "IdleSpace", "health": "Healthy"},
            "GPU-b": {"owner": "dev/alice/main", "health": "Unhealthy"},
        }
    ann = {keys.NODE_SPOT_GPU_STATE: state if isinstance(state, str) else json.dumps(state), **annotations}
    return {
        "metadata": {"name": name, "annotations": ann, "labels": {"spotgpu.io/pool": "h100"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def queue(name: str, qtype: str = "spot", **spec: Any) -> dict[str, Any]:
    return {"kind": "Queue", "metadata": {"name": name}, "spec": {"type": qtype, **spec}}


def group(name: str, q: str, members: int = 1, pc: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"queue": q, "minMember": members}
    if pc:
        spec["priorityClassName"] = pc
    return {"kind": "PodGroup", "metadata": {"name": name, "namespace": "ml"}, "spec": spec}


def pod(
    name: str,
    grp: str | None,
    limits: dict[str, str],
    *,
    node_name: str | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    lab = dict(labels or {})
    if grp:
        lab[keys.POD_GROUP] = grp
    spec: dict[str, Any] = {
        "schedulerName": "spotgpu",
        "containers": [
            {"name": "sidecar", "image": "x"},
            {"name": "work", "image": "x", "resources": {"limits": limits}},
        ],
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {"name": name, "namespace": "ml", "labels": lab, "annotations": annotations or {}},
        "spec": spec,
    }


def build(**kw: Any) -> Any:
    kw.setdefault("nodes", [node()])
    kw.setdefault("queues", [queue("spot-queue"), queue("default", "reserved")])
    kw.setdefault("podgroups", [])
    kw.setdefault("pods", [])
    return build_snapshot(**kw)


def test_nodes_come_from_the_agent_state_and_annotations() -> None:
    b = build(
        nodes=[
            node(**{keys.NODE_LOWPOWER_SPOT: "true", keys.NODE_SPOT_PREFER: "lowpower"}),
            {"metadata": {"name": "no-agent"}},
        ]
    )
    (n,) = b.snapshot.nodes
    assert (n.name, n.lending, n.strategy, n.pool, n.schedulable) == ("n1", True, NodeStrategy.LOWPOWER, "h100", True)
    assert [(g.id, g.owner, g.twin) for g in n.gpus] == [
        ("GPU-a", None, Health.HEALTHY),
        ("GPU-b", ContainerRef("dev", "alice", "main"), Health.UNHEALTHY),
    ]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        pytest.param(node(state="{not json"), "not JSON", id="state-not-json"),
        pytest.param(node(state={"bad id!": {}}), "device ID", id="bad-device"),
        pytest.param(node(state={"GPU-a": {"owner": "nope"}}), "owner", id="bad-owner"),
        pytest.param(node(**{keys.NODE_LOWPOWER_SPOT: "maybe"}), "lowpower-spot", id="bad-lending"),
    ],
)
def test_a_malformed_node_is_left_out_with_the_reason(bad: dict[str, Any], reason: str) -> None:
    b = build(nodes=[bad, node("n2")])
    assert [n.name for n in b.snapshot.nodes] == ["n2"]
    (skipped,) = b.skipped
    assert skipped.kind == "Node" and reason in skipped.reason


def test_pods_requests_devices_and_groups() -> None:
    shared = {keys.SPOT_GPU_MILLI: "250", keys.ASSIGNED_DEVICES: json.dumps({"platform/spot-gpu": ["spot-GPU-a"]})}
    nominated = {keys.NOMINATED_DEVICES: json.dumps({"node": "n1", "devices": ["GPU-b"]})}
    b = build(
        podgroups=[group("s", "spot-queue", 1, "spothigh"), group("r", "default", 1, "high")],
        priority_classes=[{"metadata": {"name": "high"}, "value": 5000}],
        pods=[
            pod("s-0", "s", {"platform/spot-gpu": "1"}, node_name="n1", annotations=shared),
            pod("r-0", "r", {"nvidia.com/gpu": "1"}, annotations=nominated),
            pod("alone", None, {"nvidia.com/gpu": "1"}, labels={keys.QUEUE: "default"}),
            pod("cpu", "r", {"cpu": "1"}),
        ],
    )
    pods = {p.ref.name: p for p in b.snapshot.pods}
    assert pods["s-0"].request == GPURequest.shared(250) and pods["s-0"].devices == ("GPU-a",)
    assert pods["s-0"].container == "work"
    assert pods["r-0"].request == GPURequest.reserved(1) and pods["r-0"].nominated == Nomination("n1", ("GPU-b",))
    groups = {g.ref.name: g for g in b.snapshot.groups}
    assert groups["s"].spot_priority is SpotPriority.SPOTHIGH and groups["s"].priority == 3000
    assert groups["r"].priority == 5000 and groups["r"].spot_priority is None
    assert groups["alone"].queue == "default" and groups["alone"].min_member == 1  # a group of its own
    assert [(s.kind, s.key) for s in b.skipped] == [("Pod", "ml/cpu")]


def test_a_reserved_pod_takes_its_devices_from_the_agent_state() -> None:
    alice = pod("alice", "r", {"nvidia.com/gpu": "1"}, node_name="n1")
    alice["metadata"]["namespace"] = "dev"
    dev_group = group("r", "default")
    dev_group["metadata"]["namespace"] = "dev"
    b = build(podgroups=[group("r", "default")], pods=[alice])  # the group is in another namespace
    assert [s.reason for s in b.skipped] == ["its PodGroup 'r' does not exist (yet)"]
    state = {
        "GPU-a": {"owner": "IdleSpace", "health": "Healthy"},
        "GPU-b": {"owner": "dev/alice/work", "health": "Unhealthy"},
    }
    b = build(nodes=[node(state=state)], podgroups=[dev_group], pods=[alice])
    (placed,) = b.snapshot.pods
    assert placed.devices == ("GPU-b",)  # no assigned-devices annotation: the kubelet's allocation


def test_what_the_scheduler_placed_claims_unallocated_gpus_until_the_agent_reports() -> None:
    shadow = {
        "metadata": {
            "name": "sh",
            "namespace": SYSTEM,
            "labels": {keys.SHADOW_POD_LABEL: "true"},
            "annotations": {
                keys.POD_DEVICE_TYPE: "shadow",
                keys.SHADOW_FOR: "ml/s",
                keys.ASSIGNED_DEVICES: json.dumps({"nvidia.com/gpu": ["GPU-a"]}),
            },
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "pause"}]},
    }
    stolen = {
        **shadow,
        "metadata": {
            **shadow["metadata"],
            "name": "sh2",
            "annotations": {
                **shadow["metadata"]["annotations"],
                keys.ASSIGNED_DEVICES: json.dumps({"nvidia.com/gpu": ["GPU-b"]}),
            },
        },
    }
    b = build(pods=[shadow, stolen])
    (gpu_a, gpu_b) = b.snapshot.nodes[0].gpus
    assert gpu_a.owner == ContainerRef(SYSTEM, "sh", "main")  # claimed by the ShadowPod
    assert gpu_b.owner == ContainerRef("dev", "alice", "main")  # held by someone else: the shadow is left out
    assert [x.ref.name for x in b.snapshot.shadows] == ["sh"]
    assert [s.key for s in b.skipped] == [f"{SYSTEM}/sh2"]


SYSTEM = keys.DEFAULT_SHADOW_NAMESPACE


def _shadow_like(namespace: str, labels: dict[str, str], assigned: list[str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "fake-shadow",
            "namespace": namespace,
            "labels": labels,
            "annotations": {
                keys.POD_DEVICE_TYPE: "shadow",
                keys.SHADOW_FOR: f"{namespace}/s",
                keys.ASSIGNED_DEVICES: json.dumps({"nvidia.com/gpu": assigned}),
            },
        },
        "spec": {
            "nodeName": "n1",
            "schedulerName": "spotgpu",
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }


@pytest.mark.parametrize(
    ("namespace", "labels", "why"),
    [
        ("ml", {keys.SHADOW_POD_LABEL: "true"}, "namespace spotgpu-system"),  # a tenant's namespace
        (SYSTEM, {}, f"label {keys.SHADOW_POD_LABEL}=true"),  # no label
        ("ml", {}, "namespace spotgpu-system"),  # the annotation alone (the defect)
    ],
)
def test_a_forged_shadow_pod_is_an_ordinary_pod_counted_and_never_holds_what_it_claims(
    namespace: str, labels: dict[str, str], why: str
) -> None:
    """A tenant's pod annotated ``pod-device-type: shadow`` (and ``assigned-devices`` naming an
    unallocated GPU) is no ShadowPod: no GPU becomes "held by a ShadowPod" (lendable at once, owner
    for spot pods), and the forgery is reported."""
    b = build(pods=[_shadow_like(namespace, labels, ["GPU-a"])])
    assert b.snapshot.shadows == ()
    (pod,) = b.snapshot.pods  # the ordinary reserved pod it is
    assert not pod.request.is_spot and pod.ref == PodRef(namespace, "fake-shadow")
    (forged,) = b.forged_shadows
    assert forged.kind == "ForgedShadowPod" and why in forged.reason
    authentic = build(pods=[_shadow_like(SYSTEM, {keys.SHADOW_POD_LABEL: "true"}, ["GPU-a"])])
    assert [x.ref for x in authentic.snapshot.shadows] == [PodRef(SYSTEM, "fake-shadow")]
    assert authentic.forged_shadows == ()


def test_a_shadow_pod_holds_what_the_agent_reports_not_what_its_annotation_says() -> None:
    state = {
        "GPU-a": {"owner": f"{SYSTEM}/fake-shadow/main", "health": "Healthy"},
        "GPU-b": {"owner": "IdleSpace", "health": "Healthy"},
    }
    b = build(nodes=[node(state=state)], pods=[_shadow_like(SYSTEM, {keys.SHADOW_POD_LABEL: "true"}, ["GPU-b"])])
    (shadow,) = b.snapshot.shadows
    assert shadow.devices == ("GPU-a",)


def spot_pod(name: str, gpu: str, *, milli: int | None = None, created: str = "2024-01-01T00:00:00Z") -> dict[str, Any]:
    """A placed spot pod the scheduler assigned ``gpu`` (shared when ``milli`` is given)."""
    resource = "platform/spot-gpu-shared" if milli is not None else "platform/spot-gpu"
    annotations = {keys.ASSIGNED_DEVICES: json.dumps({"platform/spot-gpu": [f"spot-{gpu}"]})}
    if milli is not None:
        annotations[keys.SPOT_GPU_MILLI] = str(milli)
    obj = pod(name, "g", {resource: "1"}, node_name="n1", annotations=annotations)
    obj["metadata"]["creationTimestamp"] = created
    return obj


def lent_node(**use: dict[str, Any]) -> dict[str, Any]:
    """n1 with GPU-a and GPU-b lent (both Healthy), per device extra state from the agent."""
    return node(
        state={d: {"owner": "dev/alice/main", "health": "Healthy", **use.get(d, {})} for d in ("GPU-a", "GPU-b")}
    )


def test_shared_spot_pods_request_the_shared_resource_with_their_milli() -> None:
    b = build(
        nodes=[lent_node()],
        podgroups=[group("g", "spot-queue")],
        pods=[spot_pod("s", "GPU-a", milli=300), pod("bad", "g", {"platform/spot-gpu-shared": "2"})],
    )
    (shared,) = b.snapshot.pods
    assert shared.request == GPURequest.shared(300) and shared.devices == ("GPU-a",)
    (skipped,) = b.skipped
    assert skipped.key == "ml/bad" and "exactly 1" in skipped.reason


def test_the_agents_report_of_what_the_kubelet_allocated_wins_over_the_assignment() -> None:
    state = {"GPU-b": {"pods": ["ml/s"], "users": 1, "replicas": 4}}
    b = build(
        nodes=[lent_node(**state)], podgroups=[group("g", "spot-queue")], pods=[spot_pod("s", "GPU-a", milli=300)]
    )
    (placed,) = b.snapshot.pods
    assert placed.devices == ("GPU-b",)
    assert [g.twin for g in b.snapshot.nodes[0].gpus] == [Health.HEALTHY, Health.HEALTHY]


def test_spot_pods_that_cannot_share_a_gpu_are_left_out_reported_ones_first() -> None:
    # the kubelet put x (exclusive) on GPU-b, where the scheduler had put y and z (shared)
    state = {"GPU-b": {"pods": ["ml/x"], "users": 1}}
    pods = [
        spot_pod("y", "GPU-b", milli=600, created="2024-01-01T00:00:01Z"),
        spot_pod("z", "GPU-b", milli=600, created="2024-01-01T00:00:02Z"),
        spot_pod("x", "GPU-a"),
    ]
    b = build(nodes=[lent_node(**state)], podgroups=[group("g", "spot-queue")], pods=pods)
    assert [p.ref.name for p in b.snapshot.pods] == ["x"]
    assert sorted(s.key for s in b.skipped) == ["ml/y", "ml/z"]
    assert all("contradicts" in s.reason for s in b.skipped)
    state = {"GPU-b": {"pods": [], "users": 0}}  # nothing admitted yet: y fits, z would exceed one GPU
    b = build(nodes=[lent_node(**state)], podgroups=[group("g", "spot-queue")], pods=pods[:2])
    assert [p.ref.name for p in b.snapshot.pods] == ["y"] and [s.key for s in b.skipped] == ["ml/z"]


def test_a_gpu_whose_shared_replicas_are_taken_is_not_lendable_for_new_spot_pods() -> None:
    state = {"GPU-a": {"pods": ["ml/p"], "users": 1, "replicas": 2}, "GPU-b": {"replicas": 2}}
    pods = [spot_pod("p", "GPU-a", milli=100), spot_pod("q", "GPU-a", milli=100)]  # q: bound, not admitted yet
    b = build(nodes=[lent_node(**state)], podgroups=[group("g", "spot-queue")], pods=pods)
    assert len(b.snapshot.pods) == 2
    assert [g.twin for g in b.snapshot.nodes[0].gpus] == [Health.UNHEALTHY, Health.HEALTHY]


@pytest.mark.parametrize("extra", [{"pods": "ml/p"}, {"pods": ["no-slash"]}, {"replicas": -1}, {"replicas": True}])
def test_malformed_spot_use_leaves_the_node_out(extra: dict[str, Any]) -> None:
    b = build(nodes=[lent_node(**{"GPU-a": extra}), node("n2")])
    assert [n.name for n in b.snapshot.nodes] == ["n2"]
    assert b.skipped[0].kind == "Node"


def test_a_missing_queue_leaves_the_group_and_its_pods_out() -> None:
    b = build(podgroups=[group("g", "nope")], pods=[pod("p", "g", {"platform/spot-gpu": "1"})])
    assert b.snapshot.groups == () and b.snapshot.pods == ()
    assert [(s.kind, s.reason) for s in b.skipped] == [
        ("PodGroup", "queue 'nope' does not exist"),
        ("Pod", "its PodGroup 'g' does not exist (yet)"),
    ]


def test_queues_parse_capacity_in_gpus() -> None:
    b = build(queues=[queue("q", capacity="2.5"), queue("bad", capacity="lots"), queue("r", "reserved", weight=3)])
    qs = {q.name: q for q in b.snapshot.queues}
    assert qs["q"].capacity_milli == 2500 and qs["q"].type is QueueType.SPOT
    assert qs["r"].weight == 3 and "bad" not in qs


@given(st.text(max_size=40), st.text(max_size=40), st.text(max_size=20))
def test_garbage_annotations_never_break_the_snapshot(state: str, assigned: str, milli: str) -> None:
    b = build(
        nodes=[node(state=state)],
        podgroups=[group("g", "spot-queue")],
        pods=[
            pod(
                "p",
                "g",
                {"platform/spot-gpu": "1"},
                node_name="n1",
                annotations={keys.ASSIGNED_DEVICES: assigned, keys.SPOT_GPU_MILLI: milli},
            )
        ],
    )
    assert len(b.snapshot.pods) + sum(1 for s in b.skipped if s.kind == "Pod") == 1


def test_parse_node_state_refuses_non_objects() -> None:
    with pytest.raises(ValidationError, match="JSON object"):
        parse_node_state("n", "[1]")


@given(st.integers(0, 10**9))
def test_quantities(n: int) -> None:
    assert quantity(n, "x") == n
    assert quantity(f"{n}k", "x") == n * 1000
    assert quantity(f"{n}Mi", "x") == n * 2**20
    assert quantity(f"{n}m", "x") == Decimal(n) / 1000


def test_extended_resources_must_be_whole() -> None:
    assert container_requests({"resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "500m"}}}, "c") == {
        "nvidia.com/gpu": 2
    }
    with pytest.raises(ValidationError, match="whole number"):
        container_requests({"resources": {"requests": {"nvidia.com/gpu": "500m"}}}, "c")
    assert PodRef("ml", "p").format() == "ml/p"


def test_pods_on_left_out_nodes_or_unknown_gpus_are_left_out_not_the_whole_snapshot() -> None:
    from spotgpu.scheduler import run_cycle

    assigned = {keys.ASSIGNED_DEVICES: json.dumps({"platform/spot-gpu": ["spot-GPU-z"]})}
    on_a = {keys.ASSIGNED_DEVICES: json.dumps({"platform/spot-gpu": ["spot-GPU-a"]})}
    b = build(
        nodes=[node(), node("broken", state="{")],
        podgroups=[group("g", "spot-queue")],
        pods=[
            pod("on-broken", "g", {"platform/spot-gpu": "1"}, node_name="broken", annotations=on_a),
            pod("ghost-gpu", "g", {"platform/spot-gpu": "1"}, node_name="n1", annotations=assigned),
            pod("fine", "g", {"platform/spot-gpu": "1"}),
        ],
    )
    assert [p.ref.name for p in b.snapshot.pods] == ["fine"]
    reasons = {s.key: s.reason for s in b.skipped}
    assert "not in the snapshot" in reasons["ml/on-broken"]
    assert "does not report" in reasons["ml/ghost-gpu"]
    run_cycle(b.snapshot, now=0.0)  # the core accepts what is left
