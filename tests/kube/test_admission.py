"""Every CEL expression of the chart's ValidatingAdmissionPolicies, evaluated by a real CEL
implementation against admission-request fixtures: allowed and denied cases for each rule.

No kube-apiserver can run here. The evaluator is ``cel-python`` (celpy, a pure-Python
implementation of the CEL spec), driven the way the API server drives a policy: the
``variables`` in order (each one's value visible to the later ones as ``variables.<name>``),
then the ``matchConditions``, then the ``validations``; ``object``, ``oldObject`` (``null`` on
CREATE) and ``request`` (``operation``, ``userInfo``) as the API server binds them. An evaluation
error counts as a denial (the policies' ``failurePolicy: Fail``).

The expressions keep to standard CEL that celpy and the API server evaluate alike: ``has()``,
``in`` on lists and maps, the ``all``/``exists`` macros (over a map: its keys), ``startsWith``,
``+`` on lists, ``==`` on maps and lists, ``?:`` and ``&&``/``||``. None of the Kubernetes extension
libraries (``strings``'s ``join``, ``lists``, ``sets``, ``optional`` syntax, ``authorizer``) is
used. Nor is ``oldObject != null``: the API server's CEL has heterogeneous equality (a map
compared with ``null`` is simply unequal), celpy does not (no such overload), so the policies ask
``request.operation == 'UPDATE'`` instead (``oldObject`` is set exactly then), which both evaluate
alike; ``&&`` absorbs the error of its right side when its left side is false, in both.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from gotemplate import render_chart

from spotgpu.core import keys
from spotgpu.core.shadow import SHADOW_LABEL_VALUE

CHART = Path(__file__).resolve().parents[2] / "deploy" / "chart" / "spotgpu"

SCHEDULER = "system:serviceaccount:spotgpu-system:spotgpu-scheduler"
AGENT = "system:serviceaccount:spotgpu-system:spotgpu-agent"
TENANT = "system:serviceaccount:team-a:default"
_ENV = celpy.Environment()


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]


def one(docs: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return found


def evaluate(expression: str, activation: Mapping[str, Any]) -> Any:
    """One CEL expression; a CEL evaluation error is returned, not raised (a denial)."""
    program = _ENV.program(_ENV.compile(expression))
    try:
        return program.evaluate(dict(activation))
    except celpy.CELEvalError as exc:
        return exc


def admit(policy: dict[str, Any], request: dict[str, Any]) -> list[str]:
    """The messages of the validations that deny ``request`` (empty: admitted)."""
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(request["object"]),
        "oldObject": celpy.json_to_cel(request.get("oldObject")),
        "request": celpy.json_to_cel(
            {"operation": request["operation"], "userInfo": request["userInfo"], "namespace": request.get("namespace")}
        ),
    }
    variables: dict[Any, Any] = {}
    activation["variables"] = celpy.celtypes.MapType(variables)
    for variable in policy["spec"].get("variables", []):
        variables[celpy.celtypes.StringType(variable["name"])] = evaluate(variable["expression"], activation)
        activation["variables"] = celpy.celtypes.MapType(variables)
    for condition in policy["spec"].get("matchConditions", []):
        result = evaluate(condition["expression"], activation)
        if isinstance(result, Exception):
            return [f"matchCondition {condition['name']}: {result}"]
        if result is not True and result != celpy.celtypes.BoolType(True):
            return []  # not matched: the policy does not apply
    denied = []
    for validation in policy["spec"]["validations"]:
        result = evaluate(validation["expression"], activation)
        if isinstance(result, Exception) or result != celpy.celtypes.BoolType(True):
            denied.append(str(validation.get("message", result)))
    return denied


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return documents(render_chart(CHART, {"agent": {"nodeRestriction": True}}))


@pytest.fixture(scope="module")
def metadata_policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "ValidatingAdmissionPolicy", "-scheduler-metadata")


@pytest.fixture(scope="module")
def spot_policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "ValidatingAdmissionPolicy", "-spot-pods-no-real-gpus")


def pod(
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    *limits: dict[str, str],
    init: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
) -> dict[str, Any]:
    containers = [{"name": f"c{i}", "image": "x", "resources": {"limits": dict(lim)}} for i, lim in enumerate(limits)]
    containers = containers or [{"name": "main", "image": "x"}]
    if requests is not None:
        containers[0].setdefault("resources", {})["requests"] = requests
    spec: dict[str, Any] = {"containers": containers}
    if init is not None:
        spec["initContainers"] = [{"name": "init", "image": "x", "resources": {"limits": init}}]
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    if labels is not None:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def create(obj: dict[str, Any], user: str = TENANT) -> dict[str, Any]:
    return {"operation": "CREATE", "object": obj, "oldObject": None, "userInfo": {"username": user}}


def update(old: dict[str, Any], new: dict[str, Any], user: str = TENANT) -> dict[str, Any]:
    return {"operation": "UPDATE", "object": new, "oldObject": old, "userInfo": {"username": user}}


# --- who may write what the scheduler writes -----------------------------------------------------

SCHEDULER_ANNOTATIONS = {
    keys.DEVICE_OWNER: '{"GPU-a":"team-b/dev/main"}',
    keys.POD_DEVICE_TYPE: "shadow",
    keys.ASSIGNED_DEVICES: '{"nvidia.com/gpu":["GPU-a"]}',
    keys.NOMINATED_DEVICES: '{"node":"n1","devices":["GPU-a"]}',
    keys.SHADOW_FOR: "team-a/g",
    keys.DEVICES_FROM_PREFIX: '{"direct":{"nvidia.com/gpu":["GPU-a"]}}',
    keys.DEVICES_FROM_PREFIX + ".worker": '{"team-b/dev/main":{"nvidia.com/gpu":[]}}',
}
SCHEDULER_LABELS = {keys.SHADOW_FOR: "g", keys.SHADOW_POD_LABEL: SHADOW_LABEL_VALUE}


def test_the_policy_names_every_key_the_scheduler_and_the_runtime_write(metadata_policy: dict[str, Any]) -> None:
    variables = {v["name"]: v["expression"] for v in metadata_policy["spec"]["variables"]}

    def strings(name: str) -> set[str]:
        return {str(x) for x in evaluate(variables[name], {})}

    assert strings("schedulerAnnotations") | strings("schedulerAnnotationPrefixes") == {
        k.partition(".worker")[0] for k in SCHEDULER_ANNOTATIONS
    }
    assert strings("schedulerLabels") == set(SCHEDULER_LABELS)
    assert strings("runtimeAnnotations") == set(keys.RUNTIME_WRITTEN)
    assert metadata_policy["spec"]["failurePolicy"] == "Fail"
    assert {"pods", "pods/binding"} <= set(metadata_policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"])


@pytest.mark.parametrize("key", sorted(SCHEDULER_ANNOTATIONS))
def test_a_tenant_may_not_set_a_scheduler_annotation(metadata_policy: dict[str, Any], key: str) -> None:
    annotations = {"team.example.com/note": "x", key: SCHEDULER_ANNOTATIONS[key]}
    assert admit(metadata_policy, create(pod(annotations)))  # denied
    assert admit(metadata_policy, create(pod(annotations), SCHEDULER)) == []
    old = pod({"team.example.com/note": "x"})
    assert admit(metadata_policy, update(old, pod(annotations)))  # added later
    assert admit(metadata_policy, update(pod(annotations), pod({**annotations, key: "changed"})))
    assert admit(metadata_policy, update(pod(annotations), old))  # removed
    assert admit(metadata_policy, update(pod(annotations), pod({**annotations, "team.example.com/note": "y"}))) == []


@pytest.mark.parametrize("key", sorted(SCHEDULER_LABELS))
def test_a_tenant_may_not_set_a_scheduler_label(metadata_policy: dict[str, Any], key: str) -> None:
    labels = {"app": "x", key: SCHEDULER_LABELS[key]}
    assert admit(metadata_policy, create(pod(None, labels)))
    assert admit(metadata_policy, create(pod(None, labels), SCHEDULER)) == []
    assert admit(metadata_policy, update(pod(None, {"app": "x"}), pod(None, labels)))
    assert admit(metadata_policy, update(pod(None, labels), pod(None, {**labels, "app": "y"}))) == []
    assert admit(metadata_policy, update(pod(None, labels), pod(None, {"app": "x"})))


def test_a_forged_shadow_pod_is_refused_and_the_schedulers_admitted(metadata_policy: dict[str, Any]) -> None:
    shadow = pod(
        {keys.POD_DEVICE_TYPE: "shadow", keys.ASSIGNED_DEVICES: '{"nvidia.com/gpu":["GPU-a"]}'}, SCHEDULER_LABELS
    )
    assert len(admit(metadata_policy, create(shadow))) == 2  # annotations and labels
    assert admit(metadata_policy, create(shadow, SCHEDULER)) == []
    assert admit(metadata_policy, create(pod(), AGENT)) == []  # pods without them: anyone


def test_a_binding_carries_scheduler_annotations_only_from_the_scheduler(metadata_policy: dict[str, Any]) -> None:
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p", "namespace": "team-a", "annotations": {keys.DEVICE_OWNER: "{}"}},
        "target": {"kind": "Node", "name": "n1"},
    }
    assert admit(metadata_policy, create(binding))
    assert admit(metadata_policy, create(binding, SCHEDULER)) == []
    plain = copy.deepcopy(binding)
    del plain["metadata"]["annotations"]
    assert admit(metadata_policy, create(plain)) == []


@pytest.mark.parametrize("key", sorted(keys.RUNTIME_WRITTEN))
def test_runtime_written_annotations_are_refused_on_pods_for_everyone(
    metadata_policy: dict[str, Any], key: str
) -> None:
    assert admit(metadata_policy, create(pod({key: "x"})))
    assert admit(metadata_policy, create(pod({key: "x"}), SCHEDULER))
    assert admit(metadata_policy, create(pod({"spotgpu.io/return-guard": "disabled"}))) == []  # a user's own key


# --- spot pods take no real GPUs ---------------------------------------------------------------------

SPOT = {"platform/spot-gpu": "1"}
SHARED = {"platform/spot-gpu-shared": "1"}
GPU = {"nvidia.com/gpu": "1"}


@pytest.mark.parametrize(
    ("request_", "denied"),
    [
        pytest.param(create(pod(None, None, SPOT)), False, id="spot"),
        pytest.param(create(pod(None, None, GPU)), False, id="reserved"),
        pytest.param(create(pod(None, None, {"cpu": "1"})), False, id="cpu"),
        pytest.param(create(pod()), False, id="no-resources"),
        pytest.param(create(pod(None, None, {**SPOT, **GPU})), True, id="spot-and-gpu"),
        pytest.param(create(pod(None, None, SPOT, GPU)), True, id="gpu-in-another-container"),
        pytest.param(create(pod(None, None, SHARED, GPU)), True, id="shared-spot-and-gpu"),
        pytest.param(create(pod(None, None, SPOT, init=GPU)), True, id="gpu-in-an-init-container"),
        pytest.param(create(pod(None, None, SPOT, requests=GPU)), True, id="gpu-in-requests"),
        pytest.param(update(pod(None, None, SPOT), pod(None, None, {**SPOT, **GPU})), True, id="resized"),
        pytest.param(create(pod(None, None, {**SPOT, **GPU}), SCHEDULER), True, id="nobody-may"),
    ],
)
def test_spot_pods_cannot_request_real_gpus(
    spot_policy: dict[str, Any], request_: dict[str, Any], denied: bool
) -> None:
    assert bool(admit(spot_policy, request_)) is denied


# --- the agent may change only its own node's annotations (agent.nodeRestriction) ---------------------


def node(name: str, annotations: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations, "labels": labels or {"zone": "a"}},
        "spec": {"podCIDR": "10.0.0.0/24"},
    }


def as_agent(node_name: str | None) -> dict[str, Any]:
    extra = {"authentication.kubernetes.io/node-name": [node_name]} if node_name else {}
    return {"username": AGENT, "extra": extra}


@pytest.mark.parametrize(
    ("user", "new", "denied"),
    [
        pytest.param(as_agent("n1"), node("n1", {"x": "2"}), False, id="own-node-annotations"),
        pytest.param(as_agent("n2"), node("n1", {"x": "2"}), True, id="another-node"),
        pytest.param(as_agent(None), node("n1", {"x": "2"}), True, id="token-without-node"),
        pytest.param(as_agent("n1"), node("n1", {"x": "1"}, {"zone": "b"}), True, id="labels"),
        pytest.param({"username": TENANT, "extra": {}}, node("n1", {"x": "2"}, {"zone": "b"}), False, id="not-agent"),
    ],
)
def test_the_agent_node_policy(
    docs: list[dict[str, Any]], user: dict[str, Any], new: dict[str, Any], denied: bool
) -> None:
    policy = one(docs, "ValidatingAdmissionPolicy", "-agent-own-node")
    request = {"operation": "UPDATE", "object": new, "oldObject": node("n1", {"x": "1"}), "userInfo": user}
    assert bool(admit(policy, request)) is denied
    spec_change = copy.deepcopy(new)
    spec_change["spec"]["unschedulable"] = True
    if user["username"] == AGENT and not denied:
        assert admit(policy, {**request, "object": spec_change})
