"""The kubelet plugin over real gRPC and unix sockets, driven by the kubelet DRA double, with
claims in the API double; the attacks of docs/dra.md's attack table."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.dra.helpers import DRIVER, GPU0, NODE, claim
from tests.dra.rig import Rig, dra_rig

from spotgpu.dra.plugin import SUPPORTED_VERSIONS, socket_paths
from spotgpu.testing.kubelet_dra import KubeletDraDouble


def cdi_id(uid: str) -> str:
    return f"k8s.{DRIVER}/claim={uid}-spot-gpu-0aa"


@pytest.fixture
def rig() -> Iterator[Rig]:
    with dra_rig() as r:
        r.start_plugin()
        yield r


def test_registration_advertises_and_serves_every_service(rig: Rig) -> None:
    assert rig.plugin is not None
    plugin = rig.kubelet.plugin(DRIVER)
    assert plugin.service == "v1.DRAPlugin" and plugin.health_service == "v1.DRAResourceHealth"
    assert plugin.endpoint == str(rig.plugin.service_socket) == str(rig.base / "plugins" / DRIVER / "dra.sock")
    assert rig.plugin.registration_socket == rig.base / "registry" / f"{DRIVER}-reg.sock"
    assert SUPPORTED_VERSIONS[:2] == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
    assert rig.plugin.wait_registered(5) is True


def test_a_v1beta1_kubelet_uses_the_v1beta1_service(rig: Rig) -> None:
    CLAIM = rig.put_claim(claim())
    UID = CLAIM[2]
    old = KubeletDraDouble(rig.base / "registry", known=("v1beta1.DRAPlugin",)).start()
    try:
        assert old.plugin(DRIVER).service == "v1beta1.DRAPlugin"
        assert old.prepare(DRIVER, [CLAIM])[UID].devices[0][3] == (cdi_id(UID),)
    finally:
        old.close()


def test_a_kubelet_that_knows_none_of_the_services_refuses_and_the_plugin_hears_it(rig: Rig) -> None:
    odd = KubeletDraDouble(rig.base / "registry", known=("v9.DRAPlugin",)).start()
    try:
        with pytest.raises(TimeoutError):
            odd.plugin(DRIVER, timeout=1)
        assert "none of services supported by the plugin" in odd.refusals[0][1]
        assert rig.plugin is not None
        deadline = time.monotonic() + 5
        while not rig.plugin.refusals and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "none of services supported" in rig.plugin.refusals[0]
    finally:
        odd.close()


def test_rolling_update_socket_names() -> None:
    reg, service = socket_paths(
        DRIVER, Path("/var/lib/kubelet/plugins_registry"), Path("/var/lib/kubelet/plugins"), "pod-1"
    )
    assert reg.name == f"{DRIVER}-pod-1-reg.sock" and service.name == "dra-pod-1.sock"
    long_uid = "f" * 60
    reg, _ = socket_paths(DRIVER, Path("/var/lib/kubelet/plugins_registry"), Path("/p"), long_uid)
    assert len(str(reg)) <= 107 and reg.name.endswith("-reg.sock") and long_uid not in reg.name


def spec_of(rig: Rig) -> dict[str, object]:
    [name] = rig.spec_files()
    return json.loads((rig.cdi_dir / name).read_text())  # type: ignore[no-any-return]


def test_prepare_answers_cdi_ids_and_writes_the_spec_then_unprepare_removes_it(rig: Rig) -> None:
    CLAIM = rig.put_claim(claim())
    UID = CLAIM[2]
    answer = rig.kubelet.prepare(DRIVER, [CLAIM])[UID]
    assert answer.error == ""
    assert answer.devices == ((("gpu",), NODE, "spot-gpu-0aa", (cdi_id(UID),)),)
    spec = spec_of(rig)
    assert spec["kind"] == f"k8s.{DRIVER}/claim" and spec["cdiVersion"] == "0.5.0"
    [device] = spec["devices"]  # type: ignore[misc]
    assert device["name"] == f"{UID}-spot-gpu-0aa"
    assert "NVIDIA_VISIBLE_DEVICES=GPU-0aa" in device["containerEdits"]["env"]
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": "/dev/null", "permissions": "rw"}
    ]
    assert rig.kubelet.unprepare(DRIVER, [CLAIM]) == {UID: ""}
    assert rig.spec_files() == []
    assert rig.kubelet.unprepare(DRIVER, [CLAIM]) == {UID: ""}, "unknown claims unprepare fine"


def test_prepare_is_idempotent(rig: Rig) -> None:
    CLAIM = rig.put_claim(claim())
    first = rig.kubelet.prepare(DRIVER, [CLAIM])
    [name] = rig.spec_files()
    mtime = (rig.cdi_dir / name).stat().st_mtime_ns
    assert rig.kubelet.prepare(DRIVER, [CLAIM, CLAIM]) == first
    assert (rig.cdi_dir / name).stat().st_mtime_ns == mtime, "an unchanged spec is not rewritten"


def test_every_claim_of_a_batch_is_answered(rig: Rig) -> None:
    CLAIM = rig.put_claim(claim())
    UID = CLAIM[2]
    other = rig.put_claim(claim(["spot-gpu-1bb"], name="not-lent"))
    answers = rig.kubelet.prepare(DRIVER, [CLAIM, other, ("spot", "missing", "uid-3")])
    assert answers[UID].error == ""
    assert "not-lent" in answers[other[2]].error
    assert "claim-not-found" in answers["uid-3"].error


def test_a_restarted_plugin_answers_the_same_from_its_checkpoint(rig: Rig) -> None:
    CLAIM = rig.put_claim(claim())
    UID = CLAIM[2]
    first = rig.kubelet.prepare(DRIVER, [CLAIM])
    rig.stop_plugin()
    assert rig.spec_files(), "stopping leaves prepared claims prepared"
    rig.start_plugin()
    rig.kubelet.plugin(DRIVER)
    assert rig.driver is not None and UID in rig.driver.prepared()
    assert rig.kubelet.prepare(DRIVER, [CLAIM]) == first
    rig.stop_plugin()
    rig.start_plugin()
    assert rig.kubelet.unprepare(DRIVER, [CLAIM]) == {UID: ""}
    assert rig.spec_files() == [], (
        "Unprepare after a restart removes what Prepare wrote (known only from the checkpoint)"
    )


def test_health_stream_reports_each_twin_and_changes(rig: Rig) -> None:
    health = rig.kubelet.wait_health(DRIVER, lambda h: len(h) == 3)
    assert {(d, s) for _, d, s, _ in health} == {("spot-gpu-0aa", 1), ("spot-gpu-1bb", 1), ("spot-gpu-2cc", 1)}
    rig.node.lent[GPU0] = False
    assert rig.plugin is not None
    rig.plugin.health_changed()
    rig.kubelet.wait_health(DRIVER, lambda h: ("spot-gpu-0aa", 1) in {(d, s) for _, d, s, _ in h})


def test_a_vendor_cdi_spec_is_used_instead_of_our_own(rig: Rig) -> None:
    vendor = rig.base / "vendor-cdi"
    vendor.mkdir()
    (vendor / "nvidia.json").write_text(
        json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "nvidia.com/gpu",
                "devices": [{"name": "GPU-0aa", "containerEdits": {"env": ["A=1"]}}],
            }
        )
    )
    CLAIM = rig.put_claim(claim())
    UID = CLAIM[2]
    answer = rig.kubelet.prepare(DRIVER, [CLAIM])[UID]
    assert answer.devices[0][3] == ("nvidia.com/gpu=GPU-0aa",)
    assert rig.spec_files() == [] and rig.allocations == 0


# ---------------------------------------------------------------------------- attacks


def test_attack_claim_for_a_gpu_that_is_not_lent(rig: Rig) -> None:
    CLAIM = rig.put_claim(claim(["spot-gpu-1bb"]))
    UID = CLAIM[2]
    assert "not-lent" in rig.kubelet.prepare(DRIVER, [CLAIM])[UID].error
    assert rig.spec_files() == [] and rig.allocations == 0


def test_attack_claim_for_another_nodes_device(rig: Rig) -> None:
    CLAIM = rig.put_claim(claim(pool="node-b"))
    UID = CLAIM[2]
    assert "other-pool" in rig.kubelet.prepare(DRIVER, [CLAIM])[UID].error
    assert rig.spec_files() == []


def test_attack_allocation_naming_a_device_we_never_published(rig: Rig) -> None:
    CLAIM = rig.put_claim(claim(["spot-gpu-ffff"]))
    UID = CLAIM[2]
    assert "unknown-device" in rig.kubelet.prepare(DRIVER, [CLAIM])[UID].error
    assert rig.spec_files() == []


def test_attack_claim_for_a_device_whose_owner_is_back(rig: Rig) -> None:
    CLAIM = rig.put_claim(claim())
    UID = CLAIM[2]
    assert rig.kubelet.prepare(DRIVER, [CLAIM])[UID].error == ""
    rig.node.lent[GPU0] = False  # the owner returned
    assert rig.driver is not None
    assert [k.uid for k in rig.driver.revoke({GPU0})] == [UID]
    assert rig.spec_files() == [], "the return path removes the spec at once"
    assert "not-lent" in rig.kubelet.prepare(DRIVER, [CLAIM])[UID].error
    assert rig.spec_files() == []
    assert rig.kubelet.unprepare(DRIVER, [CLAIM]) == {UID: ""}


def test_attack_claim_replayed_after_unprepare(rig: Rig) -> None:
    CLAIM = rig.put_claim(claim())
    UID = CLAIM[2]
    assert rig.kubelet.prepare(DRIVER, [CLAIM])[UID].error == ""
    assert rig.kubelet.unprepare(DRIVER, [CLAIM]) == {UID: ""}
    # the claim controller takes the pod out of reservedFor once it is gone
    rig.api.mutate("resource.k8s.io", "resourceclaims", "spot-claim", lambda o: o["status"].pop("reservedFor"), "spot")
    assert "not-reserved" in rig.kubelet.prepare(DRIVER, [CLAIM])[UID].error
    # the claim deleted and re-created under the same name: a new UID
    rig.api.remove("resource.k8s.io", "resourceclaims", "spot-claim", "spot")
    assert rig.put_claim(claim())[2] != UID
    assert "claim-replaced" in rig.kubelet.prepare(DRIVER, [CLAIM])[UID].error
    assert rig.spec_files() == []


def test_attack_claim_in_the_api_is_schema_checked(rig: Rig) -> None:
    from spotgpu.testing.kubeapi import ApiFailure

    bad = claim()
    bad["status"]["allocation"]["devices"]["results"][0]["bogus"] = 1
    with pytest.raises(ApiFailure):
        rig.put_claim(bad)
