"""Properties of the whole modifier chain over generated specs and annotations.

* Idempotent: running the chain on its own output with the same node changes nothing.
* Unrelated fields unchanged: outside ``process.env``, ``mounts``, ``linux.devices``,
  ``linux.resources.devices``, ``linux.resources.cpu.cpus``, ``linux.seccomp`` and our own
  annotations, the spec is exactly as it was.
* Arbitrary annotation text never crashes: any value (or key suffix) either works or raises a
  :class:`~spotgpu.core.errors.SpotgpuError` with a message; nothing else escapes.
"""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core import keys
from spotgpu.core.errors import SpotgpuError
from spotgpu.core.refs import ContainerRef
from spotgpu.runtime.modifiers.devices import CDI_ANNOTATION

from .fakes import BASE_SPEC, NS, OWNER, SHADOW, SPOT_CTR, SYSTEM_NS, FakeGuard, cri, engine, standard_lookup

OURS = {keys.SYNCED_DEVICES, keys.GUARDED, keys.GUARD_SKIPPED, CDI_ANNOTATION}

json_scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=12)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)

identities = st.sampled_from(
    [
        cri(SPOT_CTR),
        cri(OWNER),
        cri(SPOT_CTR, kind="sandbox"),
        cri(ContainerRef(NS, "web", "nginx")),
        cri(None),
        {},
    ]
)

source_keys = st.sampled_from(
    [
        "_/dev-box/main",
        "_/dev-box",
        f"{SYSTEM_NS}/{SHADOW.pod}/{SHADOW.name}",
        "direct",
        "other/x/y",
        "_/spot-job/worker",
    ]
)
resources = st.sampled_from(["nvidia.com/gpu", "platform/spot-gpu", "rdma.io/hca"])
device_ids = st.sampled_from(["GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-zz"])
valid_requests = st.dictionaries(
    source_keys,
    st.dictionaries(resources, st.lists(device_ids, max_size=3, unique=True), min_size=1, max_size=2),
    min_size=1,
    max_size=3,
).map(json.dumps)
env_requests = st.dictionaries(
    st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), st.text(max_size=10), max_size=4
).map(json.dumps)
any_text = st.text(max_size=80) | st.binary(max_size=40).map(lambda b: b.decode("latin-1"))

annotation_sets = st.fixed_dictionaries(
    {},
    optional={
        keys.DEVICES_FROM_PREFIX: valid_requests | any_text,
        keys.DEVICES_FROM_PREFIX + ".worker": valid_requests | any_text,
        keys.CONTAINER_ENV_PREFIX: env_requests | any_text,
        keys.CONTAINER_ENV_PREFIX + ".main": env_requests,
        keys.GUARD: st.sampled_from(["disabled", "enabled", ""]),
        keys.GUARDED: st.text(max_size=10),
        keys.SYNCED_DEVICES: st.text(max_size=10),
        "example.com/unrelated": st.text(max_size=10),
    },
)


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    spec = copy.deepcopy(BASE_SPEC)
    spec["annotations"] = {**draw(identities), **draw(annotation_sets)}
    spec["process"]["env"] += draw(
        st.lists(st.sampled_from(["NVIDIA_VISIBLE_DEVICES=all", "X=1", "X=2", "Y"]), max_size=3)
    )
    if draw(st.booleans()):
        spec["linux"]["resources"]["cpu"]["cpus"] = draw(st.sampled_from(["0", "2-3"]))
    if draw(st.booleans()):
        spec["linux"]["devices"] = [{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 3}]
    for key, value in draw(st.dictionaries(st.text(min_size=1, max_size=6), json_values, max_size=3)).items():
        if key not in spec:
            spec[key] = value
    spec["linux"]["x-extra"] = draw(json_values)
    spec["process"]["x-extra"] = draw(json_values)
    return spec


def run(spec: dict[str, Any], guard_up: bool) -> dict[str, Any] | None:
    try:
        new, _ = engine(standard_lookup(), guard=FakeGuard(ready=guard_up)).modify(spec)
    except SpotgpuError as exc:
        assert str(exc)
        return None
    return new


@given(specs(), st.booleans())
def test_the_chain_is_idempotent(spec: dict[str, Any], guard_up: bool) -> None:
    once = run(spec, guard_up)
    if once is not None:
        assert run(copy.deepcopy(once), guard_up) == once


def _strip(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` without the parts the chain may change."""
    out = copy.deepcopy(spec)
    out.pop("mounts", None)
    out.get("process", {}).pop("env", None)
    linux = out.get("linux", {})
    for key in ("devices", "seccomp"):
        linux.pop(key, None)
    resources = linux.get("resources", {})
    resources.pop("devices", None)
    resources.get("cpu", {}).pop("cpus", None)
    out["annotations"] = {
        k: v for k, v in out.get("annotations", {}).items() if k not in OURS and not k.startswith("cdi.k8s.io/")
    }
    return out


def _env_names_the_chain_may_set(spec: dict[str, Any]) -> set[str]:
    names = {"NVIDIA_VISIBLE_DEVICES"}
    for key, value in spec["annotations"].items():
        if key.startswith(keys.CONTAINER_ENV_PREFIX):
            with contextlib.suppress(ValueError, TypeError):
                names.update(json.loads(value))
    return names


def _name(entry: str) -> str:
    return entry.split("=", 1)[0]


@given(specs(), st.booleans())
def test_unrelated_fields_are_unchanged(spec: dict[str, Any], guard_up: bool) -> None:
    new = run(spec, guard_up)
    if new is not None:
        assert _strip(new) == _strip(spec)
        settable = _env_names_the_chain_may_set(spec)
        assert [e for e in new["process"]["env"] if _name(e) not in settable] == [
            e for e in spec["process"]["env"] if _name(e) not in settable
        ]
        old_mounts = [m for m in spec["mounts"] if m["destination"] != "/usr/local/nvidia"]
        assert [m for m in new["mounts"] if m["destination"] != "/usr/local/nvidia"] == old_mounts


@given(
    identities,
    st.text(max_size=40).map(lambda s: "." + s) | st.just(""),
    any_text,
    st.sampled_from([keys.DEVICES_FROM_PREFIX, keys.CONTAINER_ENV_PREFIX]),
)
def test_arbitrary_annotation_text_never_crashes(
    identity: dict[str, str], suffix: str, value: str, prefix: str
) -> None:
    spec = copy.deepcopy(BASE_SPEC)
    spec["annotations"] = {**identity, prefix + suffix: value}
    e = engine(standard_lookup(), guard=FakeGuard())
    try:
        e.modify(spec)
    except SpotgpuError as exc:
        assert str(exc)
    status, body = e.handle("id", "/bundle", json.dumps(spec).encode())
    assert status in {b"unchanged", b"modified", b"refused"}
    assert status != b"refused" or body


@given(st.binary(max_size=200))
def test_arbitrary_spec_bytes_get_an_answer(data: bytes) -> None:
    status, _body = engine().handle("id", "/bundle", data)
    assert status in {b"unchanged", b"modified", b"refused"}
