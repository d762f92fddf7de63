"""The one codec of ``spotgpu.io/assigned-devices`` (scheduler writes, agent, scheduler snapshot
and ``spotgpu status`` read): a round trip, strict refusals, lenient views that never raise."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core.codec import AssignmentError, format_assigned_devices, parse_assigned_devices

IDS = st.lists(st.text(min_size=1, max_size=20), max_size=6)


@given(st.text(min_size=1, max_size=30), IDS)
def test_what_the_scheduler_writes_reads_back_the_same(resource: str, devices: list[str]) -> None:
    assert parse_assigned_devices(format_assigned_devices(resource, devices)) == {resource: devices}
    assert parse_assigned_devices(format_assigned_devices(resource, devices), strict=False) == {resource: devices}


@pytest.mark.parametrize("raw", ["", "not json", "[]", '{"a": "GPU-1"}', '{"a": 1}', "null"])
def test_strict_refuses_what_is_not_a_map_of_lists(raw: str) -> None:
    with pytest.raises(AssignmentError):
        parse_assigned_devices(raw)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c) | st.dictionaries(st.text(max_size=5), c),
        max_leaves=10,
    )
)
def test_lenient_never_raises_and_keeps_only_string_ids(value: object) -> None:
    parsed = parse_assigned_devices(json.dumps(value), strict=False)
    assert all(isinstance(i, str) for ids in parsed.values() for i in ids)
    assert parse_assigned_devices("{oops", strict=False) == {}
