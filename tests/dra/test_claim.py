"""The claim parser on hostile input (Hypothesis): it keeps what it checked or raises ClaimError."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from tests.dra.helpers import DRIVER, claim

from spotgpu.dra.claim import ClaimError, parse_claim

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=80),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
PATHS = [
    ("metadata",),
    ("metadata", "uid"),
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("status",),
    ("status", "allocation"),
    ("status", "allocation", "devices"),
    ("status", "allocation", "devices", "results"),
    ("status", "allocation", "devices", "results", 0),
    ("status", "allocation", "devices", "results", 0, "device"),
    ("status", "allocation", "devices", "results", 0, "pool"),
    ("status", "allocation", "devices", "results", 0, "driver"),
    ("status", "allocation", "devices", "results", 0, "request"),
    ("status", "allocation", "devices", "results", 0, "adminAccess"),
    ("status", "reservedFor"),
    ("status", "reservedFor", 0),
    ("status", "reservedFor", 0, "uid"),
]


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        obj = obj[part]
    obj[path[-1]] = value


@given(st.sampled_from(PATHS), json_values)
def test_any_field_replaced_by_anything_parses_or_is_refused(path: tuple[Any, ...], value: Any) -> None:
    obj = copy.deepcopy(claim())
    _set(obj, path, value)
    try:
        parsed = parse_claim(obj, DRIVER)
    except ClaimError:
        return
    for d in parsed.devices:  # whatever is kept is well-formed
        assert d.device and d.device == d.device.lower() and len(d.device) <= 63
        assert "/" not in d.request
        assert isinstance(d.admin_access, bool)
    assert all(isinstance(c.uid, str) and c.uid for c in parsed.reserved_for)


@given(json_values)
def test_anything_at_the_top_parses_or_is_refused(value: Any) -> None:
    with contextlib.suppress(ClaimError):
        parse_claim(value, DRIVER)


@given(
    st.lists(st.sampled_from(["spot-gpu-0aa", "spot-gpu-1bb", "x"]), max_size=5), st.sampled_from(["gpu", "gpu/sub"])
)
def test_only_our_drivers_results_are_kept_with_base_requests(devices: list[str], request: str) -> None:
    obj = claim(devices)
    results = obj["status"]["allocation"]["devices"]["results"]
    for r in results:
        r["request"] = request
    results.append({"request": "net", "driver": "net.example.com", "pool": "p", "device": "nic0"})
    parsed = parse_claim(obj, DRIVER)
    assert [d.device for d in parsed.devices] == devices
    assert {d.request for d in parsed.devices} <= {"gpu"}
    assert parsed.other_drivers == 1


def test_too_many_results_are_refused() -> None:
    try:
        parse_claim(claim(["spot-gpu-0aa"] * 33), DRIVER)
    except ClaimError as exc:
        assert "at most 32" in str(exc)
    else:
        raise AssertionError("33 results parsed")
