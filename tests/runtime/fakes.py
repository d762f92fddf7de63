"""In-memory implementations of the runtime's ports, and builders for specs and scenarios.

:class:`FakeLookup` implements :class:`~spotgpu.ports.lookup.NodeLookup` (a kubelet view, an
owner record and an NVIDIA-like device plugin that answers like the vendor plugin double);
:class:`FakeHost` implements :class:`~spotgpu.ports.lookup.HostPort`. They are fakes of our
own Protocols, not mocks: they hold state and answer from it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotgpu.core import keys
from spotgpu.core.errors import PermanentError
from spotgpu.core.ids import DeviceID, ResourceName
from spotgpu.core.mapping_cache import IDLE_SPACE, Owner
from spotgpu.core.refs import ContainerRef
from spotgpu.ports.lookup import (
    Allocation,
    ContainerAssignment,
    DeviceGroup,
    DeviceNodeSpec,
    HostDevice,
    MountSpec,
    PodAssignment,
)
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.engine import SpecEngine
from spotgpu.runtime.modifiers import GuardFunctions
from spotgpu.testing.podresources import ContainerDevices, ContainerResources, PodResources

GPU = ResourceName("nvidia.com/gpu")
SPOT = ResourceName("platform/spot-gpu")
NS = "team-a"
SYSTEM_NS = "spotgpu-system"
OWNER = ContainerRef(NS, "dev-box", "main")
SPOT_CTR = ContainerRef(NS, "spot-job", "worker")
SHADOW = ContainerRef(SYSTEM_NS, "shadow-1", "hold")
DRIVER_MOUNT = MountSpec("/usr/local/nvidia", "/opt/driver", True)


@dataclass
class VendorGpu:
    id: str
    host_path: str
    container_path: str
    numa: int | None
    major: int = 195
    minor: int = 0


VENDOR = {
    "GPU-a": VendorGpu("GPU-a", "/dev/nvidia0", "/dev/nvidia0", 0, 195, 0),
    "GPU-b": VendorGpu("GPU-b", "/dev/nvidia1", "/dev/nvidia1", 1, 195, 1),
    "GPU-c": VendorGpu("GPU-c", "/dev/nvidia2", "/dev/nvidia2", 0, 195, 2),
    "GPU-d": VendorGpu("GPU-d", "/dev/nvidia3", "/dev/nvidia3", None, 195, 3),
}


def pod(
    ref: ContainerRef, *groups: tuple[str, Sequence[str]], others: Sequence[ContainerAssignment] = ()
) -> PodAssignment:
    """A pod whose container ``ref.name`` holds ``groups`` (resource, ids); NUMA from VENDOR."""
    assert ref.namespace is not None
    devices = []
    for resource, ids in groups:
        for device in ids:
            gpu = VENDOR.get(device.removeprefix("spot-").split("::")[0])
            numa = (gpu.numa,) if gpu is not None and gpu.numa is not None else ()
            devices.append(DeviceGroup(ResourceName(resource), (DeviceID(device),), numa))
    return PodAssignment(ref.namespace, ref.pod, (ContainerAssignment(ref.name, tuple(devices)), *others))


@dataclass
class FakeLookup:
    pods: list[PodAssignment] = field(default_factory=list)
    owners: dict[str, Owner] = field(default_factory=dict)
    lendable: dict[str, bool] = field(default_factory=dict)
    """Twin health per real device as the agent would answer; a missing device: unknown."""
    mounts: tuple[MountSpec, ...] = (DRIVER_MOUNT,)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi: bool = False
    calls: list[tuple[str, Any]] = field(default_factory=list)
    fail_pods: Exception | None = None

    def pod(self, namespace: str, name: str) -> PodAssignment | None:
        self.calls.append(("pod", (namespace, name)))
        if self.fail_pods is not None:
            raise self.fail_pods
        return next((p for p in self.pods if (p.namespace, p.name) == (namespace, name)), None)

    def device_owner(self, device: DeviceID) -> Owner | None:
        return self.owners.get(device)

    def device_lendable(self, device: DeviceID) -> bool | None:
        return self.lendable.get(device)

    def allocate(self, resource: ResourceName, devices: Sequence[DeviceID]) -> Allocation:
        self.calls.append(("allocate", (resource, tuple(devices))))
        unknown = [d for d in devices if d not in VENDOR]
        if resource != GPU or unknown:
            raise PermanentError(f'invalid allocation request for "{resource}": unknown device: {unknown[:1]}')
        return Allocation(
            envs=(("NVIDIA_VISIBLE_DEVICES", ",".join(devices)),),
            mounts=self.mounts,
            devices=tuple(DeviceNodeSpec(VENDOR[d].container_path, VENDOR[d].host_path, "rw") for d in devices),
            annotations=tuple(sorted(self.annotations.items())),
            cdi_devices=tuple(f"nvidia.com/gpu={d}" for d in devices) if self.cdi else (),
        )

    def device_numa(self, resource: ResourceName) -> Mapping[DeviceID, tuple[int, ...]]:
        return {DeviceID(g.id): ((g.numa,) if g.numa is not None else ()) for g in VENDOR.values() if resource == GPU}


@dataclass
class FakeHost:
    cpus: dict[int, str] = field(default_factory=lambda: {0: "0-7", 1: "8-15"})

    def device_nodes(self, host_path: str, container_path: str) -> tuple[HostDevice, ...]:
        gpu = next((g for g in VENDOR.values() if g.host_path == host_path), None)
        if gpu is None:
            raise PermanentError(f"device {host_path}: No such file or directory")
        return (HostDevice(container_path, "c", gpu.major, gpu.minor, 0o666, 0, 0),)

    def numa_cpus(self, node: int) -> str | None:
        return self.cpus.get(node)


class FakeGuard:
    """The guard's two functions: the real rule composition, a listener that is up or not."""

    def __init__(self, ready: bool = True) -> None:
        from spotgpu.guard.rule import apply_guard_rule

        self.up = ready
        self.probes: list[str] = []
        self.functions = GuardFunctions(apply_guard_rule, self._ready)

    def _ready(self, path: str) -> bool:
        self.probes.append(path)
        return self.up


def standard_lookup() -> FakeLookup:
    """Owner ``team-a/dev-box/main`` holds GPU-a and GPU-b (lent); a ShadowPod in spotgpu-system
    holds GPU-c; GPU-d is unallocated; spot ``team-a/spot-job/worker`` holds the twins of a, c, d.
    The agent says every GPU is lendable now."""
    return FakeLookup(
        pods=[
            pod(OWNER, (GPU, ["GPU-a", "GPU-b"])),
            pod(SHADOW, (GPU, ["GPU-c"])),
            pod(SPOT_CTR, (SPOT, ["spot-GPU-a", "spot-GPU-c", "spot-GPU-d"])),
        ],
        owners={"GPU-a": OWNER, "GPU-b": OWNER, "GPU-c": SHADOW, "GPU-d": IDLE_SPACE},
        lendable={"GPU-a": True, "GPU-b": True, "GPU-c": True, "GPU-d": True},
    )


def kubelet_pods() -> list[PodResources]:
    """What the pod-resources double serves: OWNER holds GPU-a and GPU-b (NUMA 0), SPOT_CTR holds spot-GPU-a."""
    assert OWNER.namespace is not None and SPOT_CTR.namespace is not None
    return [
        PodResources(
            OWNER.namespace,
            OWNER.pod,
            (ContainerResources(OWNER.name, (ContainerDevices(GPU, ("GPU-a", "GPU-b"), (0,)),)),),
        ),
        PodResources(
            SPOT_CTR.namespace,
            SPOT_CTR.pod,
            (ContainerResources(SPOT_CTR.name, (ContainerDevices(SPOT, ("spot-GPU-a",), (0,)),)),),
        ),
    ]


def cri(ref: ContainerRef | None, kind: str = "container") -> dict[str, str]:
    """The CRI annotations containerd writes into a spec."""
    if ref is None:
        return {keys.CRI_CONTAINER_TYPE: kind}
    assert ref.namespace is not None
    return {
        keys.CRI_CONTAINER_TYPE: kind,
        keys.CRI_SANDBOX_ID: "f" * 64,
        keys.CRI_SANDBOX_NAMESPACE: ref.namespace,
        keys.CRI_SANDBOX_NAME: ref.pod,
        keys.CRI_SANDBOX_UID: "0b7c1c2e-8d2e-4f57-9a3c-1f1f1f1f1f1f",
        keys.CRI_CONTAINER_NAME: ref.name,
        keys.CRI_IMAGE_NAME: "docker.io/library/busybox:1.36",
    }


def devices_from(sources: Mapping[str, Mapping[str, Sequence[str]]]) -> str:
    return json.dumps({k: {r: list(ids) for r, ids in v.items()} for k, v in sources.items()})


BASE_SPEC: dict[str, Any] = {
    "ociVersion": "1.0.2-dev",
    "process": {
        "user": {"uid": 0, "gid": 0},
        "args": ["/bin/sh", "-c", "sleep 1"],
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=spot-job"],
        "cwd": "/",
        "capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL"]},
        "noNewPrivileges": True,
    },
    "root": {"path": "rootfs", "readonly": False},
    "hostname": "spot-job",
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755"]},
        {"destination": "/usr/local/nvidia", "type": "bind", "source": "/var/lib/image-driver", "options": ["rbind"]},
    ],
    "annotations": {},
    "linux": {
        "resources": {
            "devices": [{"allow": False, "access": "rwm"}],
            "memory": {"limit": 1073741824},
            "cpu": {"shares": 1024, "quota": 100000, "period": 100000},
        },
        "cgroupsPath": "/kubepods/besteffort/pod0b7c1c2e/abc",
        "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "mount"}],
        "maskedPaths": ["/proc/kcore"],
    },
}


def make_spec(annotations: Mapping[str, str], **overrides: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE_SPEC)
    spec["annotations"] = dict(annotations)
    spec.update(overrides)
    return spec


def spot_spec(sources: Mapping[str, Mapping[str, Sequence[str]]], target: ContainerRef = SPOT_CTR) -> dict[str, Any]:
    return make_spec({**cri(target), keys.DEVICES_FROM_PREFIX: devices_from(sources)})


def engine(
    lookup: FakeLookup | None = None,
    *,
    guard: FakeGuard | None = None,
    **config: Any,
) -> SpecEngine:
    settings = {"cross_namespace_sources": (SYSTEM_NS,), "guard_listener_path": Path("/run/test/guard.sock"), **config}
    made = SpecEngine(
        RuntimeConfig(**settings),
        lookup if lookup is not None else standard_lookup(),
        FakeHost(),
        guard=guard.functions if guard is not None else None,
    )
    return NriModeEngine(made) if MODE.value == "nri" else made  # type: ignore[return-value]


# --- NRI mode ---------------------------------------------------------------------------------


@dataclass
class Mode:
    value: str = "wrapper"


MODE = Mode()
"""Which path :func:`engine` takes; set by the ``runtime_mode`` fixture (conftest.py)."""


def _env_as_containerd(env: list[str]) -> list[str]:
    """containerd merges env by name (a later value replaces the first entry's): NRI never sees
    a name twice."""
    out: list[str] = []
    at: dict[str, int] = {}
    for item in env:
        name = item.split("=", 1)[0]
        if name in at:
            out[at[name]] = item
        else:
            at[name] = len(out)
            out.append(item)
    return out


def nri_request(spec: dict[str, Any]) -> tuple[Any, Any]:
    """The CreateContainer request containerd would send NRI for the container of ``spec``.

    Skips what NRI never sees: specs without a named CRI container (sandboxes, ``ctr run``) and
    shapes protobuf cannot carry."""
    import pytest

    from spotgpu.adapters.proto import nri_v1alpha1_pb2 as nri
    from spotgpu.nri.spec import nri_device, nri_mount, nri_rule, nri_seccomp

    linux = spec.get("linux")
    if not isinstance(linux, dict) or not isinstance(spec.get("process"), dict):
        pytest.skip("NRI requests are protobuf: a malformed spec shape cannot reach NRI mode")
    annotations = {k: v for k, v in (spec.get("annotations") or {}).items() if isinstance(v, str)}
    names = [annotations.get(k) for k in (keys.CRI_SANDBOX_NAMESPACE, keys.CRI_SANDBOX_NAME, keys.CRI_CONTAINER_NAME)]
    if annotations.get(keys.CRI_CONTAINER_TYPE) != keys.CRI_TYPE_CONTAINER or not all(names):
        pytest.skip("NRI calls CreateContainer only for CRI containers, which containerd always names")
    namespace, pod_name, name = names
    uid = annotations.get(keys.CRI_SANDBOX_UID, "u")
    pod = nri.PodSandbox(id=annotations.get(keys.CRI_SANDBOX_ID, "s" * 64), name=pod_name, namespace=namespace, uid=uid)
    resources = linux.get("resources") or {}
    container = nri.Container(
        id="c" * 64,
        name=name,
        annotations=annotations,
        args=spec["process"].get("args") or [],
        env=_env_as_containerd(list(spec["process"].get("env") or [])),
        mounts=[nri_mount(m) for m in spec.get("mounts") or []],
        linux=nri.LinuxContainer(
            devices=[nri_device(d) for d in linux.get("devices") or []],
            resources=nri.LinuxResources(
                devices=[nri_rule(r) for r in resources.get("devices") or []],
                cpu=nri.LinuxCPU(cpus=(resources.get("cpu") or {}).get("cpus") or ""),
            ),
            cgroups_path=linux.get("cgroupsPath") or "",
        ),
    )
    if not isinstance(linux.get("seccomp"), dict):  # containerd shows an unconfined container's profile type
        container.linux.seccomp_profile.profile_type = nri.SecurityProfile.UNCONFINED
    else:  # a runtime that sends the policy (containerd 2.2.7 does not for RuntimeDefault: test_nri_containerd)
        profile = linux["seccomp"]
        policy = nri_seccomp(profile)
        if "defaultErrnoRet" in profile:
            policy.default_errno.value = profile["defaultErrnoRet"]
        for call, entry in zip(policy.syscalls, profile.get("syscalls") or [], strict=True):
            if "errnoRet" in entry:
                call.errno_ret.value = entry["errnoRet"]
        container.linux.seccomp_policy.CopyFrom(policy)
    return pod, container


def overlay(spec: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with the fields NRI adjusts taken from containerd's ``result`` (an empty field
    the spec did not have stays absent)."""
    out = copy.deepcopy(spec)

    def put(parent: dict[str, Any], key: str, value: Any) -> None:
        if value or key in parent:
            parent[key] = value

    put(out["process"], "env", result["process"]["env"])
    put(out["process"], "args", result["process"]["args"])
    put(out, "mounts", result["mounts"])
    put(out, "annotations", result["annotations"])
    linux = out["linux"]
    put(linux, "devices", result["linux"]["devices"])
    resources = linux.setdefault("resources", {})
    put(resources, "devices", result["linux"]["resources"]["devices"])
    cpus = (result["linux"]["resources"].get("cpu") or {}).get("cpus")
    if cpus:
        resources.setdefault("cpu", {})["cpus"] = cpus
    if "seccomp" in result["linux"]:
        linux["seccomp"] = result["linux"]["seccomp"]
    return out


class NriModeEngine:
    """A :class:`SpecEngine` as NRI mode runs it: the request containerd would send NRI for the
    spec, the same chain on :func:`spotgpu.nri.spec.spec_of` of it (the guard's functions wrapped
    by :func:`spotgpu.nri.host.nri_guard_functions`), the adjustment, and containerd's result
    (:func:`spotgpu.nri.adjust.apply_adjustment`) laid over the spec. Refusals raise the chain's
    own exceptions (the status mapping of :class:`spotgpu.nri.host.NriRuntime` is tested apart)."""

    def __init__(self, inner: SpecEngine) -> None:
        from spotgpu.nri.host import nri_guard_functions

        self.inner = inner
        inner.guard = nri_guard_functions(inner.guard)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def modify(self, spec: Any) -> tuple[dict[str, Any], Any]:
        from spotgpu.nri.adjust import adjustment_for, apply_adjustment
        from spotgpu.nri.spec import spec_of

        before = spec_of(*nri_request(spec))
        after, ctx = self.inner.modify(before)
        result = apply_adjustment(before, adjustment_for(before, after))
        return overlay(spec, result), ctx

    def handle(self, container_id: str, bundle: str, data: bytes) -> tuple[bytes, bytes]:
        import pytest

        pytest.skip("the wrapper's wire protocol; NRI mode's answers are tested in test_nri_host.py")
