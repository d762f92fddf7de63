"""The container-devices-from annotation codec: forms, round trips, the targeting rule, and
one test per malformed-input class asserting its error type and message."""

from __future__ import annotations

import contextlib
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core import codec, keys
from spotgpu.core.codec import (
    AnnotationTooLarge,
    ConflictingSources,
    DevicesFrom,
    DevicesFromError,
    DuplicateDevice,
    EmptyAnnotation,
    InvalidAnnotationKey,
    InvalidDeviceID,
    InvalidDeviceList,
    InvalidJSON,
    InvalidResource,
    InvalidSourceKey,
    NotAnObject,
    SyncKind,
    SyncSource,
    devices_from_for_container,
    devices_from_key,
    format_devices_from,
    parse_devices_from,
)
from spotgpu.core.ids import DeviceID, ResourceName
from spotgpu.core.refs import ContainerRef, PodRef

GPU = "nvidia.com/gpu"


def test_seed_example_container_sync() -> None:
    value = '{"_/shadowPod-xxx/main": {"nvidia.com/gpu": ["GPU-111", "GPU-222"]}}'
    with pytest.raises(InvalidSourceKey, match="pod name 'shadowPod-xxx'"):
        parse_devices_from(value)  # the seed's example uses a capital letter, which Kubernetes forbids
    parsed = parse_devices_from(value.replace("shadowPod", "shadowpod"))
    (source,) = parsed.sources
    assert source.kind is SyncKind.CONTAINER
    assert source.ref == ContainerRef(None, "shadowpod-xxx", "main")
    assert source.devices(GPU) == ("GPU-111", "GPU-222")
    assert source.resolve("spot").ref == ContainerRef("spot", "shadowpod-xxx", "main")


def test_three_forms_and_canonical_text() -> None:
    value = (
        '{"direct": {"nvidia.com/gpu": ["GPU-3"]}, "ns/infer-0": {"nvidia.com/gpu": []},'
        ' "_/dev/main": {"rdma/hca": ["mlx5_0"], "nvidia.com/gpu": ["GPU-1"]}}'
    )
    parsed = parse_devices_from(value)
    assert [s.kind for s in parsed.sources] == [SyncKind.CONTAINER, SyncKind.DIRECT, SyncKind.POD]
    assert parsed.sources[1].ref is None
    assert parsed.sources[2].ref == PodRef("ns", "infer-0")
    assert parsed.sources[0].resources == (
        (ResourceName(GPU), (DeviceID("GPU-1"),)),
        (ResourceName("rdma/hca"), (DeviceID("mlx5_0"),)),
    )
    text = format_devices_from(parsed)
    assert text == (
        '{"_/dev/main":{"nvidia.com/gpu":["GPU-1"],"rdma/hca":["mlx5_0"]},'
        '"direct":{"nvidia.com/gpu":["GPU-3"]},"ns/infer-0":{"nvidia.com/gpu":[]}}'
    )
    assert parse_devices_from(text) == parsed
    assert format_devices_from(parse_devices_from(text)) == text


MALFORMED = [
    ("not json", InvalidJSON, "not valid JSON"),
    ('{"a/b/c": {"nvidia.com/gpu": ["x"]}, "a/b/c": {}}', InvalidJSON, "duplicate JSON key 'a/b/c'"),
    ("[1]", NotAnObject, "must be a JSON object of sources, got list"),
    ('{"a/b/c": ["GPU-1"]}', NotAnObject, "source 'a/b/c' must map resource names to device lists, got list"),
    ("{}", EmptyAnnotation, "names no source"),
    ("  ", EmptyAnnotation, "annotation value is empty"),
    ('{"a/b/c": {}}', EmptyAnnotation, "source 'a/b/c' names no resource"),
    ('{"abc": {"nvidia.com/gpu": ["x"]}}', InvalidSourceKey, "must be 'ns/pod/container' (ContainerSync)"),
    ('{"a/b/c/d": {"nvidia.com/gpu": ["x"]}}', InvalidSourceKey, "must be 'ns/pod/container'"),
    ('{"A/b/c": {"nvidia.com/gpu": ["x"]}}', InvalidSourceKey, "namespace 'A'"),
    ('{"a/b/c": {"gpu": ["x"]}}', InvalidResource, "must have a domain prefix"),
    (
        '{"a/b/c": {"nvidia.com/gpu": "GPU-1"}}',
        InvalidDeviceList,
        "devices of 'nvidia.com/gpu' must be a list, got str",
    ),
    ('{"direct": {"nvidia.com/gpu": []}}', InvalidDeviceList, "needs at least one device ID"),
    ('{"a/b/c": {"nvidia.com/gpu": [1]}}', InvalidDeviceID, "must be a string, got int"),
    ('{"a/b/c": {"nvidia.com/gpu": ["GPU 1"]}}', InvalidDeviceID, "character ' '"),
    ('{"a/b/c": {"nvidia.com/gpu": ["G", "G"]}}', DuplicateDevice, "device 'G' of 'nvidia.com/gpu' is listed twice"),
    (
        '{"a/b/c": {"nvidia.com/gpu": ["G"]}, "a/d/c": {"nvidia.com/gpu": ["G"]}}',
        ConflictingSources,
        "device 'G' of 'nvidia.com/gpu' is claimed by two sources: 'a/b/c' and 'a/d/c'",
    ),
    ('{"a/b/c": {"nvidia.com/gpu": ["' + "x" * 40000 + '"]}}', AnnotationTooLarge, "at most 32768"),
    (
        json.dumps({f"ns/p{i}/c": {GPU: [f"G{i}"]} for i in range(65)}),
        AnnotationTooLarge,
        "65 sources; at most 64",
    ),
    (json.dumps({"a/b/c": {GPU: [f"G{i}" for i in range(257)]}}), AnnotationTooLarge, "257 devices"),
    ("[" * 5000 + "]" * 5000, InvalidJSON, "not valid JSON"),
]


@pytest.mark.parametrize(
    ("value", "error", "fragment"), MALFORMED, ids=[m[1].__name__ + str(i) for i, m in enumerate(MALFORMED)]
)
def test_malformed_values(value: str, error: type[DevicesFromError], fragment: str) -> None:
    with pytest.raises(error) as info:
        parse_devices_from(value)
    assert type(info.value) is error
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_non_string_value() -> None:
    with pytest.raises(NotAnObject, match="must be a string, got bytes"):
        parse_devices_from(b"{}")


def test_every_error_class_is_covered() -> None:
    covered = {m[1] for m in MALFORMED} | {InvalidAnnotationKey}
    declared = {obj for obj in vars(codec).values() if isinstance(obj, type) and issubclass(obj, DevicesFromError)} - {
        DevicesFromError
    }
    assert declared == covered


def test_keys_and_the_targeting_rule() -> None:
    assert devices_from_key() == keys.DEVICES_FROM_PREFIX
    assert devices_from_key("main") == keys.DEVICES_FROM_PREFIX + ".main"
    assert codec.container_of_key(keys.DEVICES_FROM_PREFIX + ".main") == "main"
    assert codec.container_of_key(keys.DEVICES_FROM_PREFIX) is None
    annotations = {
        keys.DEVICES_FROM_PREFIX: '{"_/owner/main": {"nvidia.com/gpu": ["GPU-1"]}}',
        keys.DEVICES_FROM_PREFIX + ".worker": '{"_/shadow/main": {"nvidia.com/gpu": ["GPU-2"]}}',
        keys.DEVICES_FROM_PREFIX + ".sidecar": '{"_/shadow/main": {"nvidia.com/gpu": ["GPU-3"]}}',
        "unrelated": "x",
    }
    merged = devices_from_for_container(annotations, "worker")
    assert merged is not None
    assert [s.key for s in merged.sources] == ["_/owner/main", "_/shadow/main"]
    side = devices_from_for_container(annotations, "sidecar")
    assert side is not None and side.sources[1].devices(GPU) == ("GPU-3",)
    assert devices_from_for_container({"unrelated": "x"}, "worker") is None


def test_targeting_rule_errors() -> None:
    with pytest.raises(InvalidAnnotationKey, match="'Main' is not a valid container name"):
        devices_from_for_container({keys.DEVICES_FROM_PREFIX + ".Main": "{}"}, "main")
    with pytest.raises(InvalidAnnotationKey, match="is 41 characters"):
        devices_from_key("c" * 41)
    assert devices_from_key("c" * 40).endswith("c" * 40)
    with pytest.raises(InvalidAnnotationKey, match=re.escape("is not 'platform.k8s.io/container-devices-from'")):
        codec.container_of_key("platform.k8s.io/container-devices-fromX")
    conflicting = {
        keys.DEVICES_FROM_PREFIX: '{"_/a/main": {"nvidia.com/gpu": ["GPU-1"]}}',
        keys.DEVICES_FROM_PREFIX + ".w": '{"_/b/main": {"nvidia.com/gpu": ["GPU-1"]}}',
    }
    with pytest.raises(ConflictingSources, match="claimed by two sources"):
        devices_from_for_container(conflicting, "w")
    with pytest.raises(
        InvalidJSON, match=re.escape("annotation 'platform.k8s.io/container-devices-from': annotation value")
    ):
        devices_from_for_container({keys.DEVICES_FROM_PREFIX: "nope"}, "w")
    same_key_different = {
        keys.DEVICES_FROM_PREFIX: '{"_/a/main": {"nvidia.com/gpu": ["GPU-1"]}}',
        keys.DEVICES_FROM_PREFIX + ".w": '{"_/a/main": {"nvidia.com/gpu": ["GPU-2"]}}',
    }
    with pytest.raises(ConflictingSources, match="given twice with different devices"):
        devices_from_for_container(same_key_different, "w")


def test_constructors_validate() -> None:
    with pytest.raises(InvalidSourceKey, match="ContainerSync source needs a ContainerRef"):
        SyncSource(SyncKind.CONTAINER, PodRef("a", "b"), ((ResourceName(GPU), ()),))
    with pytest.raises(EmptyAnnotation):
        DevicesFrom(())
    with pytest.raises(InvalidResource, match="unique and sorted"):
        SyncSource(SyncKind.POD, PodRef("a", "b"), ((ResourceName("z.io/x"), ()), (ResourceName("a.io/x"), ())))


# --- property tests ---------------------------------------------------------------------------

_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True)
_device = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,20}", fullmatch=True)
_resource = st.sampled_from([GPU, "amd.com/gpu", "rdma/hca", "platform/spot-gpu"])


@st.composite
def devices_from(draw: st.DrawFn) -> DevicesFrom:
    used: set[tuple[str, str]] = set()
    sources = {}
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(list(SyncKind)))
        ns = draw(st.one_of(st.none(), _label))
        ref = {
            SyncKind.CONTAINER: ContainerRef(ns, draw(_label), draw(_label)),
            SyncKind.POD: PodRef(ns, draw(_label)),
            SyncKind.DIRECT: None,
        }[kind]
        resources = []
        for name in sorted(draw(st.sets(_resource, min_size=1, max_size=3))):
            ids = [d for d in draw(st.lists(_device, max_size=4, unique=True)) if (name, d) not in used]
            if kind is SyncKind.DIRECT and not ids:
                ids = [f"direct-{len(used)}-{len(sources)}"]
            used.update((name, d) for d in ids)
            resources.append((ResourceName(name), tuple(DeviceID(d) for d in ids)))
        source = SyncSource(kind, ref, tuple(resources))
        sources.setdefault(source.key, source)
    return DevicesFrom.of(list(sources.values()))


@given(devices_from())
def test_round_trip_exact(value: DevicesFrom) -> None:
    text = format_devices_from(value)
    assert parse_devices_from(text) == value
    assert format_devices_from(parse_devices_from(text)) == text


@given(st.text(max_size=300))
def test_arbitrary_text_raises_only_codec_errors(text: str) -> None:
    with contextlib.suppress(DevicesFromError):
        parse_devices_from(text)


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=8)
    | st.sampled_from(["GPU-1", GPU, "a/b/c", "direct"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["a/b/c", "_/p", "direct", GPU, "x"]), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(_json)
def test_arbitrary_json_raises_only_codec_errors(value: object) -> None:
    with contextlib.suppress(DevicesFromError):
        parse_devices_from(json.dumps(value))
