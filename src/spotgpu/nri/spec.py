"""An NRI container as the OCI-spec-shaped input spotgpu-runtime's modifier chain takes, and
OCI objects back as NRI messages.

Pure; no side effects. :func:`spec_of` builds the part of a ``config.json`` that NRI shows us
(``process.args``/``env``, ``mounts``, ``annotations``, ``linux.devices``, the device cgroup
rules, ``linux.resources.cpu.cpus``, ``linux.seccomp``, ``linux.cgroupsPath``), so the chain
of :mod:`spotgpu.runtime.modifiers` runs on it exactly as it runs on the spec the wrapper
reads. Three things differ from what the wrapper sees, all on purpose:

* the CRI identity annotations (``io.kubernetes.cri.container-type``, ``sandbox-namespace``,
  ``sandbox-name``, ``container-name``, ...) are written from containerd's own fields of the
  request (``PodSandbox.namespace``/``name``/``id``/``uid``, ``Container.name``), whatever the
  container's annotations say: the chain's identity is containerd's, never a tenant's;
* the pod's annotations of spotgpu's families (:data:`POD_ANNOTATION_PREFIXES`, the
  ``pod_annotations`` allow-list of the shipped containerd snippets) are added unless the
  container already has the key: NRI passes every pod annotation, while the runtime handler's
  allow-list decides what reaches a wrapper's spec. So pod-level device sync, env and the
  guard opt-out work in NRI mode without a handler;
* when NRI does not show the container's seccomp policy (:func:`seccomp_known`), the input
  says so under :data:`FACTS`, and NRI mode's guard functions refuse to compose the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from spotgpu.adapters.proto import nri_v1alpha1_pb2 as nri
from spotgpu.core import keys
from spotgpu.runtime.spec import Spec

POD_ANNOTATION_PREFIXES: Final = ("platform.k8s.io/", "spotgpu.io/")
"""Pod annotation families the chain reads, as deploy/containerd's ``pod_annotations`` pass them."""
FACTS: Final = "x-spotgpu-nri"
"""A top-level key of the chain's input (never an OCI field, never adjusted) with what NRI told
us beyond the spec: ``"seccomp": "unknown"`` when the container has a seccomp profile that NRI
did not send (:func:`seccomp_known`), ``"runtime": [name, version]`` of the runtime."""


def seccomp_known(linux: nri.LinuxContainer) -> bool:
    """Whether the request shows the container's seccomp policy: sent as ``seccomp_policy``, or
    none because its profile is ``Unconfined``. containerd 2.2.7 sends no policy for
    ``RuntimeDefault`` (nor ``Localhost``) containers, only the profile's type; composing the
    guard's rule into "no policy" would then replace the real profile with an allow-all one."""
    if linux.HasField("seccomp_policy"):
        return True
    return linux.HasField("seccomp_profile") and linux.seccomp_profile.profile_type == nri.SecurityProfile.UNCONFINED


# --- NRI -> OCI ------------------------------------------------------------------------------


def mount_of(m: nri.Mount) -> dict[str, Any]:
    entry: dict[str, Any] = {"destination": m.destination, "type": m.type, "source": m.source}
    if m.options:
        entry["options"] = list(m.options)
    return entry


def device_of(d: nri.LinuxDevice) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": d.path, "type": d.type, "major": d.major, "minor": d.minor}
    if d.HasField("file_mode"):
        entry["fileMode"] = d.file_mode.value
    if d.HasField("uid"):
        entry["uid"] = d.uid.value
    if d.HasField("gid"):
        entry["gid"] = d.gid.value
    return entry


def rule_of(r: nri.LinuxDeviceCgroup) -> dict[str, Any]:
    entry: dict[str, Any] = {"allow": r.allow}
    if r.type:
        entry["type"] = r.type
    if r.HasField("major"):
        entry["major"] = r.major.value
    if r.HasField("minor"):
        entry["minor"] = r.minor.value
    if r.access:
        entry["access"] = r.access
    return entry


def seccomp_of(s: nri.LinuxSeccomp) -> dict[str, Any]:
    profile: dict[str, Any] = {"defaultAction": s.default_action}
    if s.HasField("default_errno"):
        profile["defaultErrnoRet"] = s.default_errno.value
    if s.architectures:
        profile["architectures"] = list(s.architectures)
    if s.flags:
        profile["flags"] = list(s.flags)
    if s.listener_path:
        profile["listenerPath"] = s.listener_path
    if s.listener_metadata:
        profile["listenerMetadata"] = s.listener_metadata
    syscalls = []
    for call in s.syscalls:
        entry: dict[str, Any] = {"names": list(call.names), "action": call.action}
        if call.HasField("errno_ret"):
            entry["errnoRet"] = call.errno_ret.value
        if call.args:
            entry["args"] = [
                {"index": a.index, "value": a.value, "valueTwo": a.value_two, "op": a.op} for a in call.args
            ]
        syscalls.append(entry)
    profile["syscalls"] = syscalls
    return profile


def identity_annotations(pod: nri.PodSandbox, container: nri.Container) -> dict[str, str]:
    """The CRI annotations naming the container, from containerd's own fields."""
    return {
        keys.CRI_CONTAINER_TYPE: keys.CRI_TYPE_CONTAINER,
        keys.CRI_SANDBOX_ID: pod.id,
        keys.CRI_SANDBOX_NAME: pod.name,
        keys.CRI_SANDBOX_NAMESPACE: pod.namespace,
        keys.CRI_SANDBOX_UID: pod.uid,
        keys.CRI_CONTAINER_NAME: container.name,
    }


def annotations_of(pod: nri.PodSandbox, container: nri.Container) -> dict[str, str]:
    annotations = dict(container.annotations)
    for key, value in sorted(pod.annotations.items()):
        if key.startswith(POD_ANNOTATION_PREFIXES):
            annotations.setdefault(key, value)
    annotations.update(identity_annotations(pod, container))
    return annotations


def spec_of(pod: nri.PodSandbox, container: nri.Container) -> Spec:
    """The OCI-spec-shaped input of the chain (module docstring)."""
    linux = container.linux
    resources: dict[str, Any] = {"devices": [rule_of(r) for r in linux.resources.devices]}
    if linux.resources.cpu.cpus:
        resources["cpu"] = {"cpus": linux.resources.cpu.cpus}
    spec_linux: dict[str, Any] = {
        "devices": [device_of(d) for d in linux.devices],
        "resources": resources,
    }
    if linux.cgroups_path:
        spec_linux["cgroupsPath"] = linux.cgroups_path
    if linux.HasField("seccomp_policy"):
        spec_linux["seccomp"] = seccomp_of(linux.seccomp_policy)
    spec: Spec = {
        "process": {"args": list(container.args), "env": list(container.env)},
        "mounts": [mount_of(m) for m in container.mounts],
        "annotations": annotations_of(pod, container),
        "linux": spec_linux,
    }
    if not seccomp_known(linux):
        spec[FACTS] = {"seccomp": "unknown"}
    return spec


# --- OCI -> NRI ------------------------------------------------------------------------------


def nri_mount(entry: Mapping[str, Any]) -> nri.Mount:
    return nri.Mount(
        destination=str(entry["destination"]),
        type=str(entry.get("type") or ""),
        source=str(entry.get("source") or ""),
        options=[str(o) for o in entry.get("options") or ()],
    )


def nri_device(entry: Mapping[str, Any]) -> nri.LinuxDevice:
    device = nri.LinuxDevice(
        path=str(entry["path"]), type=str(entry["type"]), major=int(entry["major"]), minor=int(entry["minor"])
    )
    if entry.get("fileMode") is not None:
        device.file_mode.value = int(entry["fileMode"])
    if entry.get("uid") is not None:
        device.uid.value = int(entry["uid"])
    if entry.get("gid") is not None:
        device.gid.value = int(entry["gid"])
    return device


def nri_rule(entry: Mapping[str, Any]) -> nri.LinuxDeviceCgroup:
    rule = nri.LinuxDeviceCgroup(
        allow=bool(entry.get("allow")), type=str(entry.get("type") or ""), access=str(entry.get("access") or "")
    )
    if entry.get("major") is not None:
        rule.major.value = int(entry["major"])
    if entry.get("minor") is not None:
        rule.minor.value = int(entry["minor"])
    return rule


def nri_seccomp(profile: Mapping[str, Any]) -> nri.LinuxSeccomp:
    """``linux.seccomp`` as NRI's LinuxSeccomp. Never sets ``default_errno`` or ``errno_ret``
    (containerd 2.2.7 drops the one and crashes on the other): :mod:`spotgpu.nri.adjust`
    refuses profiles that carry them before this is called."""
    policy = nri.LinuxSeccomp(
        default_action=str(profile.get("defaultAction") or ""),
        architectures=[str(a) for a in profile.get("architectures") or ()],
        flags=[str(f) for f in profile.get("flags") or ()],
        listener_path=str(profile.get("listenerPath") or ""),
        listener_metadata=str(profile.get("listenerMetadata") or ""),
    )
    for entry in profile.get("syscalls") or ():
        call = policy.syscalls.add(names=[str(n) for n in entry["names"]], action=str(entry["action"]))
        for arg in entry.get("args") or ():
            call.args.add(
                index=int(arg["index"]),
                value=int(arg.get("value", 0)),
                value_two=int(arg.get("valueTwo", 0)),
                op=str(arg["op"]),
            )
    return policy


__all__ = [
    "FACTS",
    "POD_ANNOTATION_PREFIXES",
    "annotations_of",
    "device_of",
    "identity_annotations",
    "mount_of",
    "nri_device",
    "nri_mount",
    "nri_rule",
    "nri_seccomp",
    "rule_of",
    "seccomp_known",
    "seccomp_of",
    "spec_of",
]
