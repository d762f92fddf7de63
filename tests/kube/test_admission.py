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
from gotemplate import TemplateError, render_chart

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


def _selected(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A label selector (``matchLabels``, ``matchExpressions``) as the API server applies it."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def matches(policy: dict[str, Any], request: dict[str, Any]) -> bool:
    """Whether the policy's ``matchConstraints`` select ``request``: its resource (with the
    subresource, ``pods/status``), operation and, for a namespaced request, its namespace's labels
    (the API server sets ``kubernetes.io/metadata.name`` on every namespace)."""
    constraints = policy["spec"]["matchConstraints"]
    sub = request.get("subResource")
    resource = request.get("resource", "pods") + (f"/{sub}" if sub else "")
    if not any(
        request["operation"] in rule["operations"] and resource in rule["resources"]
        for rule in constraints["resourceRules"]
    ):
        return False
    namespace = request.get("namespace")
    labels = {"kubernetes.io/metadata.name": namespace} if namespace else {}
    return namespace is None or _selected(constraints.get("namespaceSelector"), labels)


def admit(policy: dict[str, Any], request: dict[str, Any]) -> list[str]:
    """The messages of the validations that deny ``request`` (empty: admitted, or not matched)."""
    if not matches(policy, request):
        return []
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


def _request(operation: str, obj: dict[str, Any], old: dict[str, Any] | None, user: str, sub: str | None) -> dict:
    namespace = obj.get("metadata", {}).get("namespace")
    return {
        "operation": operation,
        "object": obj,
        "oldObject": old,
        "userInfo": {"username": user},
        "namespace": str(namespace) if namespace else None,
        "subResource": sub,
    }


def create(obj: dict[str, Any], user: str = TENANT, sub: str | None = None) -> dict[str, Any]:
    return _request("CREATE", obj, None, user, sub)


def update(old: dict[str, Any], new: dict[str, Any], user: str = TENANT, sub: str | None = None) -> dict[str, Any]:
    return _request("UPDATE", new, old, user, sub)


def in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["namespace"] = namespace
    return out


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
    """One home: the chart's lists are the ones in spotgpu.core.keys (which the GangJob controller's
    template rule uses too), and the fixtures below cover every key."""
    variables = {v["name"]: v["expression"] for v in metadata_policy["spec"]["variables"]}

    def strings(name: str) -> list[str]:
        return [str(x) for x in evaluate(variables[name], {})]

    assert strings("schedulerAnnotations") == list(keys.SCHEDULER_ANNOTATIONS)
    assert strings("schedulerAnnotationPrefixes") == list(keys.SCHEDULER_ANNOTATION_PREFIXES)
    assert strings("schedulerLabels") == list(keys.SCHEDULER_LABELS)
    assert strings("runtimeAnnotations") == list(keys.RUNTIME_WRITTEN)
    assert {k.partition(".worker")[0] for k in SCHEDULER_ANNOTATIONS} == {
        *keys.SCHEDULER_ANNOTATIONS,
        *keys.SCHEDULER_ANNOTATION_PREFIXES,
    }
    assert set(SCHEDULER_LABELS) == set(keys.SCHEDULER_LABELS)
    assert metadata_policy["spec"]["failurePolicy"] == "Fail"


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
    assert admit(metadata_policy, create(binding, sub="binding"))
    assert admit(metadata_policy, create(binding, SCHEDULER, sub="binding")) == []
    plain = copy.deepcopy(binding)
    del plain["metadata"]["annotations"]
    assert admit(metadata_policy, create(plain, sub="binding")) == []


@pytest.mark.parametrize("key", sorted(keys.RUNTIME_WRITTEN))
def test_runtime_written_annotations_are_refused_on_pods_for_everyone(
    metadata_policy: dict[str, Any], key: str
) -> None:
    assert admit(metadata_policy, create(pod({key: "x"})))
    assert admit(metadata_policy, create(pod({key: "x"}), SCHEDULER))
    assert admit(metadata_policy, create(pod({"spotgpu.io/return-guard": "disabled"}))) == []  # a user's own key


def test_a_status_update_cannot_write_scheduler_metadata(metadata_policy: dict[str, Any]) -> None:
    """pods/status: the API server's status strategy resets the spec, not the labels and annotations,
    so whoever may update a pod's status (a tenant's controller granted pods/status) could forge
    them there; the policy matches the subresource."""
    plain = pod({"team.example.com/note": "x"})
    forged = pod({"team.example.com/note": "x", keys.DEVICE_OWNER: '{"GPU-a":"team-b/dev/main"}'})
    request = update(plain, forged, sub="status")
    assert matches(metadata_policy, request)
    assert admit(metadata_policy, request)
    assert admit(metadata_policy, update(pod(None, {"app": "x"}), pod(None, SCHEDULER_LABELS), sub="status"))
    assert admit(metadata_policy, update(plain, pod({keys.SYNCED_DEVICES: "{}"}), sub="status"))
    assert admit(metadata_policy, update(plain, forged, SCHEDULER, sub="status")) == []
    assert admit(metadata_policy, update(forged, forged, sub="status")) == []  # a kubelet's status write


def test_an_ephemeral_container_update_is_matched_for_the_metadata_it_carries(metadata_policy: dict[str, Any]) -> None:
    """pods/ephemeralcontainers: the API server resets labels and annotations there today; the
    policy matches it anyway, so an update that carried them would still be judged."""
    request = update(pod(), pod({keys.POD_DEVICE_TYPE: "shadow"}), sub="ephemeralcontainers")
    assert matches(metadata_policy, request) and admit(metadata_policy, request)


def test_a_key_a_pod_already_carried_does_not_stop_its_updates(metadata_policy: dict[str, Any]) -> None:
    """A pod that carried a runtime-written key before the policy existed (admission was off) keeps
    its status updates and finalizer removals; adding or changing one is refused."""
    old = pod({keys.GUARDED: "true"})
    assert (
        admit(metadata_policy, update(old, pod({keys.GUARDED: "true", "team.example.com/x": "1"}), sub="status")) == []
    )
    assert admit(metadata_policy, update(old, pod({keys.GUARDED: "false"})))
    assert admit(metadata_policy, update(pod(), pod({keys.GUARDED: "true"}), AGENT))


EXCLUDED = ("kube-system", "kube-public", "kube-node-lease")


@pytest.mark.parametrize("namespace", EXCLUDED)
def test_system_namespaces_are_not_matched(
    metadata_policy: dict[str, Any], spot_policy: dict[str, Any], namespace: str
) -> None:
    """failurePolicy Fail must not stop the control plane's pods (mirror pods, their status): the
    pod policies skip the system namespaces; tenants cannot create pods there."""
    mirror = in_namespace(pod({keys.DEVICE_OWNER: "{}"}), namespace)
    assert not matches(metadata_policy, create(mirror))
    assert admit(metadata_policy, update(mirror, mirror, "system:node:n1", sub="status")) == []
    assert admit(spot_policy, create(in_namespace(pod(None, None, {**SPOT, **GPU}), namespace))) == []


def test_the_release_namespace_and_tenant_namespaces_are_matched(
    metadata_policy: dict[str, Any], spot_policy: dict[str, Any]
) -> None:
    forged = in_namespace(pod({keys.POD_DEVICE_TYPE: "shadow"}, SCHEDULER_LABELS), "spotgpu-system")
    assert admit(metadata_policy, create(forged))  # a forged ShadowPod in the ShadowPod namespace
    assert admit(spot_policy, create(in_namespace(pod(None, None, {**SPOT, **GPU}), "team-b")))
    for policy in (metadata_policy, spot_policy):
        selector = policy["spec"]["matchConstraints"]["namespaceSelector"]
        assert selector["matchExpressions"] == [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(EXCLUDED)}
        ]


def test_the_excluded_namespaces_are_configurable_but_never_the_release_namespace() -> None:
    def policies(excluded: list[str]) -> list[dict[str, Any]]:
        rendered = documents(render_chart(CHART, {"admission": {"excludedNamespaces": excluded}}))
        suffixes = ("-scheduler-metadata", "-spot-pods-no-real-gpus")  # the tenant-facing pod policies
        return [
            d for d in rendered if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith(suffixes)
        ]

    for policy in policies([]):
        assert "namespaceSelector" not in policy["spec"]["matchConstraints"]
        assert matches(policy, create(in_namespace(pod(), "kube-system")))
    (metadata, spot) = policies(["kube-system", "infra"])
    assert not matches(metadata, create(in_namespace(pod(), "infra")))
    assert matches(spot, create(in_namespace(pod(), "kube-public")))
    with pytest.raises(TemplateError, match="release namespace"):
        render_chart(CHART, {"admission": {"excludedNamespaces": ["infra", "spotgpu-system"]}})


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
        pytest.param(
            update(pod(None, None, SPOT), pod(None, None, {**SPOT, **GPU}), sub="resize"), True, id="pods-resize"
        ),
        pytest.param(update(pod(None, None, GPU), pod(None, None, {**GPU, **SPOT})), True, id="owner-made-spot"),
        pytest.param(
            update(pod(None, None, {**SPOT, **GPU}), pod({"x": "1"}, None, {**SPOT, **GPU})), False, id="was-already"
        ),
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
    old = node("n1", {"x": "1"})
    request = {"operation": "UPDATE", "resource": "nodes", "object": new, "oldObject": old, "userInfo": user}
    assert bool(admit(policy, request)) is denied
    spec_change = copy.deepcopy(new)
    spec_change["spec"]["unschedulable"] = True
    if user["username"] == AGENT and not denied:
        assert admit(policy, {**request, "object": spec_change})


def test_only_spotgpus_own_pods_may_tolerate_a_missing_nri_plugin(metadata_policy: dict[str, Any]) -> None:
    """Attack: a tenant's pod carrying containerd's NRI toleration annotation would be created
    unchecked (device selectors untouched, no guard rule) whenever the agent is down."""
    for key in (keys.NRI_TOLERATE_MISSING_PLUGIN, f"{keys.NRI_TOLERATE_MISSING_PLUGIN}/container.main"):
        tenant = in_namespace(pod({key: "true"}), "team-b")
        assert admit(metadata_policy, create(tenant))
        assert admit(metadata_policy, create(tenant, SCHEDULER))
        assert admit(metadata_policy, update(in_namespace(pod(), "team-b"), tenant))
    own = in_namespace(pod({keys.NRI_TOLERATE_MISSING_PLUGIN: "true"}), "spotgpu-system")
    assert admit(metadata_policy, create(own)) == []  # the agent and holder DaemonSets' pods


def test_in_nri_mode_the_agent_and_holder_pods_tolerate_a_missing_nri_plugin() -> None:
    nri = documents(render_chart(CHART, {"agent": {"runtime": {"mode": "nri"}}}))
    wrapper = documents(render_chart(CHART, {}))
    for name in ("-agent", "-guard-holder"):
        annotations = one(nri, "DaemonSet", name)["spec"]["template"]["metadata"]["annotations"]
        assert annotations[keys.NRI_TOLERATE_MISSING_PLUGIN] == "true"
        plain = one(wrapper, "DaemonSet", name)["spec"]["template"]["metadata"]["annotations"]
        assert keys.NRI_TOLERATE_MISSING_PLUGIN not in plain
