"""Shared spot, steerable end to end: the agent's device plugins steer the kubelet's choice of
twins to the GPU the scheduler assigned, keep exclusive and shared use of one GPU apart, and
report the truth when the kubelet chose otherwise.

No kubelet can run here: :class:`~spotgpu.testing.kubelet.KubeletDouble` plays its device
manager over real gRPC on unix sockets (Registration, ListAndWatch, and on admission
``GetPreferredAllocation`` when the plugin's options offer it, then ``Allocate``); pod-resources
and the API are the agent's in-memory ports (the test records each grant the way the kubelet
would). The pure decisions of :mod:`spotgpu.agent.steer` are tested directly, with hypothesis
for their invariants.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.adapters.deviceplugin import DevicePluginServer
from spotgpu.agent.model import AllocateRefused, allocate_annotations
from spotgpu.agent.steer import (
    Candidate,
    DeviceUse,
    MatchResult,
    TwinKind,
    TwinPool,
    admission_candidates,
    assigned_gpus,
    check_kinds,
    match_allocation,
    pool_health,
    prefer,
    steering_mismatches,
    twin_pools,
    twin_view,
)
from spotgpu.cli import main
from spotgpu.core import keys
from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.codec import AssignmentError, parse_devices_from
from spotgpu.core.config import AgentConfig
from spotgpu.core.configfile import ConfigError
from spotgpu.core.ids import (
    SPOT_GPU_RESOURCE,
    SPOT_GPU_SHARED_RESOURCE,
    DeviceID,
    NodeName,
    ResourceName,
    real_of_twin,
    to_spot_id,
)
from spotgpu.core.mapping_cache import IDLE_SPACE, Owner
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import Health
from spotgpu.kube.snapshot import build_snapshot
from spotgpu.ports.kube import ContainerInfo, PodInfo
from spotgpu.ports.node import GpuDevice
from spotgpu.testing.kubelet import AdmissionError, KubeletDouble

from .helpers import NODE, OWNER, Rig, make_rig

SPOT = str(SPOT_GPU_RESOURCE)
SHARED = str(SPOT_GPU_SHARED_RESOURCE)
SHADOW = ContainerRef(keys.DEFAULT_SHADOW_NAMESPACE, "shadow-1", "main")
REPLICAS = 3


# --- helpers ----------------------------------------------------------------------------------


def bound(name: str, resource: str, gpus: list[str], *, milli: int | None = None, count: int = 1) -> PodInfo:
    """A spot pod the scheduler bound to NODE with ``gpus`` assigned, not started yet."""
    annotations = {keys.ASSIGNED_DEVICES: json.dumps({SPOT: [to_spot_id(g) for g in gpus]})}
    if milli is not None:
        annotations[keys.SPOT_GPU_MILLI] = str(milli)
    return PodInfo(
        PodRef("spot", name),
        uid=f"uid-{name}",
        node=NODE,
        phase="Pending",
        annotations=annotations,
        containers=(ContainerInfo("worker", None, {resource: count}),),
    )


def bind(rig: Rig, name: str, resource: str, gpus: list[str], **kw: Any) -> PodRef:
    info = bound(name, resource, gpus, **kw)
    rig.add_pod(info)
    return info.ref


def record(rig: Rig, ref: PodRef, resource: str, ids: tuple[str, ...]) -> None:
    """The kubelet admitted the pod: pod-resources reports its devices from now on."""
    rig.allocations.append(AllocatedDevices(ref, "worker", ResourceName(resource), tuple(DeviceID(i) for i in ids)))
    rig.podres.set(rig.allocations)


def synced(annotations: Any) -> dict[str, list[str]]:
    """The devices-from annotation as ``{source: real devices}``."""
    parsed = parse_devices_from(annotations[keys.DEVICES_FROM_PREFIX])
    return {str(s.ref): list(s.devices("nvidia.com/gpu")) for s in parsed.sources}


def node_state(rig: Rig) -> dict[str, dict[str, Any]]:
    state: dict[str, dict[str, Any]] = json.loads(rig.kube.node_annotations[NODE][keys.NODE_SPOT_GPU_STATE])
    return state


def metric(rig: Rig, name: str, **labels: str) -> float:
    return rig.agent.metrics.sample(name, labels) or 0.0


def lend(rig: Rig) -> None:
    rig.cycle(0)
    rig.cycle(61)


@pytest.fixture
def short_path() -> Iterator[Path]:
    """A short base directory: two plugin sockets' paths under pytest's long tmp_path would
    exceed the 107 bytes of a unix socket path (the kubelet's real directory is short)."""
    path = Path(tempfile.mkdtemp(prefix="sg-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(short_path: Path) -> Iterator[KubeletDouble]:
    with KubeletDouble(short_path / "device-plugins") as double:
        yield double


@pytest.fixture
def rig(short_path: Path, kubelet: KubeletDouble) -> Iterator[Rig]:
    rig = make_rig(short_path, plugin=True, shared=REPLICAS)
    try:
        kubelet.wait_registered(SPOT)
        kubelet.wait_registered(SHARED)
        rig.add_shadow([rig.d[2], rig.d[3]])  # GPUs 2 and 3 are held by a ShadowPod
        lend(rig)  # the owner of GPUs 0 and 1 is lent
        kubelet.wait_devices(
            SHARED, lambda d: len(d) == 4 * REPLICAS and all(s.health == "Healthy" for s in d.values())
        )
        kubelet.wait_devices(SPOT, lambda d: len(d) == 4 and all(s.health == "Healthy" for s in d.values()))
        yield rig
    finally:
        rig.agent.stop()


# --- over the wire ------------------------------------------------------------------------------


def test_both_resources_are_served_with_preferred_allocation(rig: Rig, kubelet: KubeletDouble) -> None:
    spot, shared = kubelet.wait_registered(SPOT), kubelet.wait_registered(SHARED)
    assert spot.get_preferred_allocation_available and shared.get_preferred_allocation_available
    assert shared.endpoint == "spotgpu-spot-gpu-shared.sock"
    assert set(kubelet.devices(SPOT)) == {to_spot_id(d) for d in rig.d}
    replicas = kubelet.devices(SHARED)
    assert set(replicas) == {f"{to_spot_id(d)}::{k}" for d in rig.d for k in range(REPLICAS)}
    assert {s.numa_nodes for t, s in replicas.items() if t.startswith(to_spot_id(rig.d[1]))} == {
        (rig.devices[1].numa_node,)
    }


def test_two_shared_spot_pods_are_steered_to_the_schedulers_gpu(rig: Rig, kubelet: KubeletDouble) -> None:
    gpu = rig.d[1]  # the kubelet's own first choice would be a replica of GPU 0 (lowest ID)
    a = bind(rig, "a", SHARED, [gpu], milli=400)
    first = kubelet.admit(SHARED, 1)
    assert first.preferred == (f"spot-{gpu}::0",) and first.devices == first.preferred
    assert synced(first.response.annotations) == {OWNER.format(): [gpu]}
    # the grant counts at once: the GPU's exclusive twin is Unhealthy, the others' are not
    kubelet.wait_devices(SPOT, lambda d: d[to_spot_id(gpu)].health == "Unhealthy")
    assert kubelet.devices(SPOT)[to_spot_id(rig.d[0])].health == "Healthy"

    b = bind(rig, "b", SHARED, [gpu], milli=400)  # bound while a's grant is not in pod-resources yet
    second = kubelet.admit(SHARED, 1)
    assert second.devices == (f"spot-{gpu}::1",)
    assert synced(second.response.annotations) == {OWNER.format(): [gpu]}
    assert metric(rig, "spotgpu_agent_allocations_total", resource=SHARED, result="assigned") == 2

    record(rig, a, SHARED, first.devices)
    record(rig, b, SHARED, second.devices)
    rig.cycle(1)
    assert rig.agent.solver.grants() == []  # confirmed by pod-resources
    assert rig.agent.solver.mapping.get_device_users(gpu) == (a, b)
    state = node_state(rig)
    assert state[gpu]["pods"] == ["spot/a", "spot/b"] and state[gpu]["replicas"] == REPLICAS
    assert "pods" not in state[rig.d[0]]
    assert metric(rig, "spotgpu_agent_allocation_mismatches_total", resource=SHARED) == 0
    assert rig.agent.solver.twin_health()[to_spot_id(gpu)] is Health.UNHEALTHY

    rig.guard.owner_back(OWNER)  # both shared users are the owner's GPU's spot users: evicted together
    assert set(rig.kube.deleted()) >= {a, b}


def test_an_exclusive_pod_is_refused_on_a_gpu_with_shared_users(rig: Rig, kubelet: KubeletDouble) -> None:
    gpu = rig.d[1]
    a = bind(rig, "a", SHARED, [gpu], milli=500)
    admitted = kubelet.admit(SHARED, 1)
    record(rig, a, SHARED, admitted.devices)
    rig.cycle(1)
    kubelet.wait_devices(SPOT, lambda d: d[to_spot_id(gpu)].health == "Unhealthy")
    # a kubelet whose list still showed the exclusive twin Healthy asks for it anyway
    with pytest.raises(grpc.RpcError) as err:
        kubelet.allocate(SPOT, [to_spot_id(gpu)])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "shared spot use" in (err.value.details() or "")
    assert metric(rig, "spotgpu_agent_allocations_total", resource=SPOT, result="refused") == 1

    # the reverse: an exclusive user of GPU 0 makes its replicas Unhealthy, and refuses them
    e = bind(rig, "e", SPOT, [rig.d[0]])
    exclusive = kubelet.admit(SPOT, 1)
    assert exclusive.devices == (to_spot_id(rig.d[0]),)
    kubelet.wait_devices(SHARED, lambda d: all(d[f"spot-{rig.d[0]}::{k}"].health == "Unhealthy" for k in range(3)))
    with pytest.raises(grpc.RpcError) as err:
        kubelet.allocate(SHARED, [f"spot-{rig.d[0]}::2"])
    assert "exclusive spot use" in (err.value.details() or "")
    record(rig, e, SPOT, exclusive.devices)

    # a's pod ends: the kubelet forgets its replica, and GPU 1 may be lent exclusively again
    rig.remove_pod(a)
    kubelet.release(SHARED, admitted.devices)
    rig.cycle(1)
    kubelet.wait_devices(SPOT, lambda d: d[to_spot_id(gpu)].health == "Healthy")
    assert kubelet.devices(SHARED)[f"spot-{rig.d[0]}::0"].health == "Unhealthy"  # e still runs there


def test_when_the_kubelet_ignores_the_preference_the_truth_is_answered_and_counted(
    rig: Rig, kubelet: KubeletDouble
) -> None:
    gpu = rig.d[1]
    c = bind(rig, "c", SHARED, [gpu], milli=300)
    admitted = kubelet.admit(SHARED, 1, ignore_preference=True)
    assert admitted.preferred == (f"spot-{gpu}::0",)
    truth = real_of_twin(admitted.devices[0], set(rig.d))
    assert truth == rig.d[0]  # the kubelet took the lowest non-preferred replica
    assert synced(admitted.response.annotations) == {OWNER.format(): [truth]}  # the GPU it really gets
    assert metric(rig, "spotgpu_agent_allocations_total", resource=SHARED, result="mismatch") == 1
    # the grant blocks the GPU really used, not the assigned one
    kubelet.wait_devices(SPOT, lambda d: d[to_spot_id(truth)].health == "Unhealthy")
    assert kubelet.devices(SPOT)[to_spot_id(gpu)].health == "Healthy"

    record(rig, c, SHARED, admitted.devices)
    rig.cycle(1)
    rig.cycle(1)
    assert metric(rig, "spotgpu_agent_allocation_mismatches_total", resource=SHARED) == 1  # once per container
    state = node_state(rig)
    assert state[truth]["pods"] == ["spot/c"] and "pods" not in state[gpu]

    # the scheduler's next snapshot takes the agent's truth over its own assignment
    pod_json = {
        "metadata": {
            "name": "c",
            "namespace": "spot",
            "annotations": dict(bound("c", SHARED, [gpu], milli=300).annotations),
        },
        "spec": {
            "schedulerName": "spotgpu",
            "nodeName": NODE,
            "containers": [{"name": "worker", "resources": {"limits": {SHARED: "1"}}}],
        },
        "status": {"phase": "Pending"},
    }
    node_json = {
        "metadata": {"name": NODE, "annotations": rig.kube.node_annotations[NODE]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    snapshot = build_snapshot(
        nodes=[node_json],
        pods=[pod_json],
        podgroups=[],
        queues=[{"kind": "Queue", "metadata": {"name": "default"}, "spec": {"type": "spot"}}],
    ).snapshot
    (placed,) = snapshot.pods
    assert placed.devices == (truth,) and placed.request.milli == 300


def test_a_pod_the_agents_watch_delivers_late_is_still_steered(rig: Rig, kubelet: KubeletDouble) -> None:
    """The kubelet's own watch may hand it a freshly bound pod before the agent's watch does."""
    timer = threading.Timer(0.2, bind, (rig, "late", SHARED, [rig.d[1]]), {"milli": 100})
    timer.start()
    try:
        admitted = kubelet.admit(SHARED, 1)
    finally:
        timer.join()
    assert admitted.devices == (f"spot-{rig.d[1]}::0",)
    assert metric(rig, "spotgpu_agent_preferred_allocations_total", resource=SHARED, result="steered") == 1


def test_without_a_pending_pod_the_choice_bin_packs_and_never_mixes_kinds(rig: Rig, kubelet: KubeletDouble) -> None:
    rig.agent.solver.settings = dataclasses.replace(rig.agent.solver.settings, candidate_wait=0.05)
    first = kubelet.admit(SHARED, 1)
    second = kubelet.admit(SHARED, 1)
    assert first.devices == (f"spot-{rig.d[0]}::0",) and second.devices == (f"spot-{rig.d[0]}::1",)
    assert metric(rig, "spotgpu_agent_allocations_total", resource=SHARED, result="unassigned") == 2
    kubelet.wait_devices(SPOT, lambda d: d[to_spot_id(rig.d[0])].health == "Unhealthy")
    exclusive = kubelet.admit(SPOT, 1)  # GPU 0 is not offered any more; GPU 1 is the next lendable one
    assert exclusive.devices == (to_spot_id(rig.d[1]),)


def test_an_unconfirmed_grant_expires(rig: Rig, kubelet: KubeletDouble) -> None:
    bind(rig, "lost", SHARED, [rig.d[1]], milli=100)
    kubelet.admit(SHARED, 1)  # the kubelet's admission then fails for another reason: never in pod-resources
    kubelet.wait_devices(SPOT, lambda d: d[to_spot_id(rig.d[1])].health == "Unhealthy")
    rig.cycle(30)
    assert [g["pod"] for g in rig.agent.debug_state()["grants"]] == ["spot/lost"]
    rig.cycle(31)
    assert rig.agent.solver.grants() == []
    kubelet.wait_devices(SPOT, lambda d: d[to_spot_id(rig.d[1])].health == "Healthy")


def test_legacy_twin_replicas_are_steered_too(short_path: Path, kubelet: KubeletDouble) -> None:
    rig = make_rig(short_path, plugin=True, replicas=2)
    try:
        rig.add_shadow([rig.d[2], rig.d[3]])
        lend(rig)
        kubelet.wait_devices(SPOT, lambda d: len(d) == 8 and all(s.health == "Healthy" for s in d.values()))
        bind(rig, "old", SPOT, [rig.d[1]], milli=500)
        assert kubelet.admit(SPOT, 1).devices == (f"spot-{rig.d[1]}::0",)
        assert kubelet.registration_count(SHARED) == 0
    finally:
        rig.agent.stop()


def test_a_failing_preference_never_fails_the_admission(short_path: Path, kubelet: KubeletDouble) -> None:
    def broken(available: Any, must: Any, size: int) -> list[str]:
        raise RuntimeError("bug")

    plugin = DevicePluginServer(
        short_path / "device-plugins", "example.com/thing", lambda ids: {}, socket_name="t.sock", preferred=broken
    )
    plugin.set_devices([])
    plugin.start()
    try:
        kubelet.wait_registered("example.com/thing")
        assert kubelet.preferred_allocation("example.com/thing", ["a", "b"], [], 1) == []
        assert plugin.preference_errors == 1
    finally:
        plugin.stop()


def test_admission_fails_like_the_kubelets_when_too_few_devices_are_healthy(rig: Rig, kubelet: KubeletDouble) -> None:
    with pytest.raises(AdmissionError, match="Requested: 5, Available: 4"):
        kubelet.admit(SPOT, 5)


def test_shared_replicas_config_is_validated() -> None:
    assert AgentConfig(shared_replicas=4).shared_resource == SHARED
    with pytest.raises(ConfigError, match="sharedReplicas"):
        AgentConfig(shared_replicas=65)
    with pytest.raises(ConfigError, match="twinReplicas"):
        AgentConfig(shared_replicas=2, twin_replicas=2)


def test_agent_check_names_the_served_resources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("agent:\n  nodeName: n1\n  sharedReplicas: 4\n")
    assert main(["agent", "--config", str(config), "--check"]) == 0
    out = capsys.readouterr().out
    assert "platform/spot-gpu (exclusive twins), platform/spot-gpu-shared (4 shared replicas per GPU)" in out
    config.write_text("agent:\n  nodeName: n1\n  sharedReplicas: 2\n  twinReplicas: 2\n")
    assert main(["agent", "--config", str(config), "--check"]) == 2
    assert "sharedReplicas: cannot be combined" in capsys.readouterr().err


# --- the pure decisions ---------------------------------------------------------------------------

GPUS = [DeviceID(f"GPU-{i}") for i in range(4)]
NUMA: dict[DeviceID, int | None] = {g: i // 2 for i, g in enumerate(GPUS)}
EXCL = TwinPool(SPOT_GPU_RESOURCE, TwinKind.EXCLUSIVE)
SHRD = TwinPool(SPOT_GPU_SHARED_RESOURCE, TwinKind.SHARED, 3, suffixed=True)
DEVICES = [GpuDevice(g, i, numa_node=NUMA[g]) for i, g in enumerate(GPUS)]
TWINS = {EXCL.resource: EXCL.twins(DEVICES), SHRD.resource: SHRD.twins(DEVICES)}
KINDS = {EXCL.resource: EXCL.kind, SHRD.resource: SHRD.kind}


def test_twin_pools_per_configuration() -> None:
    assert twin_pools(SPOT_GPU_RESOURCE) == (EXCL,)
    assert twin_pools(SPOT_GPU_RESOURCE, shared_replicas=3) == (EXCL, SHRD)
    (legacy,) = twin_pools(SPOT_GPU_RESOURCE, twin_replicas=2)
    assert legacy.kind is TwinKind.SHARED and legacy.resource == SPOT_GPU_RESOURCE
    one = TwinPool(SPOT_GPU_SHARED_RESOURCE, TwinKind.SHARED, 1, suffixed=True).twins(DEVICES[:1])
    assert one == {"spot-GPU-0::0": "GPU-0"}  # never the exclusive twin's spelling


uses = st.dictionaries(
    st.sampled_from(GPUS),
    st.builds(
        DeviceUse,
        st.frozensets(st.sampled_from(["spot-x"]), max_size=1),
        st.frozensets(st.sampled_from(["spot-x::0", "spot-x::1"]), max_size=2),
    ),
)


HOLDERS = st.dictionaries(st.sampled_from(GPUS), st.sampled_from([IDLE_SPACE, OWNER]))


@given(uses, st.dictionaries(st.sampled_from(GPUS), st.sampled_from(list(Health))), HOLDERS)
def test_kind_rule_one_kind_per_gpu(
    use: dict[DeviceID, DeviceUse], lendable: dict[DeviceID, Health], owners: dict[DeviceID, Owner]
) -> None:
    health = pool_health(TWINS, KINDS, lendable, use, owners=owners)
    for twin, real in TWINS[EXCL.resource].items():
        u = use.get(real, DeviceUse())
        expected = lendable.get(real) is Health.HEALTHY and not u.shared and owners.get(real) == OWNER
        assert (health[EXCL.resource][twin] is Health.HEALTHY) == expected
    for twin, real in TWINS[SHRD.resource].items():
        u = use.get(real, DeviceUse())
        expected = lendable.get(real) is Health.HEALTHY and not u.exclusive and owners.get(real) == OWNER
        assert (health[SHRD.resource][twin] is Health.HEALTHY) == expected


@given(
    uses,
    st.dictionaries(st.sampled_from(GPUS), st.sampled_from(list(Health))),
    HOLDERS,
    st.dictionaries(st.sampled_from(GPUS), st.just(SHADOW)),
)
def test_a_twin_is_healthy_exactly_when_allocate_gives_it(
    use: dict[DeviceID, DeviceUse],
    lendable: dict[DeviceID, Health],
    owners: dict[DeviceID, Owner],
    pending: dict[DeviceID, ContainerRef],
) -> None:
    """Issue 12, item 11: the health ListAndWatch shows and Allocate's decision are one function."""
    health = pool_health(TWINS, KINDS, lendable, use, owners=owners, pending=pending)
    for resource, table in TWINS.items():
        for twin, real in table.items():
            view = twin_view(twin, real, KINDS[resource], lendable, use, owners=owners, pending=pending)
            try:
                allocate_annotations([twin], {twin: view}.get, gpu_resource=ResourceName("nvidia.com/gpu"))
            except AllocateRefused:
                given_out = False
            else:
                given_out = True
            assert (health[resource][twin] is Health.HEALTHY) == given_out


def candidate(name: str, *gpus: str, size: int = 1) -> Candidate:
    return Candidate(PodRef("spot", name), "worker", size, tuple(DeviceID(g) for g in gpus))


@given(
    st.lists(st.sampled_from(sorted(TWINS[SHRD.resource])), unique=True),
    st.lists(st.sampled_from(sorted(TWINS[SHRD.resource])), unique=True, max_size=1),
    st.integers(1, 4),
    uses,
    st.lists(st.sampled_from(GPUS), max_size=2),
    st.frozensets(st.sampled_from(GPUS)),
)
def test_preference_invariants(
    available: list[str],
    must: list[str],
    size: int,
    use: dict[DeviceID, DeviceUse],
    assigned: list[DeviceID],
    lendable: frozenset[DeviceID],
) -> None:
    cands = [candidate("p", *assigned, size=size)] if assigned else []
    twins = TWINS[SHRD.resource]
    pref = prefer(
        available, must, size, pool=SHRD, twins=twins, use=use, candidates=cands, numa=NUMA, lendable=lendable
    )
    ids = list(pref.ids)
    assert len(ids) == len(set(ids)) <= size
    assert ids[: len(must)] == must[:size]  # the kubelet's must-include first
    assert set(ids) <= set(available) | set(must)  # only what was offered
    for twin in ids[len(must) :]:
        real = twins[DeviceID(twin)]
        assert not use.get(real, DeviceUse()).exclusive  # never mixes kinds
        assert real in lendable  # never a GPU that cannot be lent now
    if pref.steered:
        assert {twins[DeviceID(t)] for t in ids} >= set(assigned)


def test_preference_steers_exclusive_multi_gpu_and_falls_back_near() -> None:
    avail = sorted(TWINS[EXCL.resource])
    pref = prefer(
        avail,
        [],
        2,
        pool=EXCL,
        twins=TWINS[EXCL.resource],
        use={},
        candidates=[candidate("p", "GPU-3", "GPU-1", size=2)],
        numa=NUMA,
    )
    assert pref.ids == ("spot-GPU-3", "spot-GPU-1") and pref.steered
    # the first fitting candidate wins (binding order); one whose GPU is not offered is passed over
    cands = [candidate("gone", "GPU-0"), candidate("next", "GPU-2")]
    pref = prefer(avail[1:], [], 1, pool=EXCL, twins=TWINS[EXCL.resource], use={}, candidates=cands, numa=NUMA)
    assert pref.ids == ("spot-GPU-2",) and pref.candidate == cands[1]
    # no candidate: GPUs a container holds (owner or ShadowPod) before those nobody holds
    pref = prefer(avail, [], 1, pool=EXCL, twins=TWINS[EXCL.resource], use={}, candidates=[], numa=NUMA, held=GPUS[2:])
    assert pref.ids == ("spot-GPU-2",)
    # then the NUMA node of what must be included
    pref = prefer(avail, ["spot-GPU-2"], 2, pool=EXCL, twins=TWINS[EXCL.resource], use={}, candidates=[], numa=NUMA)
    assert pref.ids == ("spot-GPU-2", "spot-GPU-3") and pref.candidate is None


def test_shared_fallback_packs_onto_the_busiest_gpu() -> None:
    use = {DeviceID("GPU-2"): DeviceUse(shared=frozenset({DeviceID("spot-GPU-2::0")}))}
    avail = sorted(t for t in TWINS[SHRD.resource] if t != "spot-GPU-2::0")
    pref = prefer(avail, [], 1, pool=SHRD, twins=TWINS[SHRD.resource], use=use, candidates=[], numa=NUMA)
    assert pref.ids == ("spot-GPU-2::1",)


def test_check_kinds_refuses_the_other_kind() -> None:
    use = {DeviceID("GPU-1"): DeviceUse(exclusive=frozenset({DeviceID("spot-GPU-1")}))}
    check_kinds(["spot-GPU-1"], EXCL.resource, EXCL.kind, TWINS, use)  # the same kind: fine
    with pytest.raises(AllocateRefused, match="exclusive spot use"):
        check_kinds(["spot-GPU-0::0", "spot-GPU-1::2"], SHRD.resource, SHRD.kind, TWINS, use)


def test_admission_candidates_are_unstarted_unadmitted_pods_in_binding_order() -> None:
    waiting = bound("w", SHARED, ["GPU-1"], milli=200)

    def variant(name: str, **changes: Any) -> PodInfo:
        return dataclasses.replace(waiting, ref=PodRef("spot", name), **changes)

    running = variant("r", phase="Running")
    started = variant("s", containers=(ContainerInfo("worker", "cid", {SHARED: 1}),))
    elsewhere = variant("x", node=NodeName("other"))
    admitted = bound("a", SHARED, ["GPU-2"])
    deleting = variant("d", deleting=True)
    exclusive = bound("e", SPOT, ["GPU-0", "GPU-3"], count=2)
    broken = variant("b", annotations={keys.ASSIGNED_DEVICES: "{"})
    pods = [running, waiting, started, elsewhere, admitted, deleting, exclusive, broken]
    found, problems = admission_candidates(
        pods, SPOT_GPU_SHARED_RESOURCE, node=NODE, admitted={(admitted.ref, "worker")}, known=GPUS
    )
    assert found == [candidate("w", "GPU-1"), Candidate(PodRef("spot", "b"), "worker", 1)]
    assert len(problems) == 1 and "not JSON" in problems[0]
    found, _ = admission_candidates(pods, SPOT_GPU_RESOURCE, node=NODE, admitted=set(), known=GPUS)
    assert found == [candidate("e", "GPU-0", "GPU-3", size=2)]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"platform/spot-gpu": ["spot-GPU-1"]}', ("GPU-1",)),
        ('{"platform/spot-gpu-shared": ["spot-GPU-1::2", "spot-GPU-1::0"]}', ("GPU-1",)),
        ('{"nvidia.com/gpu": ["GPU-2"], "platform/spot-gpu": ["spot-GPU-9"]}', ("GPU-2",)),  # GPU-9: not ours
        ("", ()),
    ],
)
def test_assigned_gpus(raw: str, expected: tuple[str, ...]) -> None:
    assert assigned_gpus({keys.ASSIGNED_DEVICES: raw}, GPUS) == expected


@given(st.text(max_size=60))
def test_assigned_gpus_garbage_is_a_clear_error_or_nothing(raw: str) -> None:
    try:
        result = assigned_gpus({keys.ASSIGNED_DEVICES: raw}, GPUS)
    except AssignmentError as exc:
        assert keys.ASSIGNED_DEVICES in str(exc)
    else:
        assert set(result) <= set(GPUS)


def test_match_allocation() -> None:
    twins = TWINS[SHRD.resource]
    a, b, blank = candidate("a", "GPU-1"), candidate("b", "GPU-2"), Candidate(PodRef("spot", "n"), "worker", 1)
    assert match_allocation(["spot-GPU-2::0"], twins, [a, b], None) == match_allocation(
        ["spot-GPU-2::0"], twins, [a, b], b
    )
    match = match_allocation(["spot-GPU-2::0"], twins, [a, b], None)
    assert match.candidate == b and match.result is MatchResult.ASSIGNED  # assigned exactly these GPUs
    match = match_allocation(["spot-GPU-2::0"], twins, [a, b], a)  # the preference chose a: a it is
    assert match.candidate == a and match.result is MatchResult.MISMATCH and match.allocated == ("GPU-2",)
    assert match_allocation(["spot-GPU-0::0"], twins, [blank], None).result is MatchResult.UNASSIGNED
    assert match_allocation(["spot-GPU-0::0", "spot-GPU-0::1"], twins, [a], None).candidate is None


def test_steering_mismatches_compare_pod_resources_with_the_assignment() -> None:
    pods = {p.ref: p for p in (bound("ok", SHARED, ["GPU-1"]), bound("off", SHARED, ["GPU-1"]))}
    rows = [
        AllocatedDevices(PodRef("spot", "ok"), "worker", SPOT_GPU_SHARED_RESOURCE, (DeviceID("spot-GPU-1::0"),)),
        AllocatedDevices(PodRef("spot", "off"), "worker", SPOT_GPU_SHARED_RESOURCE, (DeviceID("spot-GPU-3::2"),)),
        AllocatedDevices(PodRef("spot", "unknown"), "worker", SPOT_GPU_SHARED_RESOURCE, (DeviceID("spot-GPU-3::1"),)),
    ]
    (found,) = steering_mismatches(rows, pods, TWINS, GPUS)
    assert (found.pod.name, found.assigned, found.allocated) == ("off", ("GPU-1",), ("GPU-3",))
