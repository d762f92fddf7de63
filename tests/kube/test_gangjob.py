"""The GangJob controller's pure decision (:func:`spotgpu.kube.gangjob.reconcile`), as a table of scenarios."""

from __future__ import annotations

import copy

import pytest

from spotgpu.core import keys
from spotgpu.core.ids import SPOT_GPU_RESOURCE
from spotgpu.kube.gangjob import CreateObject, DeleteObject, Plan, build_pod, reconcile, requeue_delay
from spotgpu.kube.resources import GangJobView, format_time

NOW = 1_800_000_000.0


def job(status: dict | None = None, **spec: object) -> dict:
    body = {
        "apiVersion": "scheduling.spotgpu.io/v1alpha1",
        "kind": "GangJob",
        "metadata": {"name": "train", "namespace": "ml", "uid": "u-1", "generation": 1},
        "spec": {
            "replicas": 2,
            "queue": "spot-queue",
            "priorityClassName": "spotmid",
            "gpus": 1,
            "retryLimit": 2,
            "requeueBackoffSeconds": 10,
            "template": {
                "metadata": {"labels": {"app": "t"}},
                "spec": {"containers": [{"name": "main", "image": "img"}]},
            },
            **spec,
        },
    }
    if status is not None:
        body["status"] = status
    return body


def member(
    attempt: int, index: int, phase: str = "Running", *, evicted: str | None = None, deleting: bool = False
) -> dict:
    pod = build_pod(job(), GangJobView.parse(job()), attempt, index)
    pod["status"] = {"phase": phase}
    if evicted:
        pod["status"]["conditions"] = [{"type": keys.DISRUPTION_CONDITION, "status": "True", "reason": evicted}]
    if deleting:
        pod["metadata"]["deletionTimestamp"] = format_time(NOW)
    return pod


def group(attempt: int) -> dict:
    return {
        "kind": "PodGroup",
        "metadata": {
            "name": f"train-{attempt}",
            "namespace": "ml",
            "labels": {keys.GANG_JOB: "train", keys.GANG_ATTEMPT: str(attempt)},
        },
    }


def created(plan: Plan) -> list[str]:
    return [c.obj["metadata"]["name"] for c in plan.creates]


def deleted(plan: Plan) -> list[str]:
    return [d.name for d in plan.deletes]


def test_a_new_job_creates_its_podgroup_and_pods() -> None:
    plan = reconcile(job(), [], [], now=NOW)
    assert created(plan) == ["train-0", "train-0-0", "train-0-1"]
    pg, pod0 = plan.creates[0].obj, plan.creates[1].obj
    assert pg["spec"] == {"queue": "spot-queue", "minMember": 2, "priorityClassName": "spotmid"}
    assert pod0["spec"]["schedulerName"] == keys.SCHEDULER_NAME
    assert pod0["spec"]["priorityClassName"] == "spotmid"
    assert pod0["spec"]["containers"][0]["resources"]["limits"] == {SPOT_GPU_RESOURCE: "1"}
    labels = pod0["metadata"]["labels"]
    assert labels[keys.POD_GROUP] == "train-0" and labels[keys.GANG_JOB] == "train" and labels["app"] == "t"
    assert pod0["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert plan.status == {
        "observedGeneration": 1,
        "attempt": 0,
        "podGroup": "train-0",
        "phase": "Pending",
        "running": 0,
    }


def test_running_when_min_available_run() -> None:
    status = {"phase": "Pending", "attempt": 0, "podGroup": "train-0"}
    plan = reconcile(job(status), [group(0)], [member(0, 0), member(0, 1)], now=NOW)
    assert plan.creates == [] and plan.deletes == []
    assert plan.status == {"observedGeneration": 1, "phase": "Running", "running": 2}


def test_an_unseen_member_in_flight_is_not_an_eviction() -> None:
    status = {"phase": "Pending", "attempt": 0, "podGroup": "train-0"}
    plan = reconcile(job(status), [group(0)], [member(0, 0)], now=NOW, expected=frozenset({"train-0-1"}))
    assert plan.evicted == () and plan.creates == []


@pytest.mark.parametrize(
    ("pods", "reason"),
    [
        pytest.param([member(0, 0, evicted="OwnerBack"), member(0, 1)], "OwnerBack", id="disruption-condition"),
        pytest.param([member(0, 0)], "deleted", id="member-vanished"),
    ],
)
def test_an_evicted_member_tears_down_the_gang_and_requeues_it(pods: list[dict], reason: str) -> None:
    status = {"phase": "Running", "attempt": 0, "podGroup": "train-0", "evictions": 0}
    plan = reconcile(job(status), [group(0)], pods, now=NOW)
    assert plan.eviction_reason == reason
    assert sorted(deleted(plan)) == sorted([p["metadata"]["name"] for p in pods] + ["train-0"])
    assert plan.creates == []
    assert plan.status is not None
    assert plan.status["phase"] == "Requeued" and plan.status["evictions"] == 1
    assert plan.status["nextAttemptTime"] == format_time(NOW + 10)
    assert plan.requeue_after == 10


def test_the_next_attempt_starts_after_the_backoff_once_the_old_members_are_gone() -> None:
    status = {
        "phase": "Requeued",
        "attempt": 0,
        "podGroup": "train-0",
        "evictions": 1,
        "nextAttemptTime": format_time(NOW + 10),
    }
    waiting = reconcile(job(status), [], [member(0, 0, deleting=True)], now=NOW + 20)
    assert waiting.creates == [] and waiting.requeue_after == 1.0
    early = reconcile(job(status), [], [], now=NOW + 5)
    assert early.creates == [] and early.requeue_after == pytest.approx(5)
    plan = reconcile(job(status), [], [], now=NOW + 10)
    assert created(plan) == ["train-1", "train-1-0", "train-1-1"]
    assert plan.status is not None
    assert (plan.status["attempt"], plan.status["retries"], plan.status["phase"]) == (1, 1, "Pending")


def test_backoff_doubles_per_eviction_and_is_capped() -> None:
    view = GangJobView.parse(job())
    assert [requeue_delay(view, e) for e in (1, 2, 3, 10)] == [10, 20, 40, 600]


def test_more_evictions_than_the_retry_limit_fail_the_job() -> None:
    status = {"phase": "Running", "attempt": 2, "podGroup": "train-2", "evictions": 2, "retries": 2}
    pods = [member(2, 0, evicted="ReservedPreempt"), member(2, 1)]
    plan = reconcile(job(status), [group(2)], pods, now=NOW)
    assert plan.status is not None
    assert plan.status["phase"] == "Failed" and plan.status["evictions"] == 3
    assert "retryLimit 2" in plan.status["message"]
    final = reconcile(job({**status, **plan.status}), [], [], now=NOW + 1000)
    assert final.creates == [] and final.requeue_after is None


def test_leftovers_of_earlier_attempts_are_deleted() -> None:
    status = {"phase": "Pending", "attempt": 1, "podGroup": "train-1"}
    plan = reconcile(job(status), [group(0), group(1)], [member(0, 0), member(1, 0), member(1, 1)], now=NOW)
    assert sorted(deleted(plan)) == ["train-0", "train-0-0"]


def test_a_failed_member_fails_the_job_and_success_of_all_succeeds_it() -> None:
    status = {"phase": "Running", "attempt": 0, "podGroup": "train-0"}
    failed = reconcile(job(status), [group(0)], [member(0, 0, "Failed"), member(0, 1)], now=NOW)
    assert failed.status is not None and failed.status["phase"] == "Failed"
    assert "train-0-1" in deleted(failed)
    done = reconcile(job(status), [group(0)], [member(0, 0, "Succeeded"), member(0, 1, "Succeeded")], now=NOW)
    assert done.status is not None and done.status["phase"] == "Succeeded"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param({"minAvailable": 3}, "exceeds spec.replicas", id="min-over-replicas"),
        pytest.param({"priorityClassName": "gold"}, "spot priority", id="bad-priority"),
        pytest.param({"template": {"spec": {}}}, "pod template", id="no-containers"),
    ],
)
def test_an_invalid_spec_fails_with_a_message_and_creates_nothing(spec: dict, message: str) -> None:
    plan = reconcile(job(**spec), [], [], now=NOW)
    assert plan.creates == []
    assert plan.status is not None and plan.status["phase"] == "Failed" and message in plan.status["message"]


def test_reconcile_is_idempotent_once_applied() -> None:
    first = reconcile(job(), [], [], now=NOW)
    status = copy.deepcopy(first.status)
    objs = [c.obj for c in first.creates]
    pods = [{**o, "status": {"phase": "Pending"}} for o in objs if o["kind"] == "Pod"]
    groups = [o for o in objs if o["kind"] == "PodGroup"]
    again = reconcile(job(status), groups, pods, now=NOW + 1)
    assert again.actions == ()
    assert all(isinstance(a, CreateObject | DeleteObject) for a in first.actions[:-1])


def test_min_lease_and_checkpoint_interval_go_onto_the_podgroup_and_the_pods() -> None:
    plan = reconcile(job(minLease="1h30m", checkpointInterval=600), [], [], now=NOW)
    (pg,) = [c.obj for c in plan.creates if c.kind == "PodGroup"]
    assert (pg["spec"]["minLease"], pg["spec"]["checkpointInterval"]) == ("5400s", "600s")
    for created_pod in (c.obj for c in plan.creates if c.kind == "Pod"):
        annotations = created_pod["metadata"]["annotations"]
        assert (annotations[keys.MIN_LEASE], annotations[keys.CHECKPOINT_INTERVAL]) == ("5400s", "600s")
    plain = reconcile(job(), [], [], now=NOW)
    (pg,) = [c.obj for c in plain.creates if c.kind == "PodGroup"]
    assert "minLease" not in pg["spec"] and "checkpointInterval" not in pg["spec"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param({"minLease": "soon"}, "spec.minLease: 'soon' is not a duration", id="min-lease-text"),
        pytest.param({"minLease": -1}, "spec.minLease: duration must be finite and not negative", id="negative"),
        pytest.param({"checkpointInterval": "5 minutes"}, "spec.checkpointInterval: '5 minutes'", id="checkpoint"),
    ],
)
def test_a_bad_lease_fails_the_job_naming_the_field(spec: dict, message: str) -> None:
    plan = reconcile(job(**spec), [], [], now=NOW)
    assert plan.creates == []
    assert plan.status is not None and plan.status["phase"] == "Failed" and message in plan.status["message"]


def test_the_crd_schema_takes_durations_and_refuses_text() -> None:
    from spotgpu.kube import crds
    from spotgpu.testing.kubeapi import ApiFailure, KubeApiServer

    with KubeApiServer(crd_schemas=crds.schemas()) as api:
        api.put(job(minLease="1h30m", checkpointInterval=600))
        with pytest.raises(ApiFailure, match=r"spec\.minLease"):
            api.put({**job(minLease="soon"), "metadata": {"name": "bad", "namespace": "ml"}})
        group_obj = {
            "apiVersion": "scheduling.spotgpu.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "g", "namespace": "ml"},
            "spec": {"queue": "q", "minMember": 1, "minLease": "2h", "checkpointInterval": "10m"},
        }
        api.put(group_obj)
        with pytest.raises(ApiFailure, match=r"spec\.checkpointInterval"):
            api.put(
                {
                    **group_obj,
                    "metadata": {"name": "h", "namespace": "ml"},
                    "spec": {**group_obj["spec"], "checkpointInterval": "ten"},
                }
            )
