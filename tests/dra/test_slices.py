"""ResourceSlice building and the pool sync plan (the Go helper's generation rules)."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from tests.dra.helpers import DRIVER, NODE, twins

from spotgpu.core.ids import DeviceID
from spotgpu.dra.slices import (
    NOT_LENDABLE_TAINT,
    OWNER_RETURNED_TAINT,
    NodeOwner,
    TwinDevice,
    TwinState,
    desired_slices,
    device_name,
    plan_pool,
    publication,
    taint_times,
)

OWNER = NodeOwner(NODE, "node-uid-1")
T0, T1 = "2026-12-02T06:00:00Z", "2026-12-02T06:05:00Z"


def apply(store: list[dict[str, Any]], plan: Any) -> list[dict[str, Any]]:
    """What an API server holds after the plan (names for generateName, resourceVersions)."""
    by_name = {o["metadata"]["name"]: o for o in store}
    for name, _, _ in plan.deletes:
        del by_name[name]
    for obj in plan.updates:
        by_name[obj["metadata"]["name"]] = copy.deepcopy(obj)
    for obj in plan.creates:
        new = copy.deepcopy(obj)
        new["metadata"]["name"] = obj["metadata"]["generateName"] + uuid.uuid4().hex[:5]
        new["metadata"]["uid"] = str(uuid.uuid4())
        by_name[new["metadata"]["name"]] = new
    return list(by_name.values())


def test_device_names_are_dns_labels_and_ids_that_do_not_fit_are_hashed() -> None:
    assert device_name("spot-GPU-8f1c2a3e-0000") == "spot-gpu-8f1c2a3e-0000"
    assert device_name("spot-GPU-x::3") == "spot-gpu-x-r3"
    hashed = device_name("spot-MIG-GPU-x/1/0")
    assert hashed.startswith("spot-h") and len(hashed) == 30


def test_colliding_names_are_all_left_out() -> None:
    pub = publication(twins({DeviceID("GPU-A"): TwinState.LENDABLE, DeviceID("gpu-a"): TwinState.LENDABLE}))
    assert pub.devices == ()
    assert {t for t, _ in pub.unpublishable} == {"spot-GPU-A", "spot-gpu-a"}


def test_attributes_capacity_and_taints() -> None:
    pub = publication(
        [
            TwinDevice(
                DeviceID("spot-GPU-0"),
                DeviceID("GPU-0"),
                TwinState.LENDABLE,
                model="H200",
                numa_node=1,
                memory_bytes=1024,
                idle_forecast_s=3600,
            ),
            TwinDevice(DeviceID("spot-GPU-1"), DeviceID("GPU-1"), TwinState.NOT_LENDABLE, shared=True),
            TwinDevice(DeviceID("spot-GPU-2"), DeviceID("GPU-2"), TwinState.RETURNING),
        ]
    )
    [devices] = desired_slices(pub, T0, {})
    lent, idle, back = devices
    assert lent["attributes"] == {
        "uuid": {"string": "GPU-0"},
        "twin": {"string": "spot-GPU-0"},
        "sharing": {"string": "exclusive"},
        "model": {"string": "H200"},
        "numaNode": {"int": 1},
        "idleForecastSeconds": {"int": 3600},
    }
    assert lent["capacity"] == {"memory": {"value": "1024"}} and "taints" not in lent
    assert idle["attributes"]["sharing"] == {"string": "shared"}
    assert [(t["key"], t["effect"]) for t in idle["taints"]] == [(NOT_LENDABLE_TAINT, "NoSchedule")]
    assert [(t["key"], t["effect"], t["timeAdded"]) for t in back["taints"]] == [
        (NOT_LENDABLE_TAINT, "NoSchedule", T0),
        (OWNER_RETURNED_TAINT, "NoExecute", T0),
    ]


def test_first_publish_then_in_place_update_keeps_generation_and_time_added() -> None:
    states = {DeviceID("GPU-0"): TwinState.NOT_LENDABLE, DeviceID("GPU-1"): TwinState.LENDABLE}
    plan = plan_pool([], desired_slices(publication(twins(states)), T0, {}), DRIVER, OWNER)
    assert plan.generation == 1 and len(plan.creates) == 1 and not plan.updates
    created = plan.creates[0]
    assert created["metadata"]["generateName"] == f"00000-{DRIVER}-{NODE}-"
    assert created["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-1", "controller": True}
    ]
    assert created["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    store = apply([], plan)
    again = plan_pool(store, desired_slices(publication(twins(states)), T1, taint_times(store)), DRIVER, OWNER)
    assert again.empty, "republishing the same state writes nothing (timeAdded kept)"
    states[DeviceID("GPU-1")] = TwinState.RETURNING
    changed = plan_pool(store, desired_slices(publication(twins(states)), T1, taint_times(store)), DRIVER, OWNER)
    assert changed.generation == 1 and len(changed.updates) == 1 and not changed.creates
    taints = {
        (d["name"], t["key"]): t["timeAdded"]
        for d in changed.updates[0]["spec"]["devices"]
        for t in d.get("taints", ())
    }
    assert taints == {
        ("spot-gpu-0", NOT_LENDABLE_TAINT): T0,
        ("spot-gpu-1", NOT_LENDABLE_TAINT): T1,
        ("spot-gpu-1", OWNER_RETURNED_TAINT): T1,
    }


def test_after_the_kubelet_wiped_the_slices_they_are_created_with_a_new_generation() -> None:
    states = {DeviceID("GPU-0"): TwinState.LENDABLE}
    plan = plan_pool([], desired_slices(publication(twins(states)), T0, {}), DRIVER, OWNER)
    assert plan.generation == 1
    # wiped: nothing stored; the generation restarts at 1, as the Go helper's does
    assert plan_pool([], desired_slices(publication(twins(states)), T1, {}), DRIVER, OWNER).creates


def test_foreign_and_stale_slices_are_deleted() -> None:
    store = apply(
        [],
        plan_pool(
            [], desired_slices(publication(twins({DeviceID("GPU-0"): TwinState.LENDABLE})), T0, {}), DRIVER, OWNER
        ),
    )
    stale = copy.deepcopy(store[0])
    stale["metadata"].update(name="oldname-x", uid="u-old")
    plan = plan_pool(
        [*store, stale],
        desired_slices(publication(twins({DeviceID("GPU-0"): TwinState.LENDABLE})), T0, taint_times(store)),
        DRIVER,
        OWNER,
    )
    assert [d[0] for d in plan.deletes] == ["oldname-x"] and not plan.creates


states_st = st.dictionaries(
    st.from_regex(r"GPU-[0-9a-f]{1,6}", fullmatch=True).map(DeviceID), st.sampled_from(list(TwinState)), max_size=150
)


@given(st.lists(states_st, min_size=1, max_size=4))
def test_any_sequence_of_states_converges_and_counts_match(sequence: list[dict[DeviceID, TwinState]]) -> None:
    store: list[dict[str, Any]] = []
    last_gen = 0
    for states in sequence:
        pub = publication(twins(states))
        plan = plan_pool(store, desired_slices(pub, T0, taint_times(store)), DRIVER, OWNER)
        assert plan.generation >= last_gen
        last_gen = plan.generation
        store = apply(store, plan)
        gens = {o["spec"]["pool"]["generation"] for o in store}
        counts = {o["spec"]["pool"]["resourceSliceCount"] for o in store}
        assert gens == {plan.generation} and counts == {len(store)}
        assert all(len(o["spec"]["devices"]) <= 64 for o in store)
        names = [d["name"] for o in store for d in o["spec"]["devices"]]
        assert sorted(names) == sorted(n for n, _ in pub.devices)
        assert plan_pool(store, desired_slices(pub, T1, taint_times(store)), DRIVER, OWNER).empty
