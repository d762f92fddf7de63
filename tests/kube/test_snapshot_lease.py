"""The snapshot's idle forecasts (``spotgpu.io/idle-forecast``, hostile input) and minimum leases
(PodGroup spec, lone pods' annotations): pure translation, no server needed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core import keys
from spotgpu.core.ids import DeviceID
from spotgpu.kube.leases import MAX_FORECAST_ANNOTATION, parse_idle_forecast
from spotgpu.kube.snapshot import build_snapshot
from spotgpu.scheduler import run_cycle
from spotgpu.scheduler.model import MAX_FORECAST_S, IdleForecast

STATE = {
    "GPU-a": {"owner": "dev/alice/main", "health": "Healthy"},
    "GPU-b": {"owner": "dev/alice/main", "health": "Healthy"},
}
DEVICES = {DeviceID("GPU-a"): None, DeviceID("GPU-b"): None}


def queue(name: str, qtype: str = "spot") -> dict[str, Any]:
    return {"kind": "Queue", "metadata": {"name": name}, "spec": {"type": qtype}}


def group(name: str, q: str, members: int = 1, pc: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"queue": q, "minMember": members}
    if pc:
        spec["priorityClassName"] = pc
    return {"kind": "PodGroup", "metadata": {"name": name, "namespace": "ml"}, "spec": spec}


def pod(name: str, grp: str | None, limits: dict[str, str], *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    lab = dict(labels or {})
    if grp:
        lab[keys.POD_GROUP] = grp
    container = {"name": "work", "image": "x", "resources": {"limits": limits}}
    return {
        "metadata": {"name": name, "namespace": "ml", "labels": lab, "annotations": {}},
        "spec": {"schedulerName": "spotgpu", "containers": [container]},
    }


def lending_node(forecast: object | None = None, name: str = "n1") -> dict[str, Any]:
    annotations = {
        keys.NODE_SPOT_GPU_STATE: json.dumps(STATE),
        keys.NODE_LOWPOWER_SPOT: "true",
        keys.NODE_SPOT_PREFER: "lowpower",
    }
    if forecast is not None:
        annotations[keys.NODE_IDLE_FORECAST] = forecast if isinstance(forecast, str) else json.dumps(forecast)
    return {
        "metadata": {"name": name, "annotations": annotations},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def build(nodes: list[dict[str, Any]], **kw: Any) -> Any:
    kw.setdefault("queues", [queue("spot-queue"), queue("default", "reserved")])
    kw.setdefault("podgroups", [])
    kw.setdefault("pods", [])
    return build_snapshot(nodes=nodes, **kw)


def test_a_well_formed_forecast_reaches_the_node_model() -> None:
    out = build([lending_node({"spot-GPU-a": {"expected": 7200, "p20": 3600}})])
    (n,) = out.snapshot.nodes
    assert n.idle_forecast == {"GPU-a": IdleForecast(expected=7200, p20=3600)}
    assert out.forecasts_ignored == 0 and out.skipped == ()


HOSTILE = [
    pytest.param("not json", 1, id="not-json"),
    pytest.param("[1, 2]", 1, id="not-an-object"),
    pytest.param('{"spot-GPU-a": ' * 2000 + "1" + "}" * 2000, 1, id="deeply-nested"),
    pytest.param("x" * (MAX_FORECAST_ANNOTATION + 1), 1, id="too-long"),
    pytest.param({"GPU-a": {"expected": 1, "p20": 1}}, 1, id="real-id-not-twin"),
    pytest.param({"spot-GPU-zzz": {"expected": 1, "p20": 1}}, 1, id="unknown-twin"),
    pytest.param({"spot-": {"expected": 1, "p20": 1}}, 1, id="empty-twin"),
    pytest.param({"spot-GPU-a": {"expected": -5, "p20": 1}}, 1, id="negative"),
    pytest.param({"spot-GPU-a": {"expected": 10**30, "p20": 10**30}}, 1, id="huge"),
    pytest.param({"spot-GPU-a": {"expected": MAX_FORECAST_S + 1, "p20": 1}}, 1, id="beyond-max"),
    pytest.param({"spot-GPU-a": {"expected": 1.5, "p20": 1}}, 1, id="float"),
    pytest.param({"spot-GPU-a": {"expected": True, "p20": True}}, 1, id="bool"),
    pytest.param({"spot-GPU-a": {"expected": "3600", "p20": "3600"}}, 1, id="string"),
    pytest.param({"spot-GPU-a": {"p20": 5}}, 1, id="missing"),
    pytest.param({"spot-GPU-a": [3600, 3600]}, 1, id="list"),
    pytest.param({"spot-GPU-a": None, "spot-GPU-b": "x", "bogus": 1}, 3, id="several"),
]


@pytest.mark.parametrize(("value", "ignored"), HOSTILE)
def test_hostile_forecasts_are_ignored_counted_and_never_fatal(value: object, ignored: int) -> None:
    out = build([lending_node(value)])
    (n,) = out.snapshot.nodes  # the node itself is kept: only the forecast is left out
    assert n.idle_forecast == {}
    assert out.forecasts_ignored == ignored
    (skipped,) = [s for s in out.skipped if s.kind == "IdleForecast"]
    assert skipped.key == "n1" and f"{ignored} entries of {keys.NODE_IDLE_FORECAST} ignored" in skipped.reason


def test_a_bad_entry_leaves_the_good_ones() -> None:
    out = build([lending_node({"spot-GPU-a": {"expected": 60, "p20": 30}, "spot-GPU-b": {"expected": -1, "p20": 0}})])
    assert out.snapshot.nodes[0].idle_forecast == {"GPU-a": IdleForecast(60, 30)}
    assert out.forecasts_ignored == 1


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        max_leaves=20,
    )
)
def test_any_json_parses_without_raising(value: object) -> None:
    forecast, ignored = parse_idle_forecast("n1", json.dumps(value), DEVICES)
    for device, f in forecast.items():
        assert device in DEVICES and 0 <= f.p20 <= MAX_FORECAST_S and 0 <= f.expected <= MAX_FORECAST_S
    assert ignored.count >= 0


def _lease_gang(spec: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    g = group("long", "spot-queue", 1, "spotmid")
    g["spec"].update(spec or {})
    return g, pod("long-0", "long", {"platform/spot-gpu": "1"})


def test_garbage_never_makes_a_gpu_more_attractive_than_unknown() -> None:
    """A minLease job: a node whose forecast is garbage is as unusable as one without any."""
    g, p = _lease_gang({"minLease": "1h"})
    for value in (None, "not json", {"spot-GPU-a": {"expected": 10**30, "p20": 10**30}}):
        out = build([lending_node(value)], podgroups=[g], pods=[p])
        result = run_cycle(out.snapshot, now=1.0)
        assert result.binds == (), value
    good = build([lending_node({"spot-GPU-b": {"expected": 9000, "p20": 7200}})], podgroups=[g], pods=[p])
    (bind,) = run_cycle(good.snapshot, now=1.0).binds
    assert bind.devices == ("GPU-b",)


def test_a_podgroups_lease_reaches_the_model() -> None:
    g, p = _lease_gang({"minLease": "1h30m", "checkpointInterval": 600})
    out = build([lending_node()], podgroups=[g], pods=[p])
    (pg,) = out.snapshot.groups
    assert (pg.min_lease, pg.checkpoint_interval) == (5400.0, 600.0)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "spec.minLease: 'soon' is not a duration"),
        (-5, "spec.minLease: duration must be finite and not negative"),
        (1.5, "spec.minLease: 1.5 is not a duration"),
    ],
)
def test_a_bad_lease_names_the_field(value: object, message: str) -> None:
    g, p = _lease_gang({"minLease": value})
    out = build([lending_node()], podgroups=[g], pods=[p])
    assert out.snapshot.groups == ()
    (skipped,) = [s for s in out.skipped if s.kind == "PodGroup"]
    assert message in skipped.reason and "ml/long" in skipped.reason


def test_a_lone_pods_lease_comes_from_its_annotations() -> None:
    lone = pod("solo", None, {"platform/spot-gpu": "1"}, labels={keys.QUEUE: "spot-queue"})
    lone["metadata"]["annotations"] = {keys.MIN_LEASE: "2h", keys.CHECKPOINT_INTERVAL: "15m"}
    out = build([lending_node()], pods=[lone])
    (pg,) = out.snapshot.groups
    assert (pg.min_lease, pg.checkpoint_interval) == (7200.0, 900.0)
    lone["metadata"]["annotations"] = {keys.MIN_LEASE: "forever"}
    bad = build([lending_node()], pods=[lone])
    assert bad.snapshot.pods == ()
    assert any(f"annotation {keys.MIN_LEASE}: 'forever' is not a duration" in s.reason for s in bad.skipped)
