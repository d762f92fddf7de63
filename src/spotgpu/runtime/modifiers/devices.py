"""Devices: give a spot container the real devices its ``container-devices-from`` request names.

Decides with :func:`spotgpu.runtime.sync.plan_sync` (resolution by the ContainerSync, PodSync
and Direct providers, then the security rule); side effects only through the context's
lookups: the source resource's device plugin ``Allocate`` and ``stat`` of the device nodes it
returns. Merges into the spec, as containerd's CRI would have for a container that requested
the devices itself:

* ``process.env``: the plugin's envs (a name set by two resources with different values is refused);
* ``mounts``: the plugin's mounts (``rbind``, ``rprivate``, ``ro``/``rw``), appended unless an
  identical mount is there; :mod:`.replace_mounts` then removes others at the same destination;
* ``linux.devices`` (replaced by path) and a cgroup allow rule per node in
  ``linux.resources.devices`` (added unless identical);
* the plugin's annotations (never keys of the CRI, spotgpu or ``platform.k8s.io`` families);
* CDI device names as the annotation ``cdi.k8s.io/spotgpu-synced`` (resolved by a CDI-aware
  lower runtime such as nvidia-container-runtime in CDI mode);
* ``platform.k8s.io/synced-devices``: ``{"<resource>": ["<id>", ...]}``.

A container without a request gets no sync. Every annotation we write (``synced-devices``, the
CDI names, the guard's) has already been removed by :mod:`spotgpu.runtime.sanitize` before the
chain runs, so what they say is always ours.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any, Final

from spotgpu.core import keys
from spotgpu.core.errors import ValidationError
from spotgpu.ports.lookup import Allocation, HostDevice
from spotgpu.runtime.modifiers.base import ModifyContext, SyncResult, mount_entry
from spotgpu.runtime.spec import ContainerKind, Spec, array, obj, set_annotation, set_env
from spotgpu.runtime.sync import RefusalReason, SyncRefused, plan_sync

CDI_ANNOTATION: Final = keys.CDI_SYNCED
PROTECTED_PREFIXES: Final = ("io.kubernetes.", "platform.k8s.io/", "spotgpu.io/", "scheduling.spotgpu.io/")
"""Annotation key prefixes a device plugin's answer may not set."""
_PERMISSIONS: Final = frozenset("rwm")


class AllocationError(ValidationError):
    """A device plugin's answer cannot be merged (conflicting envs or mounts, bad paths)."""


def _cgroup_rule(node: HostDevice, access: str) -> dict[str, Any]:
    return {"allow": True, "type": node.type, "major": node.major, "minor": node.minor, "access": access}


def _device_entry(node: HostDevice) -> dict[str, Any]:
    return {
        "path": node.container_path,
        "type": node.type,
        "major": node.major,
        "minor": node.minor,
        "fileMode": node.file_mode,
        "uid": node.uid,
        "gid": node.gid,
    }


def _check_path(kind: str, path: str, resource: str) -> None:
    if not path.startswith("/") or "\0" in path:
        raise AllocationError(f"{resource} device plugin returned {kind} {path!r}: not an absolute path")


def merged_envs(result: SyncResult) -> list[tuple[str, str]]:
    """Every env of every allocation; a name given two different values is an error."""
    env: dict[str, tuple[str, str]] = {}
    for resource, _, allocation in result.allocations:
        for name, value in allocation.envs:
            if not name or "=" in name or "\0" in name or "\0" in value:
                raise AllocationError(f"{resource} device plugin returned an invalid env name {name!r}")
            seen = env.setdefault(name, (value, resource))
            if seen[0] != value:
                raise AllocationError(
                    f"env {name} is set to {seen[0]!r} by {seen[1]} and to {value!r} by {resource}; cannot merge"
                )
    return [(name, value) for name, (value, _) in env.items()]


def merged_mounts(result: SyncResult) -> list[dict[str, Any]]:
    """The allocations' mounts as OCI entries, one per destination (differing ones are an error)."""
    by_dest: dict[str, dict[str, Any]] = {}
    for resource, _, allocation in result.allocations:
        for mount in allocation.mounts:
            _check_path("mount destination", mount.container_path, resource)
            _check_path("mount source", mount.host_path, resource)
            entry = mount_entry(mount)
            dest = posixpath.normpath(mount.container_path)
            seen = by_dest.setdefault(dest, entry)
            if seen != entry:
                raise AllocationError(f"two synced mounts at {dest}: {seen['source']} and {mount.host_path}")
    return list(by_dest.values())


def _nodes(allocation: Allocation, resource: str, ctx: ModifyContext) -> list[tuple[HostDevice, str]]:
    nodes: list[tuple[HostDevice, str]] = []
    for spec in allocation.devices:
        _check_path("device path", spec.container_path, resource)
        _check_path("device host path", spec.host_path, resource)
        access = spec.permissions or "rwm"
        if not set(access) <= _PERMISSIONS:
            raise AllocationError(f"{resource} device plugin returned permissions {access!r} for {spec.host_path}")
        nodes += [(n, access) for n in ctx.host.device_nodes(spec.host_path, spec.container_path)]
    return nodes


def _upsert_device(devices: list[Any], entry: dict[str, Any]) -> None:
    """Put ``entry`` where the first node with its path is (dropping later ones), else at the end."""
    path = entry["path"]
    placed = False
    kept: list[Any] = []
    for item in devices:
        if isinstance(item, dict) and item.get("path") == path:
            if not placed:
                kept.append(entry)
                placed = True
            continue
        kept.append(item)
    if not placed:
        kept.append(entry)
    devices[:] = kept


class Devices:
    name = "devices"

    def modify(self, spec: Spec, ctx: ModifyContext) -> None:
        request = ctx.devices_from
        if request is None:
            set_annotation(spec, keys.SYNCED_DEVICES, None)
            return
        target = ctx.identity.ref
        if ctx.identity.kind is not ContainerKind.CONTAINER or target is None:
            raise SyncRefused(
                RefusalReason.UNKNOWN_CONTAINER,
                f"a {ctx.identity.describe()} cannot receive synced devices: the grant is checked against the "
                "kubelet's allocation to a named Kubernetes container",
            )
        plan = plan_sync(request, target, ctx.lookup, ctx.policy, dict(ctx.providers))
        result = SyncResult(plan, tuple((r, ids, ctx.lookup.allocate(r, ids)) for r, ids in plan.by_resource()))
        # Compute everything first; the spec is touched only when nothing can fail any more.
        envs = merged_envs(result)
        mounts = merged_mounts(result)
        nodes = [n for resource, _, allocation in result.allocations for n in _nodes(allocation, resource, ctx)]
        plugin_annotations = {
            k: v
            for _, _, allocation in result.allocations
            for k, v in allocation.annotations
            if not k.startswith(PROTECTED_PREFIXES) and k != CDI_ANNOTATION
        }
        cdi = sorted({name for _, _, allocation in result.allocations for name in allocation.cdi_devices})
        linux = obj(spec, "linux", "")
        spec_devices = array(linux, "devices", "linux.")
        rules = array(obj(linux, "resources", "linux."), "devices", "linux.resources.")
        spec_mounts = array(spec, "mounts", "")
        obj(spec, "process", "")

        for name, value in envs:
            set_env(spec, name, value)
        for entry in mounts:
            if entry not in spec_mounts:
                spec_mounts.append(entry)
        for node, access in nodes:
            _upsert_device(spec_devices, _device_entry(node))
            rule = _cgroup_rule(node, access)
            if rule not in rules:
                rules.append(rule)
        for key, value in sorted(plugin_annotations.items()):
            set_annotation(spec, key, value)
        set_annotation(spec, CDI_ANNOTATION, ",".join(cdi) if cdi else None)
        synced = {resource: list(ids) for resource, ids in plan.by_resource()}
        set_annotation(spec, keys.SYNCED_DEVICES, json.dumps(synced, sort_keys=True, separators=(",", ":")))
        ctx.sync = result


__all__ = ["CDI_ANNOTATION", "PROTECTED_PREFIXES", "AllocationError", "Devices", "merged_envs", "merged_mounts"]
