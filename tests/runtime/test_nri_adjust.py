"""The converter from the chain's output to an NRI adjustment, property-tested.

Generated inputs in the shape of :func:`spotgpu.nri.spec.spec_of`, changed the way the
modifiers change specs (set env, replace a mount, upsert a device node with its cgroup rule,
set a CPU set, replace the seccomp profile, set or drop annotations). Properties:

* complete: every such change the chain makes is carried (no refusal) when NRI can express it;
* sound: applying the adjustment (the model of containerd's side) gives the chain's output,
  checked field by field here, independently of :func:`spotgpu.nri.adjust.view`;
* strict: a change NRI cannot express (a field it cannot adjust, a narrower device access than
  NRI grants, ``errnoRet``, a removed profile, a deny rule, duplicate env names, a removed env
  variable, which containerd 2.2.7 ignores) is refused, never dropped;
* the real chain on real NRI requests (the fakes of tests/runtime) converts without refusal.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from spotgpu.adapters.proto import nri_v1alpha1_pb2 as nri
from spotgpu.core import keys
from spotgpu.nri.adjust import NotExpressible, adjustment_for, apply_adjustment
from spotgpu.nri.host import nri_guard_functions
from spotgpu.nri.spec import spec_of
from spotgpu.runtime.modifiers.devices import CDI_ANNOTATION
from spotgpu.runtime.spec import set_env

from .fakes import OWNER, SPOT_CTR, FakeGuard, devices_from, engine, standard_lookup

NAMES = st.sampled_from(["PATH", "HOME", "A", "B", "NVIDIA_VISIBLE_DEVICES", "CUDA_X", "HOSTNAME"])
VALUES = st.text(alphabet="abcxyz0123/=:,", max_size=8)
DESTS = st.sampled_from(["/proc", "/dev", "/dev/shm", "/usr/local/nvidia", "/data", "/a/b/c", "/etc/hosts"])
PATHS = st.sampled_from(["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/fuse"])
KEYS = st.sampled_from(["a.example/x", "platform.k8s.io/synced-devices", "spotgpu.io/guarded", "z/y"])


def mount(dest: str, source: str) -> dict[str, Any]:
    return {"destination": dest, "type": "bind", "source": source, "options": ["rbind", "rprivate", "ro"]}


def device(path: str, minor: int) -> dict[str, Any]:
    return {"path": path, "type": "c", "major": 195, "minor": minor, "fileMode": 0o666, "uid": 0, "gid": 0}


@st.composite
def inputs(draw: st.DrawFn) -> dict[str, Any]:
    env = draw(st.dictionaries(NAMES, VALUES, max_size=5))
    mounts = draw(st.dictionaries(DESTS, st.sampled_from(["/img", "/host"]), max_size=4))
    devices = draw(st.dictionaries(PATHS, st.integers(0, 3), max_size=2))
    spec: dict[str, Any] = {
        "process": {"args": ["sh"], "env": [f"{k}={v}" for k, v in env.items()]},
        "mounts": [mount(d, s) for d, s in mounts.items()],
        "annotations": draw(st.dictionaries(KEYS, VALUES, max_size=3)),
        "linux": {
            "devices": [device(p, m) for p, m in devices.items()],
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "cgroupsPath": "/pods/pod1/abc",
        },
    }
    if draw(st.booleans()):
        spec["linux"]["resources"]["cpu"] = {"cpus": "0-1"}
    if draw(st.booleans()):
        spec["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}
    return spec


def upsert_device(spec: dict[str, Any], path: str, minor: int, access: str) -> None:
    """What the Devices modifier does: replace in place, else append; a rule unless identical."""
    devices = spec["linux"]["devices"]
    entry = device(path, minor)
    at = next((i for i, d in enumerate(devices) if d["path"] == path), None)
    if at is None:
        devices.append(entry)
    else:
        devices[at] = entry
    rule = {"allow": True, "type": "c", "major": 195, "minor": minor, "access": access}
    if rule not in spec["linux"]["resources"]["devices"]:
        spec["linux"]["resources"]["devices"].append(rule)


def replace_mount(spec: dict[str, Any], dest: str, source: str) -> None:
    """What Devices + ReplaceMounts do: one mount at ``dest``, in the first one's place."""
    new = mount(dest, source)
    out, placed = [], False
    for m in spec["mounts"]:
        if m["destination"] != dest:
            out.append(m)
        elif not placed:
            out.append(new)
            placed = True
    spec["mounts"] = out if placed else [*out, new]


edits = st.lists(
    st.one_of(
        st.tuples(st.just("env"), NAMES, VALUES),
        st.tuples(st.just("annotation"), KEYS, VALUES),
        st.tuples(st.just("drop-annotation"), KEYS, st.none()),
        st.tuples(st.just("mount"), DESTS, st.sampled_from(["/opt/driver", "/host2"])),
        st.tuples(st.just("device"), PATHS, st.sampled_from([("rw", 0), ("rw", 1), ("rwm", 2)])),
        st.tuples(st.just("cpus"), st.sampled_from(["0-7", "8-15"]), st.none()),
        st.tuples(st.just("guard"), st.none(), st.none()),
        st.tuples(
            st.just("cdi"),
            st.sampled_from(["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-a,nvidia.com/gpu=GPU-b"]),
            st.none(),
        ),
    ),
    max_size=6,
)


def chain_like(before: dict[str, Any], ops: list[tuple[str, Any, Any]]) -> dict[str, Any]:
    after = copy.deepcopy(before)
    for op, a, b in ops:
        if op == "env":
            set_env(after, a, b)
        elif op == "annotation":
            after["annotations"][a] = b
        elif op == "drop-annotation":
            after["annotations"].pop(a, None)
        elif op == "mount":
            replace_mount(after, a, b)
        elif op == "device":
            upsert_device(after, a, b[1], b[0])
        elif op == "cpus":
            after["linux"]["resources"].setdefault("cpu", {})["cpus"] = a
        elif op == "guard":
            after["linux"]["seccomp"] = {
                "defaultAction": "SCMP_ACT_ALLOW",
                "listenerPath": "/run/spotgpu/guard.sock",
                "listenerMetadata": "spotgpu.io/owner=ns/p/c",
                "syscalls": [{"names": ["ioctl"], "action": "SCMP_ACT_NOTIFY", "args": [NOTIFY_ARG]}],
            }
        elif op == "cdi":
            after["annotations"][CDI_ANNOTATION] = a
    return after


NOTIFY_ARG = {"index": 1, "value": 0xC000FFFF, "valueTwo": 0xC00046D2, "op": "SCMP_CMP_MASKED_EQ"}


def covers(wanted: dict[str, Any], extra: dict[str, Any]) -> bool:
    same = (wanted.get("type"), wanted.get("major"), wanted.get("minor")) == (
        extra["type"],
        extra["major"],
        extra["minor"],
    )
    return bool(wanted["allow"]) and same and set(extra["access"]) <= set(wanted["access"])


def by_depth(mounts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(mounts, key=lambda m: (m["destination"].rstrip("/").count("/") or 1, m["destination"]))


@given(before=inputs(), ops=edits)
def test_chain_changes_are_carried_exactly(before: dict[str, Any], ops: list[tuple[str, Any, Any]]) -> None:
    after = chain_like(before, ops)
    adjust = adjustment_for(before, after)  # complete: never refused
    result = apply_adjustment(before, adjust)
    assert result["process"] == after["process"]
    assert result["annotations"] == after["annotations"]
    if adjust.mounts:
        assert result["mounts"] == by_depth(after["mounts"])  # NRI sorts every mount by depth
    else:
        assert result["mounts"] == after["mounts"]
    assert sorted(map(json.dumps, result["linux"]["devices"])) == sorted(map(json.dumps, after["linux"]["devices"]))
    assert result["linux"].get("seccomp") == after["linux"].get("seccomp")
    assert result["linux"]["resources"].get("cpu") == after["linux"]["resources"].get("cpu")
    rules, wanted = result["linux"]["resources"]["devices"], after["linux"]["resources"]["devices"]
    assert all(r in rules for r in wanted)  # every rule the chain wants is there
    for extra in (r for r in rules if r not in wanted):  # and NRI's own rules grant nothing more
        assert any(covers(w, extra) for w in wanted), extra
    cdi = after["annotations"].get(CDI_ANNOTATION)
    if cdi and cdi != before["annotations"].get(CDI_ANNOTATION):
        assert [d.name for d in adjust.CDI_devices] == cdi.split(",")
    assert result["linux"]["cgroupsPath"] == before["linux"]["cgroupsPath"]
    assert adjustment_for(after, after) == nri.ContainerAdjustment()  # nothing to do: nothing sent


BAD = [
    "hostname",
    "cgroups",
    "narrower",
    "errno",
    "default-errno",
    "no-seccomp",
    "deny",
    "dup-env",
    "drop-rule",
    "drop-env",
]


@given(before=inputs(), ops=edits, bad=st.sampled_from(BAD))
def test_what_nri_cannot_express_is_refused(before: dict[str, Any], ops: list[tuple[str, Any, Any]], bad: str) -> None:
    after = chain_like(before, ops)
    if bad == "hostname":
        after["hostname"] = "x"
    elif bad == "cgroups":
        after["linux"]["cgroupsPath"] = "/elsewhere"
    elif bad == "narrower":  # the plugin says read-only; NRI would grant rw with the node
        upsert_device(after, "/dev/nvidia3", 9, "r")
    elif bad == "errno":
        clone3 = {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}
        after["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [clone3]}
    elif bad == "default-errno":
        after["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 1, "syscalls": []}
    elif bad == "no-seccomp":
        assume("seccomp" in before["linux"])
        after["linux"].pop("seccomp", None)
    elif bad == "deny":
        deny = {"allow": False, "type": "c", "major": 1, "minor": 3, "access": "w"}
        after["linux"]["resources"]["devices"].append(deny)
    elif bad == "dup-env":
        after["process"]["env"] += ["DUP=1", "DUP=2"]
    elif bad == "drop-rule":
        after["linux"]["resources"]["devices"] = []
    elif bad == "drop-env":
        assume(before["process"]["env"])
        gone = before["process"]["env"][0].split("=", 1)[0]
        after["process"]["env"] = [e for e in after["process"]["env"] if e.split("=", 1)[0] != gone]
    with pytest.raises(NotExpressible):
        adjustment_for(before, after)


# --- env removal: what containerd 2.2.7 really does ----------------------------------------------------


def test_the_model_keeps_a_variable_an_adjustment_removes() -> None:
    """Measured on containerd 2.2.7 (a CPU pod with NVIDIA_VISIBLE_DEVICES=all, KEEP=1): an env
    removal leaves the variable in config.json; a changed value replaces it in place."""
    spec: dict[str, Any] = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "KEEP=1"]}}
    removal = nri.ContainerAdjustment(env=[nri.KeyValue(key="-NVIDIA_VISIBLE_DEVICES"), nri.KeyValue(key="-KEEP")])
    assert apply_adjustment(spec, removal)["process"]["env"] == ["NVIDIA_VISIBLE_DEVICES=all", "KEEP=1"]
    both = nri.ContainerAdjustment(
        env=[nri.KeyValue(key="-NVIDIA_VISIBLE_DEVICES"), nri.KeyValue(key="NVIDIA_VISIBLE_DEVICES", value="void")]
    )
    assert apply_adjustment(spec, both)["process"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void", "KEEP=1"]


def test_an_env_removal_is_refused_not_sent() -> None:
    before: dict[str, Any] = {"process": {"args": ["sh"], "env": ["A=1", "NVIDIA_VISIBLE_DEVICES=all"]}}
    after: dict[str, Any] = {"process": {"args": ["sh"], "env": ["A=1"]}}
    with pytest.raises(NotExpressible, match="ignores an NRI env removal"):
        adjustment_for(before, after)


def test_a_neutralized_selector_is_sent_as_a_new_value() -> None:
    before: dict[str, Any] = {"process": {"args": ["sh"], "env": ["NVIDIA_VISIBLE_DEVICES=all", "KEEP=1"]}}
    after: dict[str, Any] = {"process": {"args": ["sh"], "env": ["NVIDIA_VISIBLE_DEVICES=void", "KEEP=1"]}}
    adjust = adjustment_for(before, after)
    assert [(kv.key, kv.value) for kv in adjust.env] == [("NVIDIA_VISIBLE_DEVICES", "void")]


# --- the real chain on NRI requests ------------------------------------------------------------------


def request(
    ref: Any, annotations: dict[str, str], seccomp: nri.LinuxSeccomp | None = None
) -> tuple[nri.PodSandbox, nri.Container]:
    pod = nri.PodSandbox(id="s" * 64, name=ref.pod, namespace=ref.namespace, uid="u-1")
    container = nri.Container(
        id="c" * 64,
        name=ref.name,
        annotations=annotations,
        env=["PATH=/bin", "HOSTNAME=node"],
        mounts=[nri.Mount(destination="/proc", type="proc", source="proc", options=["nosuid"])],
        linux=nri.LinuxContainer(
            resources=nri.LinuxResources(devices=[nri.LinuxDeviceCgroup(allow=False, access="rwm")]),
            cgroups_path="/pods/x",
        ),
    )
    if seccomp is not None:
        container.linux.seccomp_policy.CopyFrom(seccomp)
    else:
        container.linux.seccomp_profile.profile_type = nri.SecurityProfile.UNCONFINED
    return pod, container


def converted(
    ref: Any, annotations: dict[str, str], seccomp: nri.LinuxSeccomp | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    pod, container = request(ref, annotations, seccomp)
    before = spec_of(pod, container)
    guard = FakeGuard()
    eng = engine(standard_lookup(), guard=guard)
    eng.guard = nri_guard_functions(eng.guard)
    after, _ = eng.modify(before)
    return before, apply_adjustment(before, adjustment_for(before, after))


def test_the_real_chain_syncs_a_spot_container_through_nri() -> None:
    sync = {keys.DEVICES_FROM_PREFIX: devices_from({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}})}
    _, result = converted(SPOT_CTR, sync)
    assert "NVIDIA_VISIBLE_DEVICES=GPU-a" in result["process"]["env"]
    assert result["linux"]["devices"] == [device("/dev/nvidia0", 0)]
    assert {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rw"} in result["linux"]["resources"][
        "devices"
    ]
    assert json.loads(result["annotations"][keys.SYNCED_DEVICES]) == {"nvidia.com/gpu": ["GPU-a"]}
    assert result["linux"]["resources"]["cpu"]["cpus"] == "0-7"


def test_identity_comes_from_containerd_not_from_annotations() -> None:
    """A container annotated as someone else is still the container containerd names."""
    forged = {keys.CRI_SANDBOX_NAME: "dev-box", keys.CRI_CONTAINER_NAME: "main", keys.CRI_SANDBOX_NAMESPACE: "team-a"}
    pod, container = request(SPOT_CTR, forged)
    spec = spec_of(pod, container)
    assert spec["annotations"][keys.CRI_SANDBOX_NAME] == SPOT_CTR.pod
    assert spec["annotations"][keys.CRI_CONTAINER_NAME] == SPOT_CTR.name


def test_pod_annotations_of_our_families_reach_the_chain_others_do_not() -> None:
    pod, container = request(SPOT_CTR, {})
    pod.annotations.update({keys.GUARD: "disabled", "other.io/x": "1", keys.CONTAINER_ENV_PREFIX + ".worker": "{}"})
    annotations = spec_of(pod, container)["annotations"]
    assert annotations[keys.GUARD] == "disabled" and keys.CONTAINER_ENV_PREFIX + ".worker" in annotations
    assert "other.io/x" not in annotations


def test_an_unconfined_owner_gets_the_guard_rule_through_nri() -> None:
    _, result = converted(OWNER, {})
    seccomp = result["linux"]["seccomp"]
    assert seccomp["listenerPath"] == "/run/test/guard.sock" and result["annotations"][keys.GUARDED] == OWNER.format()
    assert "errnoRet" not in json.dumps(seccomp) and "defaultErrnoRet" not in seccomp


def test_an_owner_whose_profile_nri_did_not_send_is_skipped_not_replaced() -> None:
    """RuntimeDefault without its policy (what containerd 2.2.7 sends): never an allow-all profile."""
    pod, container = request(OWNER, {})
    container.linux.seccomp_profile.profile_type = nri.SecurityProfile.RUNTIME_DEFAULT
    before = spec_of(pod, container)
    eng = engine(standard_lookup(), guard=FakeGuard())
    eng.guard = nri_guard_functions(eng.guard)
    after, _ = eng.modify(before)
    result = apply_adjustment(before, adjustment_for(before, after))
    assert "seccomp" not in result["linux"]
    assert "did not send this container's seccomp policy" in result["annotations"][keys.GUARD_SKIPPED]


def test_an_owner_whose_profile_uses_errno_ret_is_skipped_not_failed() -> None:
    """containerd's RuntimeDefault answers clone3 with ENOSYS (errnoRet 38): NRI cannot carry
    that back, so the owner is created unguarded with the reason, never refused."""
    profile = nri.LinuxSeccomp(default_action="SCMP_ACT_ERRNO", architectures=["SCMP_ARCH_X86_64"])
    profile.syscalls.add(names=["ioctl", "read"], action="SCMP_ACT_ALLOW")
    clone3 = profile.syscalls.add(names=["clone3"], action="SCMP_ACT_ERRNO")
    clone3.errno_ret.value = 38
    before, result = converted(OWNER, {}, profile)
    assert result["linux"]["seccomp"] == before["linux"]["seccomp"]
    assert result["annotations"][keys.GUARD_SKIPPED].startswith("conflict: NRI mode cannot install the rule")
    assert keys.GUARDED not in result["annotations"]


@given(
    annotations=st.dictionaries(
        st.sampled_from(
            [
                keys.DEVICES_FROM_PREFIX,
                keys.DEVICES_FROM_PREFIX + ".worker",
                keys.CONTAINER_ENV_PREFIX,
                keys.CONTAINER_ENV_PREFIX + ".main",
                keys.GUARD,
                keys.SYNCED_DEVICES,
                CDI_ANNOTATION,
            ]
        ),
        st.text(max_size=60) | st.sampled_from(['{"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}', '{"A": "1"}']),
        max_size=4,
    ),
    target=st.sampled_from([SPOT_CTR, OWNER]),
)
def test_any_annotation_text_is_an_adjustment_or_an_error_status(annotations: dict[str, str], target: Any) -> None:
    """Through the whole NRI path, tenant-written text never escapes as anything but an answer."""
    from spotgpu.nri.host import NriRuntime
    from spotgpu.nri.transport import RpcError

    pod, container = request(target, annotations)
    runtime = NriRuntime(engine(standard_lookup(), guard=FakeGuard()))
    try:
        adjust = runtime.decide(pod, container)
    except RpcError as exc:
        assert exc.message.startswith("spotgpu-runtime: ")
    else:
        assert not any(s.HasField("errno_ret") for s in adjust.linux.seccomp_policy.syscalls)
    finally:
        runtime.close()
