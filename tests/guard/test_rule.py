"""The guard's rule and its composition into OCI specs (pure; runc behaviour is proven in
test_rule_runc.py). Table tests for the profiles we meet, property tests for the exactness of
the complement and of the overlap analysis."""

from __future__ import annotations

import copy
import json
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core import keys
from spotgpu.core.refs import ContainerRef
from spotgpu.guard import rule
from spotgpu.guard.rule import (
    GUARD_MATCH,
    GuardRuleConflict,
    GuardRuleError,
    IoctlMatch,
    apply_guard_rule,
    compose_seccomp,
    guarded_owner,
    listener_ready,
    parse_listener_metadata,
)
from spotgpu.testing.guard_testbed import runtime_default_like

OWNER = ContainerRef("team-a", "dev-0", "main")
LISTENER = "/run/spotgpu/guard.sock"
U64 = (1 << 64) - 1


def spec_with(seccomp: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"ociVersion": "1.0.2", "process": {"args": ["sh"]}, "linux": {"namespaces": []}}
    if seccomp is not None:
        spec["linux"]["seccomp"] = seccomp
    return spec


def notify_entries(profile: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in profile["syscalls"] if e["action"] == "SCMP_ACT_NOTIFY"]


def evaluate_ioctl(profile: dict[str, Any], request: int) -> str:
    """What libseccomp (as measured with runc 1.1.5) does with ``ioctl(request)`` under ``profile``:
    unconditional rules win, then conditional ones (ours never overlap), then the default."""
    default = profile["defaultAction"]
    unconditional = [e["action"] for e in profile["syscalls"] if "ioctl" in e["names"] and not e.get("args")]
    unconditional = [a for a in unconditional if a != default]
    if unconditional:
        return unconditional[0]
    hits = set()
    for entry in profile["syscalls"]:
        if "ioctl" not in entry["names"] or not entry.get("args") or entry["action"] == default:
            continue
        for rule_ in rule._rules(0, entry):
            if all(_holds(c, request) for c in rule_):
                hits.add(entry["action"])
    assert len(hits) <= 1, f"overlapping conditional rules {hits} for {request:#x}"
    return hits.pop() if hits else default


def _holds(cond: tuple[int, str, int, int], request: int) -> bool:
    index, op, value, value_two = cond
    assert index == 1
    return {
        "SCMP_CMP_EQ": request == value,
        "SCMP_CMP_NE": request != value,
        "SCMP_CMP_LT": request < value,
        "SCMP_CMP_LE": request <= value,
        "SCMP_CMP_GT": request > value,
        "SCMP_CMP_GE": request >= value,
        "SCMP_CMP_MASKED_EQ": (request & value) == value_two,
    }[op]


# --- the match ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "matched"),
    [
        (0xC048_46D2, True),  # _IOWR('F', 210, nv_ioctl_rm_api_version_t)
        (0xFFFF_FFFF_C048_46D2, True),  # the same, sign-extended by a caller
        (0xC000_46D2, True),  # any size
        (0x8048_46D2, False),  # read-only direction: not NVIDIA's encoding
        (0x0000_46D2, False),  # an un-encoded framebuffer-style 'F' request
        (0x4600, False),  # FBIOGET_VSCREENINFO
        (0xC020_462A, False),  # RM_CONTROL
        (0xC030_462B, False),  # RM_ALLOC
        (0x3000_0001, False),  # UVM_INITIALIZE
        (0xC048_47D2, False),  # another type byte
    ],
)
def test_the_match_selects_only_the_version_check(request_: int, matched: bool) -> None:
    assert GUARD_MATCH.matches(request_) is matched


def test_match_values_must_lie_in_the_mask() -> None:
    with pytest.raises(ValueError, match="within mask"):
        IoctlMatch("bad", mask=0xFF, value=0x100)


@given(st.integers(min_value=0, max_value=U64))
def test_complement_covers_exactly_what_the_match_does_not(request_: int) -> None:
    in_complement = any((request_ & bit) == datum for bit, datum in GUARD_MATCH.complement_bits)
    assert in_complement is not GUARD_MATCH.matches(request_)


# --- composition ----------------------------------------------------------------------------


def test_unconfined_spec_gets_an_allow_default_profile() -> None:
    spec = spec_with(None)
    apply_guard_rule(spec, listener_path=LISTENER, owner=OWNER)
    profile = spec["linux"]["seccomp"]
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert profile["listenerPath"] == LISTENER
    assert profile["listenerMetadata"] == f"{keys.GUARD_METADATA_OWNER}=team-a/dev-0/main"
    assert notify_entries(profile) == [
        {
            "names": ["ioctl"],
            "action": "SCMP_ACT_NOTIFY",
            "args": [{"index": 1, "op": "SCMP_CMP_MASKED_EQ", "value": 0xC000FFFF, "valueTwo": 0xC00046D2}],
        }
    ]
    assert len(profile["syscalls"]) == 1
    assert spec["annotations"][keys.GUARDED] == "team-a/dev-0/main"
    assert guarded_owner(spec) == OWNER


def test_runtime_default_profile_is_rewritten_exactly() -> None:
    original = runtime_default_like()
    spec = spec_with(copy.deepcopy(original))
    apply_guard_rule(spec, listener_path=LISTENER, owner=OWNER)
    profile = spec["linux"]["seccomp"]
    assert "ioctl" not in profile["syscalls"][0]["names"]
    assert set(profile["syscalls"][0]["names"]) == set(original["syscalls"][0]["names"]) - {"ioctl"}
    assert profile["syscalls"][1:3] == original["syscalls"][1:3]
    complement = profile["syscalls"][-1]
    assert complement["action"] == "SCMP_ACT_ALLOW" and len(complement["args"]) == 18
    for request_ in (0xC048_46D2, 0xC020_462A, 0x5401, 0x3000_0001, 0xFFFF_FFFF_C048_46D2):
        expected = "SCMP_ACT_NOTIFY" if GUARD_MATCH.matches(request_) else "SCMP_ACT_ALLOW"
        assert evaluate_ioctl(profile, request_) == expected, hex(request_)


@given(st.integers(min_value=0, max_value=U64))
def test_composed_runtime_default_keeps_every_other_ioctl_allowed(request_: int) -> None:
    profile = compose_seccomp(runtime_default_like(), listener_path=LISTENER, metadata="m")
    expected = "SCMP_ACT_NOTIFY" if GUARD_MATCH.matches(request_) else "SCMP_ACT_ALLOW"
    assert evaluate_ioctl(profile, request_) == expected


@pytest.mark.parametrize(
    ("profile", "expect_complement"),
    [
        ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}, False),
        ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["ioctl"], "action": "SCMP_ACT_ALLOW"}]}, False),
        ({"defaultAction": "SCMP_ACT_LOG"}, False),
        (
            {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["ioctl", "read"], "action": "SCMP_ACT_LOG"}]},
            True,
        ),
        (  # a disjoint conditional ioctl rule (deny TIOCSTI) stays as it is
            {
                "defaultAction": "SCMP_ACT_ALLOW",
                "syscalls": [
                    {
                        "names": ["ioctl"],
                        "action": "SCMP_ACT_ERRNO",
                        "args": [{"index": 1, "op": "SCMP_CMP_EQ", "value": 0x5412}],
                    }
                ],
            },
            False,
        ),
    ],
    ids=["allow-default", "allow-default-redundant-ioctl", "log-default", "errno-default-log-ioctl", "tiocsti-deny"],
)
def test_profiles_the_rule_composes_with(profile: dict[str, Any], expect_complement: bool) -> None:
    composed = compose_seccomp(profile, listener_path=LISTENER, metadata="m")
    assert len(notify_entries(composed)) == 1
    has_complement = any(len(e.get("args", [])) == 18 for e in composed["syscalls"])
    assert has_complement is expect_complement
    for request_ in (0xC048_46D2, 0xC020_462A, 0x5401):
        got = evaluate_ioctl(composed, request_)
        if GUARD_MATCH.matches(request_):
            assert got == "SCMP_ACT_NOTIFY"
        else:
            assert got == evaluate_ioctl(
                {"defaultAction": profile["defaultAction"], "syscalls": profile.get("syscalls", [])}, request_
            )


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/other.sock"}, "already has a seccomp listener"),
        (
            {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["openat"], "action": "SCMP_ACT_NOTIFY"}]},
            "already uses SCMP_ACT_NOTIFY",
        ),
        (
            {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]},
            "widening",
        ),
        (
            {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["ioctl"], "action": "SCMP_ACT_ERRNO"}]},
            "widening",
        ),
        (
            {
                "defaultAction": "SCMP_ACT_ERRNO",
                "syscalls": [
                    {
                        "names": ["ioctl"],
                        "action": "SCMP_ACT_ALLOW",
                        "args": [{"index": 1, "op": "SCMP_CMP_MASKED_EQ", "value": 0xFF00, "valueTwo": 0x4600}],
                    }
                ],
            },
            "may overlap",
        ),
        (
            {
                "defaultAction": "SCMP_ACT_ERRNO",
                "syscalls": [
                    {"names": ["ioctl"], "action": "SCMP_ACT_ALLOW"},
                    {"names": ["ioctl"], "action": "SCMP_ACT_LOG"},
                ],
            },
            "several unconditional actions",
        ),
    ],
    ids=["listener", "notify-rule", "ioctl-denied", "ioctl-errno", "overlapping-conditional", "two-actions"],
)
def test_conflicting_profiles_are_refused_and_left_unchanged(profile: dict[str, Any], message: str) -> None:
    spec = spec_with(profile)
    before = json.dumps(spec, sort_keys=True)
    with pytest.raises(GuardRuleConflict, match=message):
        apply_guard_rule(spec, listener_path=LISTENER, owner=OWNER)
    assert json.dumps(spec, sort_keys=True) == before


@pytest.mark.parametrize(
    ("spec", "kwargs", "message"),
    [
        ({"linux": {"seccomp": "x"}}, {}, "expected an object"),
        ({"linux": {"seccomp": {"defaultAction": "SCMP_ACT_NOTIFY"}}}, {}, "not a valid default action"),
        ({"linux": {"seccomp": {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": []}]}}}, {}, "names"),
        (
            {
                "linux": {
                    "seccomp": {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["ioctl"], "action": "X"}]}
                }
            },
            {},
            "not a seccomp action",
        ),
        (
            {
                "linux": {
                    "seccomp": {
                        "defaultAction": "SCMP_ACT_ALLOW",
                        "syscalls": [
                            {
                                "names": ["ioctl"],
                                "action": "SCMP_ACT_ERRNO",
                                "args": [{"index": 9, "op": "SCMP_CMP_EQ"}],
                            }
                        ],
                    }
                }
            },
            {},
            "index",
        ),
        ({"linux": []}, {}, "linux: expected an object"),
        ({}, {"listener_path": "relative.sock"}, "absolute"),
        ({}, {"owner": ContainerRef(None, "p", "c")}, "namespace"),
    ],
    ids=[
        "seccomp-string",
        "notify-default",
        "empty-names",
        "bad-action",
        "bad-index",
        "linux-list",
        "relative",
        "owner",
    ],
)
def test_malformed_input_is_a_clear_error_and_changes_nothing(
    spec: dict[str, Any], kwargs: dict[str, Any], message: str
) -> None:
    before = json.dumps(spec, sort_keys=True)
    args: dict[str, Any] = {"listener_path": LISTENER, "owner": OWNER, **kwargs}
    with pytest.raises(GuardRuleError, match=message):
        apply_guard_rule(spec, **args)
    assert json.dumps(spec, sort_keys=True) == before


def test_apply_is_idempotent_and_refuses_a_second_owner() -> None:
    spec = spec_with(runtime_default_like())
    apply_guard_rule(spec, listener_path=LISTENER, owner=OWNER)
    once = json.dumps(spec, sort_keys=True)
    apply_guard_rule(spec, listener_path=LISTENER, owner=OWNER)
    assert json.dumps(spec, sort_keys=True) == once
    with pytest.raises(GuardRuleConflict, match="already set for team-a/dev-0/main"):
        apply_guard_rule(spec, listener_path=LISTENER, owner=ContainerRef("team-a", "dev-0", "other"))
    assert json.dumps(spec, sort_keys=True) == once


# --- overlap analysis -----------------------------------------------------------------------

OPS = ["SCMP_CMP_EQ", "SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE", "SCMP_CMP_GT", "SCMP_CMP_GE", "SCMP_CMP_MASKED_EQ"]
u64 = st.integers(min_value=0, max_value=U64)


@given(st.sampled_from(OPS), u64, u64, st.integers(min_value=0, max_value=U64))
def test_disjoint_is_never_claimed_for_an_overlapping_condition(
    op: str, value: int, value_two: int, noise: int
) -> None:
    """If the analysis calls a condition disjoint, no request the match selects satisfies it
    (sampled: the match's extreme values and a random one)."""
    condition = (1, op, value, value_two)
    if not rule._disjoint(condition, GUARD_MATCH):
        return
    lowest = GUARD_MATCH.value
    highest = GUARD_MATCH.value | (~GUARD_MATCH.mask & U64)
    random_match = (noise & ~GUARD_MATCH.mask & U64) | GUARD_MATCH.value
    for request_ in (lowest, highest, random_match, value if GUARD_MATCH.matches(value) else lowest):
        assert not _holds(condition, request_), (op, hex(value), hex(value_two), hex(request_))


def test_metadata_round_trip_and_errors() -> None:
    assert parse_listener_metadata(rule.format_listener_metadata(OWNER)) == OWNER
    assert parse_listener_metadata("other=1 " + rule.format_listener_metadata(OWNER)) == OWNER
    assert parse_listener_metadata("") is None and parse_listener_metadata(None) is None
    with pytest.raises(GuardRuleError, match="listenerMetadata"):
        parse_listener_metadata(f"{keys.GUARD_METADATA_OWNER}=not-a-ref")
    with pytest.raises(GuardRuleError, match="namespace"):
        parse_listener_metadata(f"{keys.GUARD_METADATA_OWNER}=_/p/c")


def test_listener_ready_needs_an_accepting_socket() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        path = Path(d) / "l.sock"
        assert not listener_ready(str(path))
        path.write_text("")
        assert not listener_ready(str(path))  # not a socket
        path.unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        assert not listener_ready(str(path))  # bound but not listening: refused
        server.listen(1)
        assert listener_ready(str(path))
        server.close()
        assert not listener_ready(str(path))
