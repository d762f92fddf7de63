"""The GangJob controller is no confused deputy: a template's scheduler-only metadata, runtime-written
annotations, ``spec.nodeName`` and foreign ``schedulerName`` never reach a pod it creates.

:func:`spotgpu.kube.template_check.template_refusals` is the rule; the attack is played through the
controller's pure decision (:func:`spotgpu.kube.gangjob.reconcile`): whatever a template carries,
every pod the plan creates carries none of it, and a refused job creates nothing and says why.
The same attack through the real controller and the API double is in ``test_gangjob_controller.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core import keys
from spotgpu.kube.gangjob import TEMPLATE_ACCEPTED, TEMPLATE_REFUSED_REASON, reconcile
from spotgpu.kube.resources import GangJobView, TemplateRefused
from spotgpu.kube.template_check import template_refusals

NOW = 1_800_000_000.0

SCHEDULER_ONLY_ANNOTATIONS = (
    *keys.SCHEDULER_ANNOTATIONS,
    *keys.SCHEDULER_ANNOTATION_PREFIXES,
    *(f"{p}.worker" for p in keys.SCHEDULER_ANNOTATION_PREFIXES),
    *keys.RUNTIME_WRITTEN,
)
"""Every annotation a template may not carry (the prefixes bare and with a container suffix)."""
TENANT_ANNOTATIONS = (keys.GUARD, keys.MIN_LEASE, keys.SPOT_GPU_MILLI, keys.CONTAINER_ENV_PREFIX, "team.example.com/x")
TENANT_LABELS = ("app", keys.QUEUE, "team.example.com/tier")


def job(metadata: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": {"containers": [{"name": "main", "image": "img"}], **spec}}
    if metadata is not None:
        template["metadata"] = metadata
    return {
        "apiVersion": "scheduling.spotgpu.io/v1alpha1",
        "kind": "GangJob",
        "metadata": {"name": "train", "namespace": "ml", "uid": "u-1", "generation": 1},
        "spec": {"replicas": 2, "queue": "spot-queue", "gpus": 1, "template": template},
    }


def created_pods(plan_job: dict[str, Any]) -> list[dict[str, Any]]:
    return [c.obj for c in reconcile(plan_job, [], [], now=NOW).creates if c.kind == "Pod"]


def carried(pod: dict[str, Any]) -> set[str]:
    """What of the forbidden a pod carries."""
    meta = pod["metadata"]
    out = {k for k in meta.get("annotations") or {} if k in SCHEDULER_ONLY_ANNOTATIONS}
    out |= {k for k in meta.get("annotations") or {} if k.startswith(keys.SCHEDULER_ANNOTATION_PREFIXES)}
    out |= {f"label {k}" for k in meta.get("labels") or {} if k in keys.SCHEDULER_LABELS}
    if pod["spec"].get("nodeName"):
        out.add("spec.nodeName")
    if pod["spec"].get("schedulerName") != keys.SCHEDULER_NAME:
        out.add("spec.schedulerName")
    return out


@pytest.mark.parametrize("key", SCHEDULER_ONLY_ANNOTATIONS)
def test_a_template_with_a_scheduler_or_runtime_annotation_creates_no_pod(key: str) -> None:
    attack = job({"annotations": {key: '{"GPU-a":"team-b/dev/main"}', "team.example.com/x": "1"}})
    plan = reconcile(attack, [], [], now=NOW)
    assert plan.creates == []  # not even the PodGroup
    status = plan.status
    assert status is not None and status["phase"] == "Failed"
    assert key in status["message"] and key in plan.refused[0]
    (condition,) = status["conditions"]
    assert condition["type"] == TEMPLATE_ACCEPTED and condition["status"] == "False"
    assert condition["reason"] == TEMPLATE_REFUSED_REASON and key in condition["message"]


@pytest.mark.parametrize("key", keys.SCHEDULER_LABELS)
def test_a_template_with_a_scheduler_label_creates_no_pod(key: str) -> None:
    plan = reconcile(job({"labels": {key: "true", "app": "x"}}), [], [], now=NOW)
    assert plan.creates == [] and plan.status is not None and f"label {key}" in plan.status["message"]


@pytest.mark.parametrize(
    ("spec", "named"),
    [({"nodeName": "gpu-node-1"}, "spec.nodeName"), ({"schedulerName": "default-scheduler"}, "spec.schedulerName")],
)
def test_a_template_naming_a_node_or_another_scheduler_creates_no_pod(spec: dict[str, str], named: str) -> None:
    plan = reconcile(job(None, **spec), [], [], now=NOW)
    assert plan.creates == [] and plan.refused and plan.refused[0].startswith(named)


def test_the_refusal_is_reported_once_and_then_left_alone() -> None:
    attack = job({"annotations": {keys.DEVICE_OWNER: "{}"}}, nodeName="n1")
    first = reconcile(attack, [], [], now=NOW)
    assert first.status is not None and len(first.refused) == 2
    attack["status"] = first.status
    again = reconcile(attack, [], [], now=NOW + 60)
    assert again.actions == () and again.refused == ()  # no status write loop, counted once


def test_a_refusal_names_at_most_twenty_keys() -> None:
    many = {f"{keys.DEVICES_FROM_PREFIX}.c{i}": "{}" for i in range(500)}
    plan = reconcile(job({"annotations": many}), [], [], now=NOW)
    assert plan.status is not None and len(plan.refused) == 500
    assert plan.status["conditions"][0]["message"].endswith("; and 480 more")


def test_the_view_itself_refuses_so_no_pod_can_be_built() -> None:
    with pytest.raises(TemplateRefused) as exc:
        GangJobView.parse(job({"labels": {keys.SHADOW_POD_LABEL: "true"}}))
    assert exc.value.refusals == (f"label {keys.SHADOW_POD_LABEL}: only the spotgpu scheduler writes it",)


def test_what_a_tenant_may_write_passes_and_is_copied() -> None:
    metadata = {"annotations": dict.fromkeys(TENANT_ANNOTATIONS, "1"), "labels": dict.fromkeys(TENANT_LABELS, "x")}
    assert (
        template_refusals({"metadata": metadata, "spec": {"schedulerName": "spotgpu", "nodeSelector": {"a": "b"}}})
        == ()
    )
    (pod, _) = created_pods(job(metadata, nodeSelector={"zone": "a"}, nodeName=""))
    assert set(TENANT_ANNOTATIONS) <= set(pod["metadata"]["annotations"])
    assert pod["spec"]["nodeSelector"] == {"zone": "a"} and carried(pod) == set()


@pytest.mark.parametrize(
    "template",
    [
        {"metadata": ["annotations"]},
        {"metadata": {"annotations": {keys.DEVICE_OWNER: {"nested": "x"}}}},
        {"metadata": {"labels": "app=x"}},
        {"metadata": {"annotations": {1: "x"}}},
    ],
)
def test_metadata_the_rule_cannot_read_is_refused(template: dict[str, Any]) -> None:
    assert template_refusals(template)


# --- properties: the rule, and the attack through the controller's decision ---------------------------

_keys = st.one_of(
    st.sampled_from(SCHEDULER_ONLY_ANNOTATIONS + TENANT_ANNOTATIONS + keys.SCHEDULER_LABELS + TENANT_LABELS),
    st.builds(lambda p, s: p + s, st.sampled_from(keys.SCHEDULER_ANNOTATION_PREFIXES), st.text(max_size=8)),
    st.text(min_size=1, max_size=20),
)
_maps = st.dictionaries(_keys, st.text(max_size=5), max_size=6)
_specs = st.fixed_dictionaries(
    {},
    optional={
        "nodeName": st.sampled_from(["", "n1"]),
        "schedulerName": st.sampled_from(["", keys.SCHEDULER_NAME, "default-scheduler"]),
    },
)


def _forbidden(annotations: dict[str, str], labels: dict[str, str], spec: dict[str, str]) -> bool:
    return (
        any(k in keys.SCHEDULER_ANNOTATIONS or k.startswith(keys.SCHEDULER_ANNOTATION_PREFIXES) for k in annotations)
        or any(k in keys.RUNTIME_WRITTEN for k in annotations)
        or any(k in keys.SCHEDULER_LABELS for k in labels)
        or spec.get("nodeName", "") != ""
        or spec.get("schedulerName", "") not in ("", keys.SCHEDULER_NAME)
    )


@given(annotations=_maps, labels=_maps, spec=_specs)
def test_the_rule_refuses_exactly_what_admission_reserves(
    annotations: dict[str, str], labels: dict[str, str], spec: dict[str, str]
) -> None:
    refusals = template_refusals({"metadata": {"annotations": annotations, "labels": labels}, "spec": spec})
    assert bool(refusals) is _forbidden(annotations, labels, spec)
    for key in annotations:
        if key in keys.SCHEDULER_ANNOTATIONS or key in keys.RUNTIME_WRITTEN:
            assert any(r.startswith(f"annotation {key}:") for r in refusals)


@given(annotations=_maps, labels=_maps, spec=_specs)
def test_no_template_yields_a_pod_carrying_scheduler_metadata(
    annotations: dict[str, str], labels: dict[str, str], spec: dict[str, str]
) -> None:
    attack = job({"annotations": annotations, "labels": labels}, **spec)
    pods = created_pods(attack)
    for pod in pods:
        assert carried(pod) == set()
    assert (pods == []) is _forbidden(annotations, labels, spec)
