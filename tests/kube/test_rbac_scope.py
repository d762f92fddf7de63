"""What a stolen token of each component may do, and what it is refused.

Two layers decide, as on a cluster: RBAC (the chart's rendered roles and bindings, evaluated by
:mod:`rbaceval`) and the chart's ValidatingAdmissionPolicies keyed on the requesting service
account (real CEL, :func:`test_admission.admit`). Each refusal below is an attack a component's
token could make if the rule were missing: the scheduler creating a pod in kube-system or a
privileged pod beside the agents, the agent deleting a pod of another node or a GPU owner.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from gotemplate import TemplateError, render_chart
from rbaceval import Attributes, allowed, service_account
from test_admission import CHART, admit, one
from test_gangjob import job as gangjob

from spotgpu.core.ids import DeviceID, NodeName, ResourceName
from spotgpu.core.refs import PodRef
from spotgpu.kube.apply import ApplyConfig, shadow_pod_manifest
from spotgpu.kube.gangjob import build_pod
from spotgpu.kube.resources import GangJobView
from spotgpu.scheduler.decisions import CreateShadowPod

RELEASE = "spotgpu-system"
SCHEDULER = service_account(RELEASE, "spotgpu-scheduler")
AGENT = service_account(RELEASE, "spotgpu-agent")
HOLDER = service_account(RELEASE, "spotgpu-guard-holder")
TENANT = service_account("ml", "default")
A = Attributes


def documents(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for text in render_chart(CHART, values).values() for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return documents({"scheduler": {"gangjobNamespaces": ["ml", "research"]}})


# --- RBAC ------------------------------------------------------------------------------------

SCHEDULER_MAY = [
    A("create", "", "pods", RELEASE),  # ShadowPods
    A("create", "", "pods", "ml"),  # GangJob pods, in the listed namespaces
    A("create", "", "pods", "research"),
    A("create", "scheduling.spotgpu.io", "podgroups", "ml"),
    A("delete", "scheduling.spotgpu.io", "podgroups", "research", "job-0"),
    A("create", "", "pods/binding", "team-b", "p"),  # binds and preempts wherever spot pods run
    A("create", "", "pods/eviction", "team-b", "p"),
    A("delete", "", "pods", "team-b", "p"),
    A("watch", "", "pods"),
    A("update", "coordination.k8s.io", "leases", RELEASE, "spotgpu-scheduler"),
]
SCHEDULER_MAY_NOT = [
    A("create", "", "pods", "kube-system"),
    A("create", "", "pods", "team-b"),
    A("create", "", "pods"),
    A("create", "scheduling.spotgpu.io", "podgroups", "team-b"),
    A("create", "", "pods/exec", "ml", "p"),
    A("update", "", "pods", "ml", "p"),
    A("get", "", "secrets", RELEASE, "x"),
    A("list", "", "secrets"),
    A("get", "", "configmaps", RELEASE, "x"),
    A("create", "", "serviceaccounts/token", RELEASE, "spotgpu-agent"),
    A("patch", "", "nodes", None, "n1"),
    A("update", "coordination.k8s.io", "leases", RELEASE, "another-lease"),
    A("update", "coordination.k8s.io", "leases", "kube-system", "spotgpu-scheduler"),
    A("create", "rbac.authorization.k8s.io", "rolebindings", "ml"),
    A("delete", "scheduling.spotgpu.io", "gangjobs", "ml", "job"),
]
AGENT_MAY = [
    A("patch", "", "nodes", None, "n1"),
    A("list", "", "pods"),
    A("watch", "", "pods"),
    A("delete", "", "pods", "ml", "p"),  # narrowed to its node's spot pods by admission (below)
    A("patch", "", "pods/status", "ml", "p"),
    A("create", "", "events", "default"),
]
AGENT_MAY_NOT = [
    A("create", "", "pods", "ml"),
    A("create", "", "pods", RELEASE),
    A("get", "", "pods", "ml", "p"),
    A("update", "", "nodes", None, "n1"),
    A("delete", "", "nodes", None, "n1"),
    A("patch", "", "nodes/status", None, "n1"),
    A("create", "", "pods/eviction", "ml", "p"),
    A("create", "", "pods/exec", "ml", "p"),
    A("get", "", "secrets", RELEASE, "x"),
    A("create", "", "serviceaccounts/token", RELEASE, "spotgpu-scheduler"),
    A("update", "coordination.k8s.io", "leases", RELEASE, "spotgpu-scheduler"),
    A("patch", "scheduling.spotgpu.io", "gangjobs/status", "ml", "job"),
]


CASES = [
    *[pytest.param(SCHEDULER, r, True, id=f"scheduler-may-{r}") for r in SCHEDULER_MAY],
    *[pytest.param(SCHEDULER, r, False, id=f"scheduler-refused-{r}") for r in SCHEDULER_MAY_NOT],
    *[pytest.param(AGENT, r, True, id=f"agent-may-{r}") for r in AGENT_MAY],
    *[pytest.param(AGENT, r, False, id=f"agent-refused-{r}") for r in AGENT_MAY_NOT],
]


@pytest.mark.parametrize(("who", "req", "ok"), CASES)
def test_what_each_components_token_may_do(
    docs: list[dict[str, Any]], who: tuple[str, frozenset[str]], req: Attributes, ok: bool
) -> None:
    assert allowed(docs, *who, req) is ok


@pytest.mark.parametrize("who", [HOLDER, TENANT], ids=["guard-holder", "tenant"])
def test_the_holder_and_tenants_get_nothing_of_the_components(docs: list[dict[str, Any]], who: Any) -> None:
    for req in SCHEDULER_MAY + AGENT_MAY:
        assert not allowed(docs, *who, req), req


def test_without_gangjob_namespaces_the_scheduler_creates_only_shadowpods() -> None:
    plain = documents({})
    assert allowed(plain, *SCHEDULER, A("create", "", "pods", RELEASE))
    assert not allowed(plain, *SCHEDULER, A("create", "", "pods", "ml"))
    off = documents({"scheduler": {"gangjobController": False, "gangjobNamespaces": ["ml"]}})
    assert not allowed(off, *SCHEDULER, A("create", "", "pods", "ml"))


def test_the_release_namespace_is_no_gangjob_namespace() -> None:
    with pytest.raises(TemplateError, match="release namespace"):
        render_chart(CHART, {"scheduler": {"gangjobNamespaces": ["ml", RELEASE]}})


# --- admission: the agent evicts only its own node's spot pods --------------------------------


def spot_pod(node: str, resource: str = "platform/spot-gpu", namespace: str = "ml") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": namespace, "labels": {"app": "train"}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {resource: "1"}}}],
        },
    }


def as_agent(node: str | None) -> dict[str, Any]:
    return {"username": AGENT[0], "extra": {"authentication.kubernetes.io/node-name": [node]} if node else {}}


def delete(pod: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    ns = pod["metadata"]["namespace"]
    return {"operation": "DELETE", "object": None, "oldObject": pod, "userInfo": user, "namespace": ns}


def status_update(old: dict[str, Any], new: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    ns = old["metadata"]["namespace"]
    return {
        "operation": "UPDATE",
        "object": new,
        "oldObject": old,
        "userInfo": user,
        "namespace": ns,
        "subResource": "status",
    }


@pytest.fixture(scope="module")
def pods_policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "ValidatingAdmissionPolicy", "-agent-own-pods")


@pytest.mark.parametrize(
    ("pod", "user", "denied"),
    [
        pytest.param(spot_pod("n1"), as_agent("n1"), False, id="own-node-spot-pod"),
        pytest.param(spot_pod("n1", "platform/spot-gpu-shared"), as_agent("n1"), False, id="own-node-shared-spot"),
        pytest.param(spot_pod("n2"), as_agent("n1"), True, id="another-nodes-pod"),
        pytest.param(spot_pod("n1"), as_agent(None), True, id="token-without-node"),
        pytest.param(spot_pod("n1", "nvidia.com/gpu"), as_agent("n1"), True, id="gpu-owner"),
        pytest.param(spot_pod("n1", "cpu", "kube-system"), as_agent("n1"), True, id="control-plane-pod"),
        pytest.param(spot_pod("n2", "nvidia.com/gpu"), {"username": SCHEDULER[0]}, False, id="not-the-agent"),
    ],
)
def test_the_agent_deletes_only_spot_pods_of_its_node(
    pods_policy: dict[str, Any], pod: dict[str, Any], user: dict[str, Any], denied: bool
) -> None:
    assert bool(admit(pods_policy, delete(pod, user))) is denied


def test_an_unscheduled_pod_is_no_pod_of_the_agents_node(pods_policy: dict[str, Any]) -> None:
    pending = spot_pod("n1")
    del pending["spec"]["nodeName"]
    assert admit(pods_policy, delete(pending, as_agent("n1")))


def test_the_agent_sets_only_status_conditions_of_its_nodes_spot_pods(pods_policy: dict[str, Any]) -> None:
    old = spot_pod("n1")
    marked = copy.deepcopy(old)
    marked["status"] = {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "OwnerBack"}]}
    assert admit(pods_policy, status_update(old, marked, as_agent("n1"))) == []
    assert admit(pods_policy, status_update(old, marked, as_agent("n2")))
    relabelled = copy.deepcopy(marked)
    relabelled["metadata"]["labels"]["app"] = "other"
    assert admit(pods_policy, status_update(old, relabelled, as_agent("n1")))
    annotated = copy.deepcopy(marked)
    annotated["metadata"]["annotations"] = {"x": "y"}
    assert admit(pods_policy, status_update(old, annotated, as_agent("n1")))
    owner = spot_pod("n1", "nvidia.com/gpu")
    assert admit(pods_policy, status_update(owner, owner, as_agent("n1")))


def test_the_node_policies_are_on_by_default_and_can_be_turned_off() -> None:
    names = {d["metadata"]["name"] for d in documents({}) if d["kind"] == "ValidatingAdmissionPolicy"}
    assert {"spotgpu-agent-own-node", "spotgpu-agent-own-pods"} <= names
    off = documents({"agent": {"nodeRestriction": False}})
    assert not [d for d in off if d["metadata"]["name"].startswith("spotgpu-agent-own")]


# --- admission: what the scheduler creates ----------------------------------------------------


def create(pod: dict[str, Any], user: str = SCHEDULER[0]) -> dict[str, Any]:
    ns = pod["metadata"]["namespace"]
    return {"operation": "CREATE", "object": pod, "oldObject": None, "userInfo": {"username": user}, "namespace": ns}


@pytest.fixture(scope="module")
def creates_policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "ValidatingAdmissionPolicy", "-scheduler-creates")


def shadow_pod() -> dict[str, Any]:
    """A ShadowPod exactly as the scheduler's applier builds it."""
    decision = CreateShadowPod(
        pod=PodRef(RELEASE, "shadow-n1-abc"),
        node=NodeName("n1"),
        resource=ResourceName("nvidia.com/gpu"),
        devices=(DeviceID("GPU-a"),),
        group=PodRef("ml", "job-0"),
    )
    return shadow_pod_manifest(decision, ApplyConfig())


def gangjob_pod() -> dict[str, Any]:
    """A GangJob pod exactly as the GangJob controller builds it."""
    job = gangjob()
    return build_pod(job, GangJobView.parse(job), 0, 0)


def test_the_schedulers_own_shadowpods_and_gangjob_pods_are_admitted(creates_policy: dict[str, Any]) -> None:
    assert admit(creates_policy, create(shadow_pod())) == []
    assert admit(creates_policy, create(gangjob_pod())) == []


def _changed(pod: dict[str, Any], change: Any) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    change(out)
    return out


ATTACKS_IN_THE_RELEASE_NAMESPACE = {
    "privileged": lambda p: p["spec"]["containers"][0]["securityContext"].update(privileged=True),
    "other-image": lambda p: p["spec"]["containers"][0].update(image="attacker/tool"),
    "host-path": lambda p: p["spec"].update(volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
    "host-pid": lambda p: p["spec"].update(hostPID=True),
    "host-network": lambda p: p["spec"].update(hostNetwork=True),
    "token": lambda p: p["spec"].update(automountServiceAccountToken=True, serviceAccountName="spotgpu-agent"),
    "init-container": lambda p: p["spec"].update(initContainers=[{"name": "i", "image": "registry.k8s.io/pause:3.10"}]),
    "no-shadow-label": lambda p: p["metadata"]["labels"].pop("spotgpu.io/shadow-pod"),
    "second-container": lambda p: p["spec"]["containers"].append({"name": "x", "image": "attacker/tool"}),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS_IN_THE_RELEASE_NAMESPACE))
def test_the_scheduler_creates_nothing_but_shadowpods_in_the_release_namespace(
    creates_policy: dict[str, Any], attack: str
) -> None:
    forged = _changed(shadow_pod(), ATTACKS_IN_THE_RELEASE_NAMESPACE[attack])
    assert admit(creates_policy, create(forged))
    # a GangJob pod is no ShadowPod either
    assert admit(creates_policy, create(_changed(gangjob_pod(), lambda p: p["metadata"].update(namespace=RELEASE))))


ATTACKS_ELSEWHERE = {
    "no-owner": lambda p: p["metadata"].pop("ownerReferences"),
    "owned-by-a-deployment": lambda p: p["metadata"].update(
        ownerReferences=[{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "u", "controller": True}]
    ),
    "not-controller": lambda p: p["metadata"]["ownerReferences"][0].update(controller=False),
    "other-scheduler": lambda p: p["spec"].update(schedulerName="default-scheduler"),
    "pre-bound": lambda p: p["spec"].update(nodeName="n1"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS_ELSEWHERE))
def test_the_scheduler_creates_only_gangjob_pods_elsewhere(creates_policy: dict[str, Any], attack: str) -> None:
    assert admit(creates_policy, create(_changed(gangjob_pod(), ATTACKS_ELSEWHERE[attack])))


def test_others_creating_pods_are_not_this_policys_business(creates_policy: dict[str, Any]) -> None:
    tenant = _changed(gangjob_pod(), lambda p: p["metadata"].pop("ownerReferences"))
    assert admit(creates_policy, create(tenant, TENANT[0])) == []


@pytest.fixture(scope="module")
def own_pods_policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "ValidatingAdmissionPolicy", "-scheduler-own-pods")


def test_the_scheduler_deletes_and_changes_only_its_own_pods(own_pods_policy: dict[str, Any]) -> None:
    """Attack: a stolen scheduler token deleting the control plane's pods, or another scheduler's."""
    scheduler = {"username": SCHEDULER[0]}
    mine = gangjob_pod()
    theirs = _changed(mine, lambda p: p["spec"].update(schedulerName="default-scheduler"))
    control_plane = _changed(theirs, lambda p: p["metadata"].update(namespace="kube-system"))
    for pod, denied in ((mine, False), (shadow_pod(), False), (theirs, True), (control_plane, True)):
        assert bool(admit(own_pods_policy, delete(pod, scheduler))) is denied
        assert bool(admit(own_pods_policy, status_update(pod, pod, scheduler))) is denied
        patch = {**status_update(pod, pod, scheduler), "subResource": None}
        assert bool(admit(own_pods_policy, patch)) is denied
    assert admit(own_pods_policy, delete(control_plane, as_agent("n1"))) == []  # not the scheduler
