"""ResourceSlices published into the API double (validated against the 1.34-1.37 schemas)."""

from __future__ import annotations

from tests.dra.helpers import DRIVER, GPU0, GPU1, NODE
from tests.dra.rig import dra_rig

from spotgpu.dra.slices import NOT_LENDABLE_TAINT, OWNER_RETURNED_TAINT


def test_publish_republish_after_a_wipe_and_taint_on_return() -> None:
    with dra_rig() as rig:
        node_uid = rig.api.get("", "nodes", NODE)["metadata"]["uid"]  # type: ignore[index]
        publisher = rig.publisher()
        assert publisher.sync().creates
        [stored] = rig.api.objects("resource.k8s.io", "resourceslices")
        assert stored["metadata"]["ownerReferences"][0]["uid"] == node_uid
        assert stored["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
        devices = {d["name"]: d for d in stored["spec"]["devices"]}
        assert set(devices) == {"spot-gpu-0aa", "spot-gpu-1bb", "spot-gpu-2cc"}
        assert devices["spot-gpu-0aa"]["attributes"]["uuid"] == {"string": GPU0}
        assert devices["spot-gpu-0aa"]["capacity"]["memory"]["value"] == str(141 * 2**30)
        assert [t["key"] for t in devices["spot-gpu-1bb"]["taints"]] == [NOT_LENDABLE_TAINT]
        assert publisher.sync().empty, "nothing changed: nothing written"

        rig.node.lent[GPU1] = True
        rig.node.lent[GPU0] = False
        plan = publisher.sync()
        assert plan.generation == 1 and len(plan.updates) == 1, "one slice changes in place"
        [stored] = rig.api.objects("resource.k8s.io", "resourceslices")
        devices = {d["name"]: d for d in stored["spec"]["devices"]}
        assert "taints" not in devices["spot-gpu-1bb"]
        assert [t["key"] for t in devices["spot-gpu-0aa"]["taints"]] == [NOT_LENDABLE_TAINT]

        # the kubelet wipes the node's slices at its start: the next sync brings them back
        for obj in rig.api.objects("resource.k8s.io", "resourceslices"):
            rig.api.remove("resource.k8s.io", "resourceslices", obj["metadata"]["name"])
        assert publisher.sync().creates
        assert len(rig.api.objects("resource.k8s.io", "resourceslices")) == 1
        assert rig.api.objects("resource.k8s.io", "resourceslices")[0]["spec"]["driver"] == DRIVER


def test_a_returning_owner_gets_no_execute() -> None:
    from spotgpu.dra.slices import TwinState

    with dra_rig() as rig:
        publisher = rig.publisher()
        publisher.sync()
        rig.node.states = lambda: {GPU0: TwinState.RETURNING}  # type: ignore[method-assign]
        publisher.sync()
        [stored] = rig.api.objects("resource.k8s.io", "resourceslices")
        [device] = stored["spec"]["devices"]
        assert {(t["key"], t["effect"]) for t in device["taints"]} == {
            (NOT_LENDABLE_TAINT, "NoSchedule"),
            (OWNER_RETURNED_TAINT, "NoExecute"),
        }
