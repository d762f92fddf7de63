"""The modifier chain's change to a spec, as an NRI ContainerAdjustment; or a refusal.

Pure; no side effects. :func:`adjustment_for` takes the chain's input (:func:`spotgpu.nri.spec.spec_of`)
and output and returns the adjustment that makes containerd produce the output, for every
field NRI can adjust. It proves that by construction: it applies the adjustment to the input
with :func:`apply_adjustment`, a model of how containerd 2.x applies an NRI adjustment
(NRI's result collection and spec generator, summarised below), and compares with the chain's
output; any difference, and any change to a field NRI cannot adjust, raises
:class:`NotExpressible`. So a change is either carried exactly or the container is refused,
never dropped silently.

How containerd applies an adjustment (NRI v0.11, containerd 2.2.7), as modelled here:

* annotations: set, or ``-key`` removes;
* env: the first entry of a named variable is replaced in place (later entries of that name
  collapse into it), new names are appended in adjustment order; entries without ``=`` are
  dropped once any env is adjusted (compared without regard to order: with unique names, which
  an adjusted env must have, the environment is a map). A removal (``-NAME``) is **ignored**:
  measured on containerd 2.2.7, the variable stays in config.json with its value (NRI's result
  collection records it, containerd's spec generator never deletes it). So a chain output that
  drops a variable is refused (:class:`NotExpressible`, the create fails) rather than sent as a
  removal; the sanitizer neutralizes device selectors instead of removing them
  (:mod:`spotgpu.runtime.sanitize`);
* mounts: an added mount replaces the first one at its destination and is appended; ``-dest``
  removes the first one; after any mount adjustment every mount is sorted by the depth of its
  destination, then by destination (so parents come before children);
* devices: an added device replaces the first one at its path (or is appended), and gets a
  cgroup allow rule of its own: access ``rw`` (``rwm`` for block devices), appended to
  ``linux.resources.devices``; ``-path`` removes the first one;
* ``linux.resources.devices``: appended as given; ``linux.resources.cpu.cpus``: set;
* ``linux.seccomp``: replaced as a whole. ``defaultErrnoRet`` is dropped and an ``errnoRet``
  crashes containerd 2.2.7 (nil dereference in NRI v0.11.0), so profiles with either are
  refused here and the adjustment never carries them;
* CDI device names: resolved by the runtime (not modelled); the chain asks for them with the
  :data:`~spotgpu.runtime.modifiers.devices.CDI_ANNOTATION` annotation (a wrapper cannot make
  containerd inject CDI devices; NRI can).

Cgroup device rules are compared as the chain's input rules (which must stay a prefix) plus,
per device, the union of the access the appended allow rules grant: NRI's own rule for an
added device must not grant more than the chain's rules do.
"""

from __future__ import annotations

import copy
import json
import posixpath
from collections.abc import Iterable, Mapping
from typing import Any, Final

from spotgpu.adapters.proto import nri_v1alpha1_pb2 as nri
from spotgpu.core.errors import ValidationError
from spotgpu.nri.spec import device_of, mount_of, nri_device, nri_mount, nri_rule, nri_seccomp, rule_of, seccomp_of
from spotgpu.runtime.modifiers.devices import CDI_ANNOTATION
from spotgpu.runtime.spec import Spec

REMOVE: Final = "-"
ADJUSTABLE: Final = (
    ("process", "args"),
    ("process", "env"),
    ("mounts",),
    ("annotations",),
    ("linux", "devices"),
    ("linux", "resources", "devices"),
    ("linux", "resources", "cpu", "cpus"),
    ("linux", "seccomp"),
)


class NotExpressible(ValidationError):
    """The chain changed the spec in a way NRI cannot carry; the container must not be created."""


def _get(spec: Mapping[str, Any], path: Iterable[str], default: Any = None) -> Any:
    node: Any = spec
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return default
        node = node[key]
    return node


def _prune(value: Any) -> Any:
    if isinstance(value, dict):
        pruned = {k: _prune(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v != {}}
    return value


def rest(spec: Mapping[str, Any]) -> Any:
    """``spec`` without the fields NRI can adjust (empty objects pruned)."""
    out = copy.deepcopy(dict(spec))
    for path in ADJUSTABLE:
        node: Any = out
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return _prune(out)


def _env_pairs(env: Iterable[Any]) -> list[tuple[str, str | None]]:
    pairs: list[tuple[str, str | None]] = []
    for item in env:
        name, sep, value = str(item).partition("=")
        pairs.append((name, value if sep else None))
    return pairs


# --- the model of containerd's side ----------------------------------------------------------


def _apply_env(env: list[Any], adjust: Iterable[nri.KeyValue]) -> list[str]:
    changes = list(adjust)
    if not changes:
        return [str(e) for e in env]
    mod = {kv.key.removeprefix(REMOVE): kv for kv in changes}
    out: list[str] = []
    index: dict[str, int] = {}

    def add(name: str, value: str) -> None:
        if name in index:
            out[index[name]] = f"{name}={value}"
        else:
            index[name] = len(out)
            out.append(f"{name}={value}")

    for name, value in _env_pairs(env):
        if value is None:
            continue
        change = mod.get(name)
        if change is not None and not change.key.startswith(REMOVE):
            del mod[name]
            add(name, change.value)
            continue
        add(name, value)  # unchanged, or a removal: containerd 2.2.7 keeps the variable
    for kv in changes:
        if not kv.key.startswith(REMOVE) and kv.key in mod:
            add(kv.key, kv.value)
    return out


def _depth(destination: str) -> int:
    return posixpath.normpath(destination).count("/") if destination else 0


def _apply_mounts(mounts: list[Any], adjust: Iterable[nri.Mount]) -> list[Any]:
    changes = list(adjust)
    out = list(mounts)
    if not changes:
        return out

    def remove(destination: str) -> None:
        for i, entry in enumerate(out):
            if isinstance(entry, dict) and entry.get("destination") == destination:
                del out[i]
                return

    for m in changes:
        if m.destination.startswith(REMOVE):
            remove(m.destination.removeprefix(REMOVE))
            continue
        remove(m.destination)
        out.append(mount_of(m))
    return sorted(out, key=lambda e: (_depth(str(e.get("destination", ""))), str(e.get("destination", ""))))


def access_of(device: nri.LinuxDevice) -> str:
    """The access of the cgroup rule NRI adds with a device (NRI's ``AccessString``)."""
    return "rwm" if device.type == "b" else "rw"


def _apply_devices(linux: dict[str, Any], adjust: Iterable[nri.LinuxDevice]) -> None:
    devices = linux.setdefault("devices", [])
    rules = linux.setdefault("resources", {}).setdefault("devices", [])
    for d in adjust:
        path = d.path.removeprefix(REMOVE)
        for i, entry in enumerate(devices):
            if entry.get("path") == path:
                del devices[i]
                break
        if d.path.startswith(REMOVE):
            continue
        entry = device_of(d)
        at = next((i for i, e in enumerate(devices) if e.get("path") == path), None)
        if at is None:
            devices.append(entry)
        else:
            devices[at] = entry
        rules.append({"allow": True, "type": d.type, "major": d.major, "minor": d.minor, "access": access_of(d)})


def apply_adjustment(spec: Spec, adjust: nri.ContainerAdjustment) -> Spec:
    """``spec`` as containerd makes it from ``adjust`` (the model of the module docstring)."""
    out = copy.deepcopy(spec)
    annotations = out.setdefault("annotations", {})
    for key, value in adjust.annotations.items():
        if key.startswith(REMOVE):
            annotations.pop(key.removeprefix(REMOVE), None)
        else:
            annotations[key] = value
    process = out.setdefault("process", {})
    process["env"] = _apply_env(process.get("env") or [], adjust.env)
    if adjust.args:
        process["args"] = list(adjust.args)
    out["mounts"] = _apply_mounts(out.get("mounts") or [], adjust.mounts)
    linux = out.setdefault("linux", {})
    _apply_devices(linux, adjust.linux.devices)
    resources = linux.setdefault("resources", {})
    resources.setdefault("devices", []).extend(rule_of(r) for r in adjust.linux.resources.devices)
    if adjust.linux.resources.cpu.cpus:
        resources.setdefault("cpu", {})["cpus"] = adjust.linux.resources.cpu.cpus
    if adjust.linux.HasField("seccomp_policy"):
        profile = seccomp_of(adjust.linux.seccomp_policy)
        profile.pop("defaultErrnoRet", None)
        linux["seccomp"] = profile
    return out


# --- comparing ------------------------------------------------------------------------------


def _rule_key(rule: Any) -> tuple[str, int, int] | None:
    """(type, major, minor) of a concrete allow rule; None for anything else."""
    if not isinstance(rule, Mapping) or rule.get("allow") is not True or rule.get("type") not in ("c", "b"):
        return None
    major, minor = rule.get("major"), rule.get("minor")
    if not isinstance(major, int) or not isinstance(minor, int):
        return None
    return str(rule["type"]), major, minor


def _granted(base: list[Any], rules: list[Any], what: str) -> dict[str, str]:
    """Per device (``"c 195:0"``), the access the rules appended after ``base`` grant."""
    if rules[: len(base)] != base:
        raise NotExpressible(f"{what}: the device cgroup rules before the chain's were changed; NRI only appends")
    granted: dict[tuple[str, int, int], set[str]] = {}
    for rule in rules[len(base) :]:
        key = _rule_key(rule)
        if key is None:
            raise NotExpressible(f"{what}: cgroup rule {rule} is not an allow rule for one device; NRI cannot place it")
        granted.setdefault(key, set()).update(str(rule.get("access") or "rwm"))
    return {f"{t} {major}:{minor}": "".join(sorted(v)) for (t, major, minor), v in sorted(granted.items())}


def view(spec: Mapping[str, Any], base: Mapping[str, Any], *, sorted_mounts: bool, what: str) -> dict[str, Any]:
    """What must agree between containerd's result and the chain's output (module docstring):
    ``base`` is the chain's input (its cgroup rules are the common prefix)."""
    mounts = list(spec.get("mounts") or [])
    if sorted_mounts:
        mounts.sort(key=lambda e: (_depth(str(e.get("destination", ""))), str(e.get("destination", ""))))
    devices = sorted(_get(spec, ("linux", "devices"), []) or [], key=lambda d: json.dumps(d, sort_keys=True))
    return {
        "rest": rest(spec),
        "args": list(_get(spec, ("process", "args"), []) or []),
        # order-free: a process's environment is a map once its names are unique, which _env
        # requires of any env it adjusts (an unadjusted env is compared to itself)
        "env": sorted(str(e) for e in _get(spec, ("process", "env"), []) or []),
        "mounts": mounts,
        "annotations": dict(spec.get("annotations") or {}),
        "devices": devices,
        "rules": _granted(
            list(_get(base, ("linux", "resources", "devices"), []) or []),
            list(_get(spec, ("linux", "resources", "devices"), []) or []),
            what,
        ),
        "cpus": _get(spec, ("linux", "resources", "cpu", "cpus")),
        "seccomp": _get(spec, ("linux", "seccomp")),
    }


# --- the converter -----------------------------------------------------------------------------


def _annotations(before: Spec, after: Spec, adjust: nri.ContainerAdjustment) -> None:
    old, new = dict(before.get("annotations") or {}), dict(after.get("annotations") or {})
    for key, value in sorted(new.items()):
        if old.get(key) != value:
            adjust.annotations[key] = value
    for key in sorted(set(old) - set(new)):
        adjust.annotations[REMOVE + key] = ""


def _env(before: Spec, after: Spec, adjust: nri.ContainerAdjustment) -> None:
    old = _env_pairs(_get(before, ("process", "env"), []) or [])
    new = _env_pairs(_get(after, ("process", "env"), []) or [])
    if old == new:
        return
    for pairs, what in ((old, "input"), (new, "output")):
        names = [n for n, _ in pairs]
        if len(set(names)) != len(names):
            raise NotExpressible(f"the {what} env names a variable twice; NRI would collapse it")
        if any(v is None for _, v in pairs):
            raise NotExpressible(f"the {what} env has an entry without '='; NRI would drop it")
    current = dict(old)
    wanted = dict(new)
    dropped = sorted(name for name, _ in old if name not in wanted)
    if dropped:
        raise NotExpressible(
            f"the chain removed env {', '.join(dropped)}; containerd 2.2.7 ignores an NRI env removal "
            "(the variable would stay), so the container is refused"
        )
    for name, value in new:
        if current.get(name) != value:
            adjust.env.add(key=name, value=value or "")


def _keyed(entries: Iterable[Any], key: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for entry in entries:
        if isinstance(entry, Mapping) and isinstance(entry.get(key), str):
            out.setdefault(entry[key], entry)
    return out


def _mounts(before: Spec, after: Spec, adjust: nri.ContainerAdjustment) -> None:
    old, new = _keyed(before.get("mounts") or [], "destination"), _keyed(after.get("mounts") or [], "destination")
    for destination, entry in new.items():
        if old.get(destination) != entry:
            adjust.mounts.append(nri_mount(entry))
    for destination in old:
        if destination not in new:
            adjust.mounts.add(destination=REMOVE + destination)


def _devices(before: Spec, after: Spec, adjust: nri.ContainerAdjustment) -> None:
    old = _keyed(_get(before, ("linux", "devices"), []) or [], "path")
    new = _keyed(_get(after, ("linux", "devices"), []) or [], "path")
    for path, entry in new.items():
        if old.get(path) != entry:
            try:
                adjust.linux.devices.append(nri_device(entry))
            except (KeyError, TypeError, ValueError) as exc:
                raise NotExpressible(f"device {path}: {exc!r} is not a complete device entry") from None
    for path in old:
        if path not in new:
            adjust.linux.devices.add(path=REMOVE + path)


def _resources(before: Spec, after: Spec, adjust: nri.ContainerAdjustment) -> None:
    old_rules = list(_get(before, ("linux", "resources", "devices"), []) or [])
    new_rules = list(_get(after, ("linux", "resources", "devices"), []) or [])
    _granted(old_rules, new_rules, "output")
    automatic = [  # the rules NRI adds with the adjusted devices: not sent again
        {"allow": True, "type": d.type, "major": d.major, "minor": d.minor, "access": access_of(d)}
        for d in adjust.linux.devices
        if not d.path.startswith(REMOVE)
    ]
    for rule in new_rules[len(old_rules) :]:
        if rule in automatic:
            automatic.remove(rule)
            continue
        adjust.linux.resources.devices.append(nri_rule(rule))
    old_cpus = _get(before, ("linux", "resources", "cpu", "cpus"))
    new_cpus = _get(after, ("linux", "resources", "cpu", "cpus"))
    if new_cpus != old_cpus:
        if not isinstance(new_cpus, str) or not new_cpus:
            raise NotExpressible(f"the CPU set changed from {old_cpus!r} to {new_cpus!r}; NRI can only set one")
        adjust.linux.resources.cpu.cpus = new_cpus


def _seccomp(before: Spec, after: Spec, adjust: nri.ContainerAdjustment) -> None:
    old, new = _get(before, ("linux", "seccomp")), _get(after, ("linux", "seccomp"))
    if new == old:
        return
    if not isinstance(new, Mapping):
        raise NotExpressible("the seccomp profile was removed; NRI can only replace it")
    if "defaultErrnoRet" in new:
        raise NotExpressible("the seccomp profile sets defaultErrnoRet, which containerd's NRI drops")
    if any(isinstance(s, Mapping) and "errnoRet" in s for s in new.get("syscalls") or ()):
        raise NotExpressible("the seccomp profile sets errnoRet, which crashes containerd 2.2.7's NRI")
    try:
        adjust.linux.seccomp_policy.CopyFrom(nri_seccomp(new))
    except (KeyError, TypeError, ValueError) as exc:
        raise NotExpressible(f"the seccomp profile cannot be converted: {exc!r}") from None


def _args(before: Spec, after: Spec, adjust: nri.ContainerAdjustment) -> None:
    old, new = _get(before, ("process", "args"), []) or [], _get(after, ("process", "args"), []) or []
    if new != old:
        if not new:
            raise NotExpressible("the process args were emptied; NRI can only replace them")
        adjust.args.extend(str(a) for a in new)


def _cdi(before: Spec, after: Spec, adjust: nri.ContainerAdjustment) -> None:
    old = _get(before, ("annotations", CDI_ANNOTATION)) or ""
    new = _get(after, ("annotations", CDI_ANNOTATION)) or ""
    if new and new != old:
        adjust.CDI_devices.extend(nri.CDIDevice(name=n) for n in str(new).split(",") if n)


def _difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    for key in a:
        if a[key] != b.get(key):
            got, wanted = json.dumps(b.get(key), sort_keys=True)[:300], json.dumps(a[key], sort_keys=True)[:300]
            return f"{key}: {got} instead of {wanted}"
    return "?"


def adjustment_for(before: Spec, after: Spec) -> nri.ContainerAdjustment:
    """The adjustment that turns ``before`` (the chain's input) into ``after`` (its output) in
    containerd; :class:`NotExpressible` when no adjustment can (module docstring)."""
    if rest(before) != rest(after):
        wanted, was = rest(after), rest(before)
        raise NotExpressible(f"the chain changed a field NRI cannot adjust ({_difference(wanted, was)})")
    adjust = nri.ContainerAdjustment()
    for step in (_annotations, _env, _args, _mounts, _devices, _resources, _seccomp, _cdi):
        step(before, after, adjust)
    result = apply_adjustment(before, adjust)
    sort = bool(adjust.mounts)
    wanted = view(after, before, sorted_mounts=sort, what="output")
    got = view(result, before, sorted_mounts=False, what="NRI's result")
    if got != wanted:
        raise NotExpressible(f"NRI would not produce the chain's spec ({_difference(wanted, got)})")
    return adjust


__all__ = ["ADJUSTABLE", "NotExpressible", "access_of", "adjustment_for", "apply_adjustment", "rest", "view"]
