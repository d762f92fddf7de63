"""The Prepare decision: every claim check and the runtime's twin/owner/lend rules, attacked."""

from __future__ import annotations

import pytest
from tests.dra.helpers import GPU0, GPU2, NODE, OWNER, Node, claim

from spotgpu.core.refs import ContainerRef
from spotgpu.dra.claim import ClaimKey, ClaimUID
from spotgpu.dra.decide import ClaimRefusal, PrepareRefused, decide_prepare
from spotgpu.runtime.sync import RefusalReason

KEY = ClaimKey("spot", "spot-claim", ClaimUID("0f0e-uid-1"))


def refused(obj: object, node: Node | None = None, key: ClaimKey = KEY) -> PrepareRefused:
    with pytest.raises(PrepareRefused) as info:
        decide_prepare(key, obj, (node or Node()).view())  # type: ignore[arg-type]
    return info.value


def test_a_lent_gpu_is_granted_with_its_owner_as_source() -> None:
    grant = decide_prepare(KEY, claim(), Node().view())
    [device] = grant.devices
    assert (device.real, device.twin, device.device, device.pool, device.source) == (
        GPU0,
        "spot-GPU-0aa",
        "spot-gpu-0aa",
        NODE,
        OWNER,
    )


def test_an_unallocated_gpu_has_no_source() -> None:
    grant = decide_prepare(KEY, claim(["spot-gpu-2cc"]), Node().view())
    assert grant.devices[0].source is None


def test_a_gpu_that_is_not_lent_is_refused_by_the_lend_rule() -> None:
    assert refused(claim(["spot-gpu-1bb"])).reason is RefusalReason.NOT_LENT


def test_a_device_whose_owner_is_back_is_refused() -> None:
    node = Node()
    assert decide_prepare(KEY, claim(), node.view()).devices
    node.lent[GPU0] = False  # the owner came back: the twin is no longer lendable
    assert refused(claim(), node).reason is RefusalReason.NOT_LENT


def test_unknown_lending_state_fails_closed() -> None:
    node = Node()
    del node.lent[GPU0]
    assert refused(claim(), node).reason is RefusalReason.NOT_LENT


def test_another_nodes_device_is_refused() -> None:
    assert refused(claim(pool="node-b")).reason is ClaimRefusal.OTHER_POOL


def test_a_device_we_never_published_is_refused() -> None:
    assert refused(claim(["spot-gpu-9zz"])).reason is ClaimRefusal.UNKNOWN_DEVICE
    # the real GPU's own name is no twin either
    assert refused(claim(["gpu-0aa"])).reason is ClaimRefusal.UNKNOWN_DEVICE


def test_unknown_owner_is_refused_by_the_owner_rule() -> None:
    node = Node()
    node.owners.pop(GPU0)
    node.lent[GPU0] = True
    # the device stays published only while the agent knows it; here it is not: never published
    assert refused(claim(), node).reason is ClaimRefusal.UNKNOWN_DEVICE


def test_the_source_is_the_owner_recorded_at_prepare() -> None:
    node = Node()
    grant = decide_prepare(KEY, claim(["spot-gpu-2cc"]), node.view())
    assert grant.devices[0].source is None
    node.owners[GPU2] = ContainerRef("team", "other", "main")
    assert decide_prepare(KEY, claim(["spot-gpu-2cc"]), node.view()).devices[0].source == node.owners[GPU2]


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (None, ClaimRefusal.NOT_FOUND),
        ({"metadata": "x"}, ClaimRefusal.MALFORMED),
        (claim(uid="other-uid"), ClaimRefusal.REPLACED),
        (claim(name="other-claim"), ClaimRefusal.REPLACED),
        (claim(allocated=False), ClaimRefusal.NOT_ALLOCATED),
        (claim(reserved=False), ClaimRefusal.NOT_RESERVED),
        (claim(driver="gpu.nvidia.com"), ClaimRefusal.NO_DEVICES),
    ],
)
def test_claim_checks(obj: object, reason: ClaimRefusal) -> None:
    assert refused(obj).reason is reason


def test_admin_access_is_refused() -> None:
    obj = claim()
    obj["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    assert refused(obj).reason is ClaimRefusal.ADMIN_ACCESS


def test_a_reservation_for_a_non_pod_does_not_count() -> None:
    obj = claim()
    obj["status"]["reservedFor"] = [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "g", "uid": "u"}]
    assert refused(obj).reason is ClaimRefusal.NOT_RESERVED


def test_one_refused_device_refuses_the_whole_claim() -> None:
    assert refused(claim(["spot-gpu-0aa", "spot-gpu-1bb"])).reason is RefusalReason.NOT_LENT
