"""Device IDs, twin IDs and resource names: every rule has a row with its error type and message."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core.ids import (
    DeviceIDError,
    NotASpotID,
    ResourceNameError,
    TwinIDTooLong,
    from_spot_id,
    is_spot_id,
    real_of_twin,
    replica_id,
    to_spot_id,
    validate_device_id,
    validate_resource_name,
)

UUID = "GPU-2b5b3c1e-8f2a-4c7e-9d1a-0123456789ab"


@pytest.mark.parametrize(
    "value",
    [UUID, "GPU-0", "0", "MIG-2b5b3c1e-8f2a-4c7e-9d1a-0123456789ab", f"{UUID}::3", "a" * 63, "dev_1.x"],
)
def test_valid_device_ids(value: str) -> None:
    assert validate_device_id(value) == value


@pytest.mark.parametrize(
    ("value", "error", "fragment"),
    [
        ("", DeviceIDError, "must not be empty"),
        ("a" * 64, DeviceIDError, "64 characters; the kubelet allows at most 63"),
        ("GPU 1", DeviceIDError, "character ' ' at position 3"),
        ("GPU/1", DeviceIDError, "character '/' at position 3"),
        ("-GPU", DeviceIDError, "first character must be a letter or digit"),
        ("GPU-é", DeviceIDError, "character 'é'"),
        (7, DeviceIDError, "must be a string, got int"),
        (None, DeviceIDError, "must be a string, got NoneType"),
    ],
)
def test_invalid_device_ids(value: object, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error) as info:
        validate_device_id(value)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_twin_round_trip() -> None:
    assert to_spot_id(UUID) == "spot-" + UUID
    assert from_spot_id("spot-" + UUID) == UUID
    assert is_spot_id("spot-x") and not is_spot_id("spot-") and not is_spot_id(UUID)


def test_twin_of_a_58_character_id_fits_and_59_is_refused_not_truncated() -> None:
    assert len(to_spot_id("a" * 58)) == 63
    with pytest.raises(TwinIDTooLong) as info:
        to_spot_id("a" * 59)
    assert "would be 64 characters" in str(info.value)
    assert "longer than 58 characters cannot be lent" in str(info.value)


def test_twin_errors() -> None:
    with pytest.raises(NotASpotID, match="must start with 'spot-'"):
        from_spot_id(UUID)
    with pytest.raises(DeviceIDError, match="already a twin ID"):
        to_spot_id("spot-" + UUID)
    with pytest.raises(NotASpotID, match="names no real device"):
        from_spot_id("spot-")


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,57}", fullmatch=True))
def test_twin_conversion_is_a_bijection(real: str) -> None:
    if is_spot_id(real):
        return
    assert from_spot_id(to_spot_id(real)) == real


@pytest.mark.parametrize("value", ["nvidia.com/gpu", "platform/spot-gpu", "amd.com/gpu", "huawei.com/Ascend910"])
def test_valid_resource_names(value: str) -> None:
    assert validate_resource_name(value) == value


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("gpu", "must have a domain prefix"),
        ("kubernetes.io/gpu", "kubernetes.io domain, which is reserved"),
        ("node.kubernetes.io/gpu", "kubernetes.io domain"),
        ("requests.nvidia.com/gpu", "must not start with 'requests.'"),
        ("Nvidia.com/gpu", "not a lowercase DNS subdomain"),
        ("nvidia.com/", "name part ''"),
        ("nvidia.com/-gpu", "name part '-gpu'"),
        ("nvidia.com/" + "g" * 64, "1-63 characters"),
        (3, "must be a string"),
    ],
)
def test_invalid_resource_names(value: object, fragment: str) -> None:
    with pytest.raises(ResourceNameError) as info:
        validate_resource_name(value)
    assert fragment in str(info.value)


# --- the one twin <-> real parser (issue 12, item 2) ------------------------------------------------

_BASES = st.sampled_from(["GPU-a", "GPU-a::0", "GPU-a::1", "GPU-a::1::0", "GPU-b", "GPU-b::10", "MIG-x::2"])
_KNOWN = st.frozensets(_BASES, min_size=1)


@pytest.mark.parametrize(
    ("twin", "known", "real"),
    [
        ("spot-GPU-a", {"GPU-a"}, "GPU-a"),
        ("spot-GPU-a::0", {"GPU-a"}, "GPU-a"),  # shared replica 0 of GPU-a
        ("spot-GPU-a::0", {"GPU-a", "GPU-a::0"}, "GPU-a::0"),  # the real GPU-a::0 owns its twin name
        ("spot-GPU-a::0", {"GPU-a::0", "GPU-a::1"}, "GPU-a::0"),  # never GPU-a::1 (the defect)
        ("spot-GPU-a::1::3", {"GPU-a::1"}, "GPU-a::1"),  # a replica of a vendor replica: last "::"
        ("spot-GPU-a::x", {"GPU-a"}, None),
        ("spot-GPU-a::", {"GPU-a"}, None),
        ("GPU-a", {"GPU-a"}, None),
        ("spot-GPU-c", {"GPU-a"}, None),
    ],
)
def test_real_of_twin(twin: str, known: set[str], real: str | None) -> None:
    assert real_of_twin(twin, known) == real


@given(_KNOWN, st.integers(min_value=0, max_value=12))
def test_every_served_name_parses_back_to_its_own_device(known: frozenset[str], replicas: int) -> None:
    """Whatever IDs a node's GPUs have (``::`` in them or not), each name the agent may serve (the
    exclusive twin, each replica that :func:`replica_id` accepts) parses back to exactly its own
    device, so no twin can stand for two devices and no reader can disagree with another."""
    served: dict[str, str] = {}
    for real in known:
        names = [to_spot_id(real)]
        for k in range(replicas):
            try:
                names.append(replica_id(real, k, known))
            except DeviceIDError:
                continue
        for name in names:
            assert real_of_twin(name, known) == real
            assert served.setdefault(name, real) == real


@given(_KNOWN, _BASES, st.integers(min_value=0, max_value=12))
def test_a_twin_never_stands_for_a_device_it_does_not_name(known: frozenset[str], other: str, k: int) -> None:
    twin = f"spot-{other}::{k}"
    real = real_of_twin(twin, known)
    assert real is None or real in known
    assert real is None or twin in (to_spot_id(real), f"{to_spot_id(real)}::{k}")
