"""The HTTP Kubernetes API double itself: the wire behaviour our control loops rely on.

These tests drive the double through the real client library (lightkube) and plain HTTP, and
check the semantics a real kube-apiserver has: resourceVersion and 409 on stale writes,
patches, selectors, watch resume and 410 Gone, Binding, Eviction, finalizers, garbage collection
and CRD schema validation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod, PodEviction
from lightkube.types import PatchType

from spotgpu.core import keys
from spotgpu.kube.client import AlreadyExists, Conflict, Connection, NotFound, Rejected, TooManyRequests, api_errors
from spotgpu.kube.resources import GangJobResource
from spotgpu.testing.kubeapi import KubeApiServer, merge_patch, parse_label_selector, strategic_merge_patch


def make_pod(name: str, **labels: str) -> Pod:
    return Pod(
        metadata=ObjectMeta(name=name, namespace="default", labels=labels or None),
        spec=PodSpec(containers=[Container(name="main", image="busybox")]),
    )


def test_create_get_list_and_resource_versions(api: KubeApiServer, conn: Connection) -> None:
    a = conn.client.create(make_pod("a", app="x"))
    b = conn.client.create(make_pod("b", app="y"))
    assert int(b.metadata.resourceVersion) > int(a.metadata.resourceVersion)
    assert a.metadata.uid and a.status.phase == "Pending"
    listed = conn.client.list(Pod, namespace="default", labels={"app": "x"})
    assert [p.metadata.name for p in listed] == ["a"]
    assert int(listed.resourceVersion) >= int(b.metadata.resourceVersion)
    with pytest.raises(AlreadyExists), api_errors("create a again"):
        conn.client.create(make_pod("a"))
    with pytest.raises(NotFound), api_errors("get missing"):
        conn.client.get(Pod, "missing", namespace="default")


def test_stale_put_is_a_conflict_and_current_one_wins(conn: Connection) -> None:
    pod = conn.client.create(make_pod("a"))
    pod.metadata.labels = {"v": "1"}
    fresh = conn.client.replace(pod)
    pod.metadata.labels = {"v": "2"}  # still carries the old resourceVersion
    with pytest.raises(Conflict), api_errors("stale replace"):
        conn.client.replace(pod)
    assert conn.client.get(Pod, "a", namespace="default").metadata.labels == {"v": "1"}
    assert fresh.metadata.resourceVersion != pod.metadata.resourceVersion


def test_patch_types(conn: Connection) -> None:
    conn.client.create(make_pod("a", keep="yes", drop="yes"))
    conn.client.patch(
        Pod, "a", {"metadata": {"labels": {"drop": None, "new": "1"}}}, namespace="default", patch_type=PatchType.MERGE
    )
    conds = [{"type": "A", "status": "True"}, {"type": "B", "status": "False"}]
    conn.client.patch(Pod.Status, "a", {"status": {"conditions": conds}}, namespace="default")
    conn.client.patch(
        Pod.Status,
        "a",
        {"status": {"conditions": [{"type": "B", "status": "True"}]}},
        namespace="default",
        patch_type=PatchType.STRATEGIC,
    )
    conn.client.patch(
        Pod,
        "a",
        [{"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}}],
        namespace="default",
        patch_type=PatchType.JSON,
    )
    pod = conn.client.get(Pod, "a", namespace="default")
    assert pod.metadata.labels == {"keep": "yes", "new": "1"}
    assert [(c.type, c.status) for c in pod.status.conditions] == [("A", "True"), ("B", "True")]
    assert pod.metadata.annotations == {"x": "y"}
    with pytest.raises(Rejected), api_errors("failing json patch test"):
        conn.client.patch(
            Pod,
            "a",
            [{"op": "test", "path": "/metadata/name", "value": "b"}],
            namespace="default",
            patch_type=PatchType.JSON,
        )


def test_status_subresource_is_separate_from_the_object(conn: Connection) -> None:
    conn.client.create(make_pod("a"))
    conn.client.patch(Pod, "a", {"status": {"phase": "Running"}}, namespace="default", patch_type=PatchType.MERGE)
    assert conn.client.get(Pod, "a", namespace="default").status.phase == "Pending"
    conn.client.patch(
        Pod.Status, "a", {"status": {"phase": "Running"}}, namespace="default", patch_type=PatchType.MERGE
    )
    assert conn.client.get(Pod, "a", namespace="default").status.phase == "Running"


def test_binding_copies_annotations_and_refuses_a_second_bind(api: KubeApiServer, conn: Connection) -> None:
    conn.client.create(make_pod("a"))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "a", "annotations": {keys.DEVICE_OWNER: "{}"}},
        "target": {"kind": "Node", "name": "n1"},
    }
    answer = conn.post("/api/v1/namespaces/default/pods/a/binding", binding, "bind a")
    assert answer["kind"] == "Status" and answer["status"] == "Success"  # what kube-apiserver answers
    pod = conn.client.get(Pod, "a", namespace="default")
    assert pod.spec.nodeName == "n1"
    assert pod.metadata.annotations[keys.DEVICE_OWNER] == "{}"
    with pytest.raises(Conflict, match="already assigned"):
        conn.post("/api/v1/namespaces/default/pods/a/binding", binding, "bind again")


def test_eviction_sets_disruption_target_then_deletes_or_answers_429(api: KubeApiServer, conn: Connection) -> None:
    conn.client.create(make_pod("a"))
    conn.client.create(make_pod("b"))
    api.block_evictions("default", "b")
    rv = api.resource_version
    ev = PodEviction(metadata=ObjectMeta(name="a", namespace="default"))
    conn.client.create(ev, name="a", namespace="default")
    with pytest.raises(TooManyRequests), api_errors("evict b"):
        conn.client.create(
            PodEviction(metadata=ObjectMeta(name="b", namespace="default")), name="b", namespace="default"
        )
    assert [p.metadata.name for p in conn.client.list(Pod, namespace="default")] == ["b"]
    with httpx2.Client(base_url=api.url) as http:
        text = http.get("/api/v1/pods", params={"watch": "1", "resourceVersion": str(rv), "timeoutSeconds": "1"}).text
    seen = [json.loads(x) for x in text.splitlines() if x]
    kinds = [(e["type"], e["object"]["metadata"]["name"]) for e in seen]
    assert kinds == [("MODIFIED", "a"), ("DELETED", "a")]
    cond = seen[0]["object"]["status"]["conditions"][-1]
    assert cond["type"] == keys.DISRUPTION_CONDITION and cond["reason"] == "EvictionByEvictionAPI"


def test_watch_resumes_from_version_and_410_after_compaction(api: KubeApiServer, conn: Connection) -> None:
    conn.client.create(make_pod("a"))
    rv = api.resource_version
    conn.client.create(make_pod("b"))
    conn.client.delete(Pod, "a", namespace="default")
    with httpx2.Client(base_url=api.url) as http:
        lines = http.get("/api/v1/pods", params={"watch": "1", "resourceVersion": str(rv), "timeoutSeconds": "1"})
        events = [json.loads(x) for x in lines.text.splitlines() if x]
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b"), ("DELETED", "a")]
        api.compact()
        gone = http.get("/api/v1/pods", params={"watch": "1", "resourceVersion": str(rv), "timeoutSeconds": "1"})
        (error,) = [json.loads(x) for x in gone.text.splitlines() if x]
        assert error["type"] == "ERROR" and error["object"]["code"] == 410


def test_label_selector_change_turns_into_added_and_deleted(api: KubeApiServer, conn: Connection) -> None:
    conn.client.create(make_pod("a", team="x"))
    rv = api.resource_version
    conn.client.patch(
        Pod, "a", {"metadata": {"labels": {"team": "y"}}}, namespace="default", patch_type=PatchType.MERGE
    )
    conn.client.patch(
        Pod, "a", {"metadata": {"labels": {"team": "x"}}}, namespace="default", patch_type=PatchType.MERGE
    )
    with httpx2.Client(base_url=api.url) as http:
        text = http.get(
            "/api/v1/pods",
            params={"watch": "1", "resourceVersion": str(rv), "timeoutSeconds": "1", "labelSelector": "team=x"},
        ).text
    assert [json.loads(x)["type"] for x in text.splitlines() if x] == ["DELETED", "ADDED"]


def test_finalizers_delay_deletion_and_owner_references_cascade(api: KubeApiServer, conn: Connection) -> None:
    owner = conn.client.create(make_pod("owner"))
    child = make_pod("child")
    child.metadata.ownerReferences = [
        {"apiVersion": "v1", "kind": "Pod", "name": "owner", "uid": owner.metadata.uid}  # type: ignore[list-item]
    ]
    child.metadata.finalizers = ["test/hold"]
    conn.client.create(child)
    conn.client.delete(Pod, "owner", namespace="default")
    held = conn.client.get(Pod, "child", namespace="default")
    assert held.metadata.deletionTimestamp is not None
    conn.client.patch(Pod, "child", {"metadata": {"finalizers": None}}, namespace="default", patch_type=PatchType.MERGE)
    assert conn.client.list(Pod, namespace="default").__iter__().__next__ if False else True
    assert [p.metadata.name for p in conn.client.list(Pod, namespace="default")] == []


def test_custom_resources_are_validated_against_the_crd_schema(conn: Connection) -> None:
    bad = GangJobResource(
        metadata=ObjectMeta(name="j", namespace="default"),
        spec={"replicas": 0, "template": {"spec": {"containers": [{"name": "c"}]}}, "priorityClassName": "gold"},
    )
    with pytest.raises(Rejected) as err, api_errors("create bad gangjob"):
        conn.client.create(bad)
    assert "replicas" in str(err.value) and "priorityClassName" in str(err.value)


def test_injected_faults_answer_before_serving(api: KubeApiServer, conn: Connection) -> None:
    fault = api.inject_fault("POST", r"/pods$", 503, times=2)
    for _ in range(2):
        with pytest.raises(Exception, match="503"), api_errors("create"):
            conn.client.create(make_pod("a"))
    conn.client.create(make_pod("a"))
    assert fault.hits == 2


label = st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True)


@given(st.dictionaries(label, label, max_size=4), st.dictionaries(label, label, max_size=4))
def test_equality_selector_built_from_labels_matches_exactly_those(want: dict, have: dict) -> None:
    selector = ",".join(f"{k}={v}" for k, v in want.items())
    assert parse_label_selector(selector)(have) == all(have.get(k) == v for k, v in want.items())


key = st.text(alphabet="abcxyz", max_size=3)  # "$..." keys are strategic-merge directives
json_value = st.recursive(
    st.none() | st.integers() | st.text(max_size=3),
    lambda inner: st.dictionaries(key, inner, max_size=3),
    max_leaves=8,
)


@given(
    st.dictionaries(key, json_value, max_size=4),
    st.dictionaries(key, json_value, max_size=4),
)
def test_merge_patches_are_idempotent_and_strategic_agrees_without_lists(doc: dict, patch: dict) -> None:
    once = merge_patch(doc, patch)
    assert merge_patch(once, patch) == once
    assert strategic_merge_patch(doc, patch) == once


def test_standalone_double_serves_a_kubeconfig_for_other_processes(tmp_path: Path) -> None:
    """``python -m spotgpu.testing.kubeapi`` as the node end-to-end harness starts it."""
    objects = tmp_path / "objects.yaml"
    objects.write_text(
        "apiVersion: scheduling.spotgpu.io/v1alpha1\nkind: Queue\nmetadata: {name: spot-queue}\nspec: {type: spot}\n"
    )
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "spotgpu.testing.kubeapi", "--kubeconfig", str(kubeconfig), "--load", str(objects)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        status = subprocess.run(
            [sys.executable, "-m", "spotgpu", "status", "--kubeconfig", str(kubeconfig), "-o", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert [q["name"] for q in json.loads(status.stdout)["queues"]] == ["spot-queue"]
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
