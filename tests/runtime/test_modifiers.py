"""Each modifier's behaviour through the engine, on the fakes of :mod:`fakes`.

Devices (merge of envs, mounts, device nodes, cgroup rules, annotations, CDI names, the
synced-devices record), ReplaceMounts, Generic, CPUSet and GuardRule; the real guard rule
composition (:func:`spotgpu.guard.rule.apply_guard_rule`) with a listener that is up or not.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from spotgpu.core import keys
from spotgpu.core.codec import DevicesFromError
from spotgpu.core.errors import TemporaryError
from spotgpu.core.mapping_cache import IDLE_SPACE
from spotgpu.core.refs import ContainerRef
from spotgpu.nri.adjust import NotExpressible
from spotgpu.ports.lookup import MountSpec
from spotgpu.runtime.modifiers.devices import CDI_ANNOTATION, AllocationError
from spotgpu.runtime.modifiers.generic import GenericEnvError
from spotgpu.runtime.spec import SpecError
from spotgpu.runtime.sync import RefusalReason, SyncRefused

from .fakes import (
    GPU,
    MODE,
    NS,
    OWNER,
    SPOT,
    SPOT_CTR,
    FakeGuard,
    cri,
    engine,
    make_spec,
    pod,
    spot_spec,
    standard_lookup,
)

FROM_OWNER = {"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}

pytestmark = pytest.mark.usefixtures("runtime_mode")  # every decision also as NRI mode makes it


def modified(spec: dict[str, Any], **kw: Any) -> dict[str, Any]:
    new, _ = engine(**kw).modify(spec)
    return new


# --- Devices -----------------------------------------------------------------------------------


def test_devices_merges_what_the_source_plugin_allocates() -> None:
    lookup = standard_lookup()
    spec = spot_spec(FROM_OWNER)
    new = modified(spec, lookup=lookup)
    assert "NVIDIA_VISIBLE_DEVICES=GPU-a" in new["process"]["env"]
    assert new["process"]["env"][:2] == spec["process"]["env"][:2]
    assert new["linux"]["devices"] == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666, "uid": 0, "gid": 0}
    ]
    assert new["linux"]["resources"]["devices"] == [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rw"},
    ]
    assert {
        "destination": "/usr/local/nvidia",
        "type": "bind",
        "source": "/opt/driver",
        "options": ["rbind", "rprivate", "ro"],
    } in new["mounts"]
    assert json.loads(new["annotations"][keys.SYNCED_DEVICES]) == {"nvidia.com/gpu": ["GPU-a"]}
    assert ("allocate", (GPU, ("GPU-a",))) in lookup.calls


def test_devices_keeps_the_requested_order_for_the_plugin() -> None:
    lookup = standard_lookup()
    lookup.pods[2] = pod(SPOT_CTR, (SPOT, ["spot-GPU-a", "spot-GPU-b"]))
    new = modified(spot_spec({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-b", "GPU-a"]}}), lookup=lookup)
    assert "NVIDIA_VISIBLE_DEVICES=GPU-b,GPU-a" in new["process"]["env"]
    assert [d["path"] for d in new["linux"]["devices"]] == ["/dev/nvidia1", "/dev/nvidia0"]


def test_devices_replaces_an_existing_env_and_device_node_in_place() -> None:
    spec = spot_spec(FROM_OWNER)
    spec["process"]["env"].insert(0, "NVIDIA_VISIBLE_DEVICES=void")
    spec["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=all")
    spec["linux"]["devices"] = [
        {"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 3},
        {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229},
    ]
    new = modified(spec)
    assert (
        "NVIDIA_VISIBLE_DEVICES=GPU-a" in new["process"]["env"]
    )  # the spot container's own were neutralized, then set
    assert sum(e.startswith("NVIDIA_VISIBLE_DEVICES=") for e in new["process"]["env"]) == 1
    assert sorted((d["path"], d["major"]) for d in new["linux"]["devices"]) == [
        ("/dev/fuse", 10),
        ("/dev/nvidia0", 195),
    ]


def test_devices_merges_plugin_annotations_and_cdi_names_but_never_protected_keys() -> None:
    lookup = standard_lookup()
    lookup.cdi = True
    lookup.annotations = {
        "cdi.k8s.io/nvidia-device-plugin_GPU-a": "nvidia.com/gpu=GPU-a",
        keys.CRI_CONTAINER_NAME: "hijack",
        keys.GUARDED: "team-a/x/y",
        keys.SYNCED_DEVICES: "{}",
    }
    new = modified(spot_spec(FROM_OWNER), lookup=lookup)
    annotations = new["annotations"]
    assert annotations["cdi.k8s.io/nvidia-device-plugin_GPU-a"] == "nvidia.com/gpu=GPU-a"
    assert annotations[CDI_ANNOTATION] == "nvidia.com/gpu=GPU-a"
    assert annotations[keys.CRI_CONTAINER_NAME] == "worker"
    assert keys.GUARDED not in annotations
    assert json.loads(annotations[keys.SYNCED_DEVICES]) == {"nvidia.com/gpu": ["GPU-a"]}


def test_a_synced_devices_annotation_without_a_request_is_removed() -> None:
    """A user cannot pretend a sync happened through a pod-annotation allow-list."""
    spec = make_spec({**cri(SPOT_CTR), keys.SYNCED_DEVICES: '{"nvidia.com/gpu":["GPU-b"]}'})
    assert keys.SYNCED_DEVICES not in modified(spec)["annotations"]


@pytest.mark.parametrize(
    ("annotations", "error"),
    [
        pytest.param(
            {keys.DEVICES_FROM_PREFIX: '{"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}'}, SyncRefused, id="no-cri"
        ),
        pytest.param({**cri(SPOT_CTR), keys.DEVICES_FROM_PREFIX: "{not json"}, DevicesFromError, id="bad-json"),
        pytest.param({**cri(SPOT_CTR), keys.DEVICES_FROM_PREFIX: "x" * 40000}, DevicesFromError, id="oversized"),
        pytest.param(
            {**cri(SPOT_CTR), keys.DEVICES_FROM_PREFIX + ".Bad_Name": "{}"}, DevicesFromError, id="bad-suffix"
        ),
    ],
)
def test_devices_refuses_bad_requests(annotations: dict[str, str], error: type[Exception]) -> None:
    with pytest.raises(error):
        engine().modify(make_spec(annotations))


def test_a_suffixed_request_applies_to_its_container_only() -> None:
    key = keys.DEVICES_FROM_PREFIX + ".worker"
    value = json.dumps(FROM_OWNER)
    spot = make_spec({**cri(SPOT_CTR), key: value})
    sidecar = make_spec({**cri(ContainerRef(NS, "spot-job", "sidecar")), key: value})
    assert "NVIDIA_VISIBLE_DEVICES=GPU-a" in modified(spot)["process"]["env"]
    assert modified(sidecar) == sidecar


def test_sandboxes_get_no_sync_and_lose_only_what_we_alone_may_write() -> None:
    spec = make_spec({**cri(SPOT_CTR, kind="sandbox"), keys.DEVICES_FROM_PREFIX: json.dumps(FROM_OWNER)})
    assert modified(spec) == spec
    forged = make_spec({**spec["annotations"], keys.GUARDED: "x"})
    assert modified(forged) == spec


def test_conflicting_mounts_from_two_plugins_are_refused() -> None:
    lookup = standard_lookup()
    lookup.mounts = (MountSpec("/usr/local/nvidia", "/opt/a", True), MountSpec("/usr/local/nvidia/", "/opt/b", True))
    with pytest.raises(AllocationError, match="two synced mounts"):
        engine(lookup).modify(spot_spec(FROM_OWNER))


def test_malformed_spec_shapes_are_refused_with_the_key() -> None:
    spec = spot_spec(FROM_OWNER)
    spec["linux"] = 3
    with pytest.raises(SpecError, match="linux must be an object"):
        engine().modify(spec)


# --- ReplaceMounts -----------------------------------------------------------------------------


def test_synced_mounts_replace_the_images_mount_at_the_same_destination() -> None:
    spec = spot_spec(FROM_OWNER)
    spec["mounts"].append({"destination": "/usr/local/nvidia/", "type": "bind", "source": "/other", "options": []})
    mounts = modified(spec)["mounts"]
    at = [m for m in mounts if m["destination"].rstrip("/") == "/usr/local/nvidia"]
    assert at == [
        {
            "destination": "/usr/local/nvidia",
            "type": "bind",
            "source": "/opt/driver",
            "options": ["rbind", "rprivate", "ro"],
        }
    ]
    assert {m["destination"] for m in mounts} == {"/proc", "/dev", "/usr/local/nvidia"}  # NRI sorts them by depth


def test_without_replace_mounts_the_images_mount_stays() -> None:
    if MODE.value == "nri":  # an NRI mount replaces the one at its destination: two cannot be expressed
        with pytest.raises(NotExpressible, match="mounts"):
            modified(spot_spec(FROM_OWNER), modifiers=("devices",))
        return
    new = modified(spot_spec(FROM_OWNER), modifiers=("devices",))
    assert sorted(m["source"] for m in new["mounts"] if m["destination"] == "/usr/local/nvidia") == [
        "/opt/driver",
        "/var/lib/image-driver",
    ]


# --- Generic ------------------------------------------------------------------------------------


def test_generic_env_unsuffixed_and_for_this_container() -> None:
    spec = make_spec(
        {
            **cri(SPOT_CTR),
            keys.CONTAINER_ENV_PREFIX: '{"A": "1", "HOSTNAME": "renamed"}',
            keys.CONTAINER_ENV_PREFIX + ".worker": '{"B": "2"}',
            keys.CONTAINER_ENV_PREFIX + ".sidecar": '{"C": "3"}',
        }
    )
    env = modified(spec)["process"]["env"]
    assert env[1:] == ["HOSTNAME=renamed", "A=1", "B=2"]


@pytest.mark.parametrize(
    ("annotations", "text"),
    [
        pytest.param({keys.CONTAINER_ENV_PREFIX: '["A"]'}, "must be a JSON object", id="not-object"),
        pytest.param({keys.CONTAINER_ENV_PREFIX: '{"A": 1}'}, "must be a string", id="not-string"),
        pytest.param({keys.CONTAINER_ENV_PREFIX: '{"A": "1", "A": "2"}'}, "duplicate JSON key", id="dup"),
        pytest.param({keys.CONTAINER_ENV_PREFIX: '{"1A": "x"}'}, "not an environment variable name", id="bad-name"),
        pytest.param({keys.CONTAINER_ENV_PREFIX: '{"NVIDIA_VISIBLE_DEVICES": "all"}'}, "selects devices", id="denied"),
        pytest.param(
            {keys.CONTAINER_ENV_PREFIX: '{"A": "1"}', keys.CONTAINER_ENV_PREFIX + ".worker": '{"A": "2"}'},
            "different values",
            id="conflict",
        ),
        pytest.param(
            {keys.CONTAINER_ENV_PREFIX: json.dumps({f"V{i}": "x" for i in range(300)})}, "at most 256", id="too-many"
        ),
        pytest.param({keys.CONTAINER_ENV_PREFIX: "{"}, "not valid JSON", id="json"),
    ],
)
def test_generic_refuses_bad_annotations(annotations: dict[str, str], text: str) -> None:
    with pytest.raises(GenericEnvError, match=text):
        engine().modify(make_spec({**cri(SPOT_CTR), **annotations}))


def test_generic_may_not_override_what_the_sync_set() -> None:
    spec = spot_spec(FROM_OWNER)
    spec["annotations"][keys.CONTAINER_ENV_PREFIX] = '{"NVIDIA_VISIBLE_DEVICES": "GPU-b"}'
    with pytest.raises(GenericEnvError):
        engine(denied_env=()).modify(spec)


# --- CPUSet -------------------------------------------------------------------------------------


def test_cpuset_pins_to_the_synced_gpus_numa_node() -> None:
    assert modified(spot_spec(FROM_OWNER))["linux"]["resources"]["cpu"]["cpus"] == "0-7"


def test_cpuset_spans_every_numa_node_of_the_synced_gpus() -> None:
    lookup = standard_lookup()
    lookup.pods[2] = pod(SPOT_CTR, (SPOT, ["spot-GPU-a", "spot-GPU-b"]))
    new = modified(spot_spec({"_/dev-box": {"nvidia.com/gpu": []}}), lookup=lookup)
    assert new["linux"]["resources"]["cpu"]["cpus"] == "0-7,8-15"


def test_cpuset_never_touches_an_existing_cpu_set() -> None:
    spec = spot_spec(FROM_OWNER)
    spec["linux"]["resources"]["cpu"]["cpus"] = "3,5"
    assert modified(spec)["linux"]["resources"]["cpu"]["cpus"] == "3,5"


def test_cpuset_leaves_unknown_topology_alone() -> None:
    e = engine()
    new, ctx = e.modify(spot_spec({"direct": {"nvidia.com/gpu": ["GPU-d"]}}))
    assert "cpus" not in new["linux"]["resources"]["cpu"]
    assert any("NUMA node of GPU-d unknown" in n for n in ctx.notes)


# --- GuardRule ----------------------------------------------------------------------------------


def owner_spec(**extra: str) -> dict[str, Any]:
    return make_spec({**cri(OWNER), **extra})


def test_owner_gets_the_guard_rule_when_the_listener_is_up() -> None:
    guard = FakeGuard(ready=True)
    new = modified(owner_spec(), guard=guard)
    seccomp = new["linux"]["seccomp"]
    assert seccomp["listenerPath"] == "/run/test/guard.sock"
    assert any(s["action"] == "SCMP_ACT_NOTIFY" for s in seccomp["syscalls"])
    assert new["annotations"][keys.GUARDED] == OWNER.format()
    assert keys.GUARD_SKIPPED not in new["annotations"]
    assert guard.probes == ["/run/test/guard.sock"]


@pytest.mark.parametrize(
    ("kwargs", "extra", "reason"),
    [
        pytest.param({"guard": FakeGuard(ready=False)}, {}, "listener-down", id="listener-down"),
        pytest.param({"guard": FakeGuard()}, {keys.GUARD: "disabled"}, "opted-out", id="opted-out"),
        pytest.param({"guard": FakeGuard(), "guard_enabled": False}, {}, "guard-disabled", id="node-disabled"),
        pytest.param({"guard": None}, {}, "guard-unavailable", id="no-guard-package"),
    ],
)
def test_owner_without_the_rule_records_why(kwargs: dict[str, Any], extra: dict[str, str], reason: str) -> None:
    spec = owner_spec(**extra)
    spec["annotations"][keys.GUARDED] = "team-a/fake/claim"  # set by a user; must go
    new = modified(spec, **kwargs)
    assert "seccomp" not in new["linux"]
    assert keys.GUARDED not in new["annotations"]
    assert new["annotations"][keys.GUARD_SKIPPED].startswith(reason + ":")


def test_a_conflicting_seccomp_profile_never_fails_the_owner() -> None:
    spec = owner_spec()
    spec["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/other.sock", "syscalls": []}
    new = modified(spec, guard=FakeGuard())
    assert new["linux"]["seccomp"] == spec["linux"]["seccomp"]
    assert new["annotations"][keys.GUARD_SKIPPED].startswith("conflict:")


def test_a_failed_ownership_lookup_never_fails_the_owner() -> None:
    lookup = standard_lookup()
    lookup.fail_pods = TemporaryError("pod-resources: UNAVAILABLE")
    new = modified(owner_spec(), lookup=lookup, guard=FakeGuard())
    assert new["annotations"][keys.GUARD_SKIPPED].startswith("lookup-failed:")


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(
            make_spec({**cri(ContainerRef(NS, "web", "nginx")), keys.GUARDED: "team-a/web/nginx"}), id="no-gpus"
        ),
        pytest.param(spot_spec(FROM_OWNER), id="spot-container"),
        pytest.param(make_spec({keys.GUARD_SKIPPED: "x"}), id="not-kubernetes"),
    ],
)
def test_non_owners_never_get_the_rule_nor_its_annotations(spec: dict[str, Any]) -> None:
    guard = FakeGuard()
    new = modified(spec, guard=guard)
    assert "seccomp" not in new["linux"]
    assert keys.GUARDED not in new["annotations"] and keys.GUARD_SKIPPED not in new["annotations"]


def test_direct_sync_of_an_idle_gpu_to_a_spot_container_is_not_an_owner() -> None:
    lookup = standard_lookup()
    lookup.owners["GPU-d"] = IDLE_SPACE
    new = modified(spot_spec({"direct": {"nvidia.com/gpu": ["GPU-d"]}}), lookup=lookup, guard=FakeGuard())
    assert "seccomp" not in new["linux"]


# --- the engine's answers ------------------------------------------------------------------------


def test_engine_answers_unchanged_modified_refused_and_retry() -> None:
    e = engine()
    plain = json.dumps(make_spec(cri(ContainerRef(NS, "web", "nginx")))).encode()
    assert e.handle("c1", "/b", plain) == (b"unchanged", b"")
    status, body = e.handle("c2", "/b", json.dumps(spot_spec(FROM_OWNER)).encode())
    assert status == b"modified" and "NVIDIA_VISIBLE_DEVICES=GPU-a" in json.loads(body)["process"]["env"]
    status, body = e.handle(
        "c3", "/b", json.dumps(spot_spec({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-b"]}})).encode()
    )
    assert status == b"refused"
    assert b"container team-a/spot-job/worker (c3)" in body and RefusalReason.TWIN_NOT_ALLOCATED.value.encode() in body
    assert e.handle("c4", "/b", b"{oops")[0] == b"refused"
    assert e.handle("c5", "/b", b"[1]")[0] == b"refused"
    lookup = standard_lookup()
    lookup.fail_pods = TemporaryError("pod-resources List: UNAVAILABLE")
    status, body = engine(lookup).handle("c6", "/b", json.dumps(spot_spec(FROM_OWNER)).encode())
    assert status == b"retry" and b"UNAVAILABLE" in body
    assert e.counts() == {"unchanged": 1, "modified": 1, "refused:twin-not-allocated": 1, "refused:SpecError": 2}


def test_engine_turns_a_bug_into_a_retry_with_a_message() -> None:
    lookup = standard_lookup()
    lookup.fail_pods = ZeroDivisionError("boom")
    status, body = engine(lookup).handle("c", "/b", json.dumps(spot_spec(FROM_OWNER)).encode())
    assert status == b"retry" and b"internal error" in body and b"boom" in body


def test_engine_never_changes_its_input() -> None:
    spec = spot_spec(FROM_OWNER)
    before = copy.deepcopy(spec)
    engine().modify(spec)
    assert spec == before
