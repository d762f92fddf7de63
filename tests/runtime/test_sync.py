"""Device-sync resolution and the security rule: what is granted, and every reason to refuse.

Table-driven over the standard scenario of :func:`fakes.standard_lookup` (owner dev-box/main
holds GPU-a and GPU-b; a ShadowPod in spotgpu-system holds GPU-c; GPU-d is unallocated; the
spot container spot-job/worker holds the twins of GPU-a, GPU-c and GPU-d).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from spotgpu.agent.model import build_mapping, twin_ids
from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.codec import parse_devices_from
from spotgpu.core.ids import DeviceID, shared_resource_of
from spotgpu.core.mapping_cache import IDLE_SPACE
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.ports.node import GpuDevice
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.providers import default_providers
from spotgpu.runtime.sync import (
    RefusalReason,
    ResolvedDevice,
    SyncPlan,
    SyncPolicy,
    SyncRefused,
    authorize,
    plan_sync,
)

from .fakes import (
    GPU,
    MODE,
    NS,
    OWNER,
    SHADOW,
    SPOT,
    SPOT_CTR,
    SYSTEM_NS,
    FakeLookup,
    devices_from,
    engine,
    pod,
    spot_spec,
    standard_lookup,
)

POLICY = SyncPolicy(SPOT, frozenset({GPU}), frozenset({SYSTEM_NS}))


pytestmark = pytest.mark.usefixtures("runtime_mode")  # every decision also as NRI mode makes it


def plan(
    sources: Mapping[str, Mapping[str, Sequence[str]]], lookup: FakeLookup | None = None, **policy: object
) -> SyncPlan:
    """The decision for SPOT_CTR: :func:`plan_sync` itself, or (NRI mode) the whole NRI path
    through the chain, whose Devices modifier calls it."""
    if MODE.value == "nri":
        overrides = {k: tuple(v) for k, v in policy.items()}  # type: ignore[call-overload]
        _, ctx = engine(lookup or standard_lookup(), **overrides).modify(spot_spec(sources))
        assert ctx.sync is not None
        return ctx.sync.plan
    request = parse_devices_from(devices_from(sources))
    effective = dataclasses.replace(POLICY, **policy)  # type: ignore[arg-type]
    return plan_sync(request, SPOT_CTR, lookup or standard_lookup(), effective, default_providers())


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        pytest.param({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}, [("GPU-a", OWNER)], id="container-sync"),
        pytest.param(
            {f"{NS}/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}, [("GPU-a", OWNER)], id="explicit-namespace"
        ),
        pytest.param({"_/dev-box": {"nvidia.com/gpu": ["GPU-a"]}}, [("GPU-a", OWNER)], id="pod-sync"),
        pytest.param({f"{SYSTEM_NS}/shadow-1/hold": {"nvidia.com/gpu": []}}, [("GPU-c", SHADOW)], id="shadow-all"),
        pytest.param({"direct": {"nvidia.com/gpu": ["GPU-d"]}}, [("GPU-d", None)], id="direct-idle"),
        pytest.param(
            {"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}, f"{SYSTEM_NS}/shadow-1": {"nvidia.com/gpu": ["GPU-c"]}},
            [("GPU-c", SHADOW), ("GPU-a", OWNER)],  # in the canonical order of the resolved source keys
            id="two-sources-merged",
        ),
    ],
)
def test_granted_syncs(
    sources: dict[str, dict[str, list[str]]], expected: list[tuple[str, ContainerRef | None]]
) -> None:
    result = plan(sources)
    assert [(d.device, d.source) for d in result.devices] == expected
    assert all(d.resource == GPU for d in result.devices)


def test_numa_of_the_source_is_kept() -> None:
    (device,) = plan({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}).devices
    assert device.numa_nodes == (0,)


def test_empty_list_takes_every_device_of_the_source_and_needs_every_twin() -> None:
    """dev-box holds GPU-a and GPU-b; only spot-GPU-a is allocated, so 'all' is refused."""
    with pytest.raises(SyncRefused) as info:
        plan({"_/dev-box/main": {"nvidia.com/gpu": []}})
    assert info.value.reason is RefusalReason.TWIN_NOT_ALLOCATED
    assert "spot-GPU-b" in str(info.value)


def test_shared_replica_twins_grant_the_base_device() -> None:
    lookup = standard_lookup()
    lookup.pods[2] = pod(SPOT_CTR, (SPOT, ["spot-GPU-a::3"]))
    assert [d.device for d in plan({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}, lookup).devices] == ["GPU-a"]


def test_replicas_of_the_shared_spot_resource_grant_the_base_device() -> None:
    """Shared spot pods hold replicas of ``platform/spot-gpu-shared`` (the agent's sharedReplicas)."""
    lookup = standard_lookup()
    lookup.pods[2] = pod(SPOT_CTR, (shared_resource_of(SPOT), ["spot-GPU-a::1"]))
    assert [d.device for d in plan({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}, lookup).devices] == ["GPU-a"]


def test_spot_like_ids_of_another_resource_grant_nothing() -> None:
    lookup = standard_lookup()
    lookup.pods[2] = pod(SPOT_CTR, ("example.com/spot-gpu-shared", ["spot-GPU-a::1"]))
    with pytest.raises(SyncRefused) as info:
        plan({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}, lookup)
    assert info.value.reason is RefusalReason.TWIN_NOT_ALLOCATED


REFUSALS = [
    pytest.param(
        {"_/dev-box/main": {"nvidia.com/gpu": ["GPU-b"]}}, RefusalReason.TWIN_NOT_ALLOCATED, "spot-GPU-b", id="no-twin"
    ),
    pytest.param(
        {"_/no-such-pod/main": {"nvidia.com/gpu": []}}, RefusalReason.SOURCE_NOT_FOUND, "not an active pod", id="no-pod"
    ),
    pytest.param(
        {"_/dev-box/other": {"nvidia.com/gpu": []}}, RefusalReason.SOURCE_NOT_FOUND, "no such container", id="no-ctr"
    ),
    pytest.param(
        {"_/no-such-pod": {"nvidia.com/gpu": []}}, RefusalReason.SOURCE_NOT_FOUND, "not an active pod", id="no-pod-sync"
    ),
    pytest.param(
        {"_/dev-box/main": {"nvidia.com/gpu": ["GPU-c"]}}, RefusalReason.SOURCE_LACKS_DEVICE, "GPU-c", id="not-held"
    ),
    pytest.param(
        {"_/spot-job/worker": {"nvidia.com/gpu": []}}, RefusalReason.SOURCE_LACKS_DEVICE, "holds no", id="holds-none"
    ),
    pytest.param(
        {"other-ns/dev-box/main": {"nvidia.com/gpu": []}}, RefusalReason.CROSS_NAMESPACE, "other-ns", id="cross-ns"
    ),
    pytest.param(
        {"_/dev-box/main": {"platform/spot-gpu": []}}, RefusalReason.RESOURCE_NOT_SYNCABLE, "spot-gpu", id="spot-res"
    ),
    pytest.param(
        {"_/dev-box/main": {"platform/spot-gpu-shared": []}},
        RefusalReason.RESOURCE_NOT_SYNCABLE,
        "spot-gpu-shared",
        id="shared-spot-res",
    ),
    pytest.param({"_/dev-box/main": {"rdma.io/hca": []}}, RefusalReason.RESOURCE_NOT_SYNCABLE, "rdma", id="other-res"),
    pytest.param(
        {"direct": {"nvidia.com/gpu": ["GPU-a"]}}, RefusalReason.OWNER_MISMATCH, "direct sync", id="direct-owned"
    ),
    pytest.param(
        {"_/dev-box/main": {"nvidia.com/gpu": []}, "direct": {"nvidia.com/gpu": ["GPU-a"]}},
        RefusalReason.CONFLICT,
        "two sources",
        id="conflict",
    ),
]


@pytest.mark.parametrize(("sources", "reason", "text"), REFUSALS)
def test_refusals(sources: dict[str, dict[str, list[str]]], reason: RefusalReason, text: str) -> None:
    with pytest.raises(SyncRefused) as info:
        plan(sources)
    assert info.value.reason is reason
    assert text in str(info.value)


def test_owner_record_must_name_the_source() -> None:
    """The kubelet says dev-box holds GPU-a, but the agent records another owner: refused."""
    lookup = standard_lookup()
    lookup.owners["GPU-a"] = ContainerRef(NS, "someone-else", "main")
    with pytest.raises(SyncRefused) as info:
        plan({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}, lookup)
    assert info.value.reason is RefusalReason.OWNER_MISMATCH
    assert "team-a/someone-else/main" in str(info.value)


def test_unknown_owner_is_refused() -> None:
    lookup = standard_lookup()
    del lookup.owners["GPU-a"]
    with pytest.raises(SyncRefused, match="no owner") as info:
        plan({"_/dev-box": {"nvidia.com/gpu": ["GPU-a"]}}, lookup)
    assert info.value.reason is RefusalReason.OWNER_MISMATCH


def test_direct_needs_the_device_to_be_recorded_unallocated() -> None:
    lookup = standard_lookup()
    lookup.owners.pop("GPU-d")
    with pytest.raises(SyncRefused, match="unknown"):
        plan({"direct": {"nvidia.com/gpu": ["GPU-d"]}}, lookup)
    lookup.owners["GPU-d"] = IDLE_SPACE
    assert [d.device for d in plan({"direct": {"nvidia.com/gpu": ["GPU-d"]}}, lookup).devices] == ["GPU-d"]


def test_cross_namespace_sources_need_the_allow_list() -> None:
    with pytest.raises(SyncRefused) as info:
        plan({f"{SYSTEM_NS}/shadow-1/hold": {"nvidia.com/gpu": ["GPU-c"]}}, cross_namespace_sources=frozenset())
    assert info.value.reason is RefusalReason.CROSS_NAMESPACE


def test_any_namespace_by_default_still_needs_twin_and_owner() -> None:
    """The default ``"*"`` lifts only the namespace check: the twin and owner rules still hold."""
    assert RuntimeConfig().cross_namespace_sources == ("*",)
    anywhere = frozenset({"*"})
    granted = plan({f"{SYSTEM_NS}/shadow-1/hold": {"nvidia.com/gpu": ["GPU-c"]}}, cross_namespace_sources=anywhere)
    assert [d.device for d in granted.devices] == ["GPU-c"]
    lookup = standard_lookup()
    lookup.owners["GPU-c"] = OWNER  # the agent records another owner for GPU-c
    with pytest.raises(SyncRefused) as info:
        plan({f"{SYSTEM_NS}/shadow-1/hold": {"nvidia.com/gpu": ["GPU-c"]}}, lookup, cross_namespace_sources=anywhere)
    assert info.value.reason is RefusalReason.OWNER_MISMATCH


def test_twins_of_another_container_do_not_count() -> None:
    """The twin was allocated to a sibling container of the spot pod, not to this one."""
    lookup = standard_lookup()
    lookup.pods[2] = pod(
        SPOT_CTR, (SPOT, []), others=[pod(ContainerRef(NS, "spot-job", "side"), (SPOT, ["spot-GPU-a"])).containers[0]]
    )
    with pytest.raises(SyncRefused) as info:
        plan({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}, lookup)
    assert info.value.reason is RefusalReason.TWIN_NOT_ALLOCATED


@pytest.mark.parametrize(("lendable", "granted"), [(True, True), (None, False), (False, False)])
def test_lend_rule_a_device_whose_owner_is_back_is_never_synced(lendable: bool | None, granted: bool) -> None:
    """The kubelet granted the twin while the owner was away; once the agent says the GPU is no
    longer lent (owner active or being evicted), the grant is refused. Unknown (the agent cannot
    say) is refused too: the lend rule fails closed."""
    lookup = standard_lookup()
    if lendable is None:
        del lookup.lendable["GPU-a"]
    else:
        lookup.lendable["GPU-a"] = lendable
    if granted:
        assert [d.device for d in plan({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}, lookup).devices] == ["GPU-a"]
        return
    with pytest.raises(SyncRefused, match=r"not lent out now|cannot say") as info:
        plan({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}, lookup)
    assert info.value.reason is RefusalReason.NOT_LENT


# --- the agent and the runtime read twin IDs alike (issue 12, item 2) ------------------------------

_REALS = st.frozensets(
    st.sampled_from(["GPU-a", "GPU-a::0", "GPU-a::1", "GPU-a::1::0", "GPU-b", "GPU-b::1"]), min_size=1
)


@given(_REALS, st.integers(min_value=1, max_value=3), st.data())
def test_the_runtime_grants_exactly_the_gpu_the_agent_records_the_twin_on(
    reals: frozenset[str], replicas: int, data: st.DataObject
) -> None:
    """Whatever shapes the node's real IDs have, a spot container holding any twin the agent
    serves may sync exactly the one GPU the agent records it using (the GPU whose owner's return
    evicts it), and no other."""
    devices = [GpuDevice(DeviceID(r), i) for i, r in enumerate(sorted(reals))]
    served = twin_ids(devices, replicas)
    assume(served)
    twin = data.draw(st.sampled_from(sorted(served)))
    spot_ref = PodRef(NS, SPOT_CTR.pod)
    alloc = AllocatedDevices(spot_ref, SPOT_CTR.name, SPOT, (DeviceID(twin),))
    build = build_mapping(devices, [alloc], {}, gpu_resource=GPU, spot_resource=SPOT)
    used = {d.device for e in build.snapshot.owners for d in e.devices if spot_ref in d.users}
    lookup = FakeLookup(
        pods=[pod(SPOT_CTR, (SPOT, [twin]))],
        owners=dict.fromkeys(reals, OWNER),
        lendable=dict.fromkeys(reals, True),
    )
    granted = set()
    for real in reals:
        try:
            authorize(
                [ResolvedDevice(GPU, DeviceID(real), OWNER)],
                SPOT_CTR,
                lookup.pod(NS, SPOT_CTR.pod),
                lookup.device_owner,
                POLICY,
                lendable=lookup.device_lendable,
            )
        except SyncRefused as exc:
            assert exc.reason is RefusalReason.TWIN_NOT_ALLOCATED
        else:
            granted.add(real)
    assert granted == used == {served[DeviceID(twin)]}
