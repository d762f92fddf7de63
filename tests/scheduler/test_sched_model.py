"""The public data model: objects refuse bad fields naming themselves; decisions carry what adapters need."""

from __future__ import annotations

import json

import pytest

from spotgpu.core import keys
from spotgpu.core.ids import DeviceID, NodeName, ResourceName
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import NodeStrategy
from spotgpu.scheduler import (
    GPU,
    Bind,
    CreateShadowPod,
    DeviceOwner,
    GPURequest,
    Node,
    Nominate,
    Pod,
    PodGroup,
    Queue,
    ShadowPod,
    SnapshotError,
    parse_node_annotations,
)

P = PodRef("ns", "p")


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (GPURequest.reserved(-1), "gpus must not be negative, got -1"),
        (GPURequest.shared(-5), "milli must not be negative, got -5"),
        (GPURequest.reserved(0), "asks for no GPU"),
        (GPURequest(ResourceName("platform/spot-gpu"), gpus=1, milli=500), "both 1 whole GPUs and 500 milli"),
        (GPURequest(ResourceName("nvidia.com/gpu"), milli=500), "milli (500) is only for shared spot pods"),
        (GPURequest.shared(1000), "milli must be below 1000"),
        (GPURequest(ResourceName("gpu"), gpus=1), "must have a domain prefix"),
        (GPURequest(ResourceName("nvidia.com/gpu"), gpus=True), "gpus must be an integer, got True"),
    ],
    ids=["negative-gpus", "negative-milli", "empty", "both", "milli-on-real", "milli-too-big", "bad-resource", "bool"],
)
def test_bad_request_is_refused_naming_the_pod(request_: GPURequest, message: str) -> None:
    with pytest.raises(SnapshotError) as err:
        Pod(P, "g", request_)
    assert str(err.value).startswith("pod ns/p: request ")
    assert message in str(err.value)


def test_placed_pod_must_list_as_many_devices_as_it_requests() -> None:
    with pytest.raises(
        SnapshotError, match=r"pod ns/p: placed on n1 with 1 devices \['GPU-a'\] but its request needs 2"
    ):
        Pod(P, "g", GPURequest.reserved(2), node=NodeName("n1"), devices=(DeviceID("GPU-a"),))
    with pytest.raises(SnapshotError, match=r"has devices .* but no node"):
        Pod(P, "g", GPURequest.reserved(1), devices=(DeviceID("GPU-a"),))
    with pytest.raises(SnapshotError, match="lists a device twice"):
        Pod(P, "g", GPURequest.reserved(2), node=NodeName("n1"), devices=(DeviceID("GPU-a"), DeviceID("GPU-a")))
    shared = Pod(P, "g", GPURequest.shared(250), node=NodeName("n1"), devices=(DeviceID("GPU-a"),))
    assert shared.placed and shared.request.total_milli == 250


def test_object_fields_are_checked() -> None:
    with pytest.raises(SnapshotError, match="GPU 'bad id'"):
        GPU(DeviceID("bad id"))
    with pytest.raises(SnapshotError, match="would be 65 characters"):
        GPU(DeviceID("G" * 60))  # its twin ID would exceed 63 characters
    with pytest.raises(SnapshotError, match="GPU GPU-a: owner must be a ContainerRef, got str"):
        GPU(DeviceID("GPU-a"), "dev/alice/main")  # type: ignore[arg-type]
    with pytest.raises(SnapshotError, match="pod ns/p: devices must be a tuple, got list"):
        Pod(P, "g", GPURequest.reserved(1), node=NodeName("n1"), devices=[DeviceID("GPU-a")])  # type: ignore[arg-type]
    with pytest.raises(SnapshotError, match="owner _/p/c must name its namespace"):
        GPU(DeviceID("GPU-a"), ContainerRef(None, "p", "c"))
    with pytest.raises(SnapshotError, match="node n1: its real GPU resource cannot be the twin resource"):
        Node(NodeName("n1"), (), resource=ResourceName("platform/spot-gpu"))
    with pytest.raises(SnapshotError, match="queue q: weight must be an integer >= 1, got 0"):
        Queue("q", weight=0)
    with pytest.raises(SnapshotError, match="queue q: capacity_milli must be None or an integer >= 0, got -1"):
        Queue("q", capacity_milli=-1)
    with pytest.raises(SnapshotError, match="PodGroup ns/g: min_member must be an integer >= 1, got 0"):
        PodGroup(PodRef("ns", "g"), "q", min_member=0)
    with pytest.raises(SnapshotError, match="PodGroup _/g: ref must be a PodRef with a namespace"):
        PodGroup(PodRef(None, "g"), "q")
    with pytest.raises(SnapshotError, match="pod ns/p: container 'Bad'"):
        Pod(P, "g", GPURequest.reserved(1), container="Bad")
    with pytest.raises(SnapshotError, match="ShadowPod ns/s: devices must be a non-empty tuple"):
        ShadowPod(PodRef("ns", "s"), NodeName("n1"), ())


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, (False, NodeStrategy.AUTO)),  # no spot-prefer annotation: auto (issue 13)
        ({keys.NODE_LOWPOWER_SPOT: "true", keys.NODE_SPOT_PREFER: "lowpower"}, (True, NodeStrategy.LOWPOWER)),
        ({keys.NODE_LOWPOWER_SPOT: " False ", keys.NODE_SPOT_PREFER: "IDLE"}, (False, NodeStrategy.IDLE)),
    ],
)
def test_node_annotations(annotations: dict[str, str], expected: tuple[bool, NodeStrategy]) -> None:
    assert parse_node_annotations("n1", annotations) == expected


def test_bad_node_annotations_name_node_and_key() -> None:
    with pytest.raises(SnapshotError, match=r"node n1: annotation platform.k8s.io/lowpower-spot='yes'"):
        parse_node_annotations("n1", {keys.NODE_LOWPOWER_SPOT: "yes"})
    with pytest.raises(SnapshotError, match=r"node n1: annotation platform.k8s.io/spot-prefer='fast' must be one of"):
        parse_node_annotations("n1", {keys.NODE_SPOT_PREFER: "fast"})


def test_spot_bind_annotations_carry_device_owner_and_twins() -> None:
    owner = ContainerRef("dev", "alice", "main")
    bind = Bind(
        PodRef("team", "s-0"),
        PodRef("team", "s"),
        NodeName("n1"),
        ResourceName("platform/spot-gpu"),
        (DeviceID("GPU-1"), DeviceID("GPU-2")),
        owners=(DeviceOwner(DeviceID("GPU-1"), owner), DeviceOwner(DeviceID("GPU-2"), owner)),
    )
    assert bind.spot
    assert bind.twin_ids() == ("spot-GPU-1", "spot-GPU-2")
    ann = bind.annotations()
    assert json.loads(ann[keys.DEVICE_OWNER]) == {"GPU-1": "dev/alice/main", "GPU-2": "dev/alice/main"}
    assert json.loads(ann[keys.ASSIGNED_DEVICES]) == {"platform/spot-gpu": ["spot-GPU-1", "spot-GPU-2"]}
    assert bind.owner_map() == {"GPU-1": owner, "GPU-2": owner}


def test_reserved_bind_has_no_owner_annotation() -> None:
    bind = Bind(P, PodRef("ns", "g"), NodeName("n1"), ResourceName("nvidia.com/gpu"), (DeviceID("GPU-1"),))
    assert not bind.spot
    assert bind.annotations() == {keys.ASSIGNED_DEVICES: '{"nvidia.com/gpu":["GPU-1"]}'}


def test_shadow_pod_and_nomination_metadata() -> None:
    create = CreateShadowPod(
        PodRef("team", "s-shadow-1"),
        NodeName("n1"),
        ResourceName("nvidia.com/gpu"),
        (DeviceID("GPU-1"),),
        PodRef("team", "s"),
    )
    assert create.container_ref == ContainerRef("team", "s-shadow-1", "main")
    assert create.labels() == {keys.SHADOW_FOR: "s", keys.SHADOW_POD_LABEL: "true"}
    ann = create.annotations()
    assert ann[keys.POD_DEVICE_TYPE] == "shadow"
    assert ann[keys.SHADOW_FOR] == "team/s"
    assert json.loads(ann[keys.ASSIGNED_DEVICES]) == {"nvidia.com/gpu": ["GPU-1"]}
    nom = Nominate(P, PodRef("ns", "g"), NodeName("n1"), (DeviceID("GPU-1"),))
    assert json.loads(nom.annotations()[keys.NOMINATED_DEVICES]) == {"node": "n1", "devices": ["GPU-1"]}
