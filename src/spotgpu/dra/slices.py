"""The node's ResourceSlices: one pool named after the node, one device per spot twin.

Pure; no I/O. :func:`publication` names each twin's device (a DNS label, never truncated:
an ID that does not fit gets a hashed name, and the attributes carry the real IDs);
:func:`desired_slices` builds the slices' ``spec`` (attributes a CEL selector can use, the
memory capacity, the taints), and :func:`plan_pool` decides, as the Go helper's ResourceSlice
controller does (shared/reference/dra.md section 8.1), which slices to delete, update and create
and with which pool generation.

Taints (KEP-5055): ``spotgpu.io/not-lendable`` with effect ``NoSchedule`` while the twin may not
be given to spot work (no scheduler allocates it, running pods stay), and
``spotgpu.io/owner-returned`` with effect ``NoExecute`` from the owner's return until its
eviction is done (the device-taint eviction controller deletes the pods using it). Each taint
keeps the ``timeAdded`` it was first published with while its (key, value, effect) is unchanged:
a new one would restart the ``tolerationSeconds`` clock.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from spotgpu.core.ids import DeviceID, NodeName
from spotgpu.dra.claim import DriverName

JSON = dict[str, Any]

NOT_LENDABLE_TAINT: Final = "spotgpu.io/not-lendable"
OWNER_RETURNED_TAINT: Final = "spotgpu.io/owner-returned"
MAX_DEVICES_PER_SLICE: Final = 64
"""With taints the API allows 64 devices per slice (128 without)."""
MAX_ATTRIBUTE_STRING: Final = 64
API_VERSION: Final = "resource.k8s.io/v1"
_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class TwinState(StrEnum):
    LENDABLE = "lendable"
    NOT_LENDABLE = "not-lendable"
    RETURNING = "returning"
    """The owner is back and its eviction is not done."""


@dataclass(frozen=True, slots=True)
class TwinDevice:
    """One spot twin as the agent sees it."""

    twin: DeviceID
    """``spot-GPU-x`` or a shared replica ``spot-GPU-x::<n>``."""
    real: DeviceID
    state: TwinState
    shared: bool = False
    model: str = ""
    memory_bytes: int | None = None
    numa_node: int | None = None
    idle_forecast_s: int | None = None
    """The owner's forecast idle time (seconds) while lent; None when there is none."""


@dataclass(frozen=True, slots=True)
class Publication:
    """The devices of the node's pool: device name -> twin, in the order given."""

    devices: tuple[tuple[str, TwinDevice], ...]
    unpublishable: tuple[tuple[DeviceID, str], ...] = ()
    """Twins left out, with the reason (two twins whose names collide: neither is published)."""

    def twin_of(self, device_name: str) -> TwinDevice | None:
        return next((t for name, t in self.devices if name == device_name), None)

    def name_of(self, twin: DeviceID) -> str | None:
        return next((name for name, t in self.devices if t.twin == twin), None)


def device_name(twin: str) -> str:
    """The DNS-label device name of ``twin``: lowercased, ``::`` as ``-r``; a hashed name
    (``spot-h<24 hex>``) when that is no DNS label of at most 63 characters."""
    name = twin.lower().replace("::", "-r")
    if len(name) <= 63 and _LABEL.fullmatch(name) is not None:
        return name
    return "spot-h" + hashlib.sha256(twin.encode()).hexdigest()[:24]


def publication(twins: Sequence[TwinDevice]) -> Publication:
    """Name every twin; twins whose names collide (``GPU-A`` and ``gpu-a``) are all left out."""
    by_name: dict[str, list[TwinDevice]] = {}
    for t in twins:
        by_name.setdefault(device_name(t.twin), []).append(t)
    kept = tuple((name, ts[0]) for name, ts in by_name.items() if len(ts) == 1)
    dropped = tuple(
        (t.twin, f"its device name {name!r} collides with {', '.join(o.twin for o in ts if o is not t)}")
        for name, ts in by_name.items()
        if len(ts) > 1
        for t in ts
    )
    return Publication(kept, dropped)


def _attributes(t: TwinDevice) -> JSON:
    attrs: JSON = {"uuid": {"string": t.real}, "twin": {"string": t.twin}}
    attrs["sharing"] = {"string": "shared" if t.shared else "exclusive"}
    if t.model and len(t.model) <= MAX_ATTRIBUTE_STRING:
        attrs["model"] = {"string": t.model}
    if t.numa_node is not None:
        attrs["numaNode"] = {"int": t.numa_node}
    if t.idle_forecast_s is not None:
        attrs["idleForecastSeconds"] = {"int": t.idle_forecast_s}
    return attrs


TaintTimes = Mapping[tuple[str, str, str], str]
"""``(device name, taint key, effect) -> timeAdded`` as stored."""


def _taints(name: str, t: TwinDevice, now: str, times: TaintTimes) -> list[JSON]:
    wanted: list[tuple[str, str]] = []
    if t.state is not TwinState.LENDABLE:
        wanted.append((NOT_LENDABLE_TAINT, "NoSchedule"))
    if t.state is TwinState.RETURNING:
        wanted.append((OWNER_RETURNED_TAINT, "NoExecute"))
    return [
        {"key": key, "value": t.state.value, "effect": effect, "timeAdded": times.get((name, key, effect), now)}
        for key, effect in wanted
    ]


def device_json(name: str, t: TwinDevice, now: str, times: TaintTimes) -> JSON:
    device: JSON = {"name": name, "attributes": _attributes(t)}
    if t.memory_bytes is not None:
        device["capacity"] = {"memory": {"value": str(t.memory_bytes)}}
    taints = _taints(name, t, now, times)
    if taints:
        device["taints"] = taints
    return device


def desired_slices(pub: Publication, now: str, times: TaintTimes) -> list[list[JSON]]:
    """The device lists of the pool's slices, in order (at least one slice, maybe empty)."""
    devices = [device_json(name, t, now, times) for name, t in pub.devices]
    chunks = [devices[i : i + MAX_DEVICES_PER_SLICE] for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)]
    return chunks or [[]]


def taint_times(existing: Sequence[JSON]) -> dict[tuple[str, str, str], str]:
    """The ``timeAdded`` of every taint in the stored slices."""
    out: dict[tuple[str, str, str], str] = {}
    for obj in existing:
        for device in (obj.get("spec") or {}).get("devices") or ():
            for taint in device.get("taints") or ():
                if isinstance(taint.get("timeAdded"), str):
                    out[(device.get("name", ""), taint.get("key", ""), taint.get("effect", ""))] = taint["timeAdded"]
    return out


@dataclass(frozen=True, slots=True)
class NodeOwner:
    name: NodeName
    uid: str


@dataclass(frozen=True, slots=True)
class SlicePlan:
    """What to write, in this order: deletes (by name, with UID and resourceVersion
    preconditions), then updates (full objects carrying their resourceVersion), then creates."""

    generation: int
    deletes: tuple[tuple[str, str, str], ...] = ()
    updates: tuple[JSON, ...] = ()
    creates: tuple[JSON, ...] = ()
    unchanged: tuple[str, ...] = field(default=())

    @property
    def empty(self) -> bool:
        return not (self.deletes or self.updates or self.creates)


def slice_prefix(index: int, driver: DriverName, node: NodeName) -> str:
    """``generateName`` of slice ``index``: ``<index, 5 hex digits>-<driver>-<node>-`` (helper >= 1.36)."""
    return f"{index:05x}-{driver}-{node}-"


def _index(name: str, driver: DriverName, node: NodeName) -> int | None:
    head, sep, rest = name.partition("-")
    if not sep or len(head) != 5 or re.fullmatch(r"[0-9a-f]{5}", head) is None:
        return None
    if not rest.startswith(f"{driver}-{node}-"):
        return None
    return int(head, 16)


def _spec(driver: DriverName, node: NodeName, generation: int, count: int, devices: list[JSON]) -> JSON:
    return {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
        "devices": devices,
    }


def _same(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    keys = ("driver", "nodeName", "devices")
    if any((stored.get(k) or None) != (wanted.get(k) or None) for k in keys):
        return False
    pool, want = stored.get("pool") or {}, wanted["pool"]
    return bool(pool.get("name") == want["name"] and pool.get("resourceSliceCount") == want["resourceSliceCount"])


def plan_pool(
    existing: Sequence[JSON], desired: Sequence[list[JSON]], driver: DriverName, owner: NodeOwner
) -> SlicePlan:
    """The writes that make the stored slices of our pool ``desired`` (the Go helper's rules)."""
    node = owner.name
    current = max((int(((o.get("spec") or {}).get("pool") or {}).get("generation") or 0) for o in existing), default=0)
    matched: dict[int, JSON] = {}
    obsolete: list[JSON] = []
    for obj in sorted(existing, key=lambda o: str(o["metadata"]["name"])):
        gen = int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)
        index = _index(str(obj["metadata"]["name"]), driver, node)
        if gen < current or index is None or index >= len(desired) or index in matched:
            obsolete.append(obj)
        else:
            matched[index] = obj
    specs = [_spec(driver, node, current, len(desired), devices) for devices in desired]
    changed = [i for i, obj in matched.items() if not _same(obj.get("spec") or {}, specs[i])]
    missing = [i for i in range(len(desired)) if i not in matched]
    bump = current == 0 or bool(missing) or len(changed) > 1
    generation = current + 1 if bump else current
    ref = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner.uid, "controller": True}
    updates: list[JSON] = []
    for i, obj in sorted(matched.items()):
        if bump or i in changed:
            meta = {**obj["metadata"], "ownerReferences": [ref]}
            spec = _spec(driver, node, generation, len(desired), desired[i])
            updates.append({"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta, "spec": spec})
    creates = tuple(
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"generateName": slice_prefix(i, driver, node), "ownerReferences": [ref]},
            "spec": _spec(driver, node, generation, len(desired), desired[i]),
        }
        for i in missing
    )
    deletes = tuple(
        (str(o["metadata"]["name"]), str(o["metadata"].get("uid", "")), str(o["metadata"].get("resourceVersion", "")))
        for o in obsolete
    )
    unchanged = tuple(str(matched[i]["metadata"]["name"]) for i in sorted(matched) if not bump and i not in changed)
    return SlicePlan(generation, deletes, tuple(updates), creates, unchanged)


__all__ = [
    "API_VERSION",
    "MAX_DEVICES_PER_SLICE",
    "NOT_LENDABLE_TAINT",
    "OWNER_RETURNED_TAINT",
    "NodeOwner",
    "Publication",
    "SlicePlan",
    "TaintTimes",
    "TwinDevice",
    "TwinState",
    "desired_slices",
    "device_json",
    "device_name",
    "plan_pool",
    "publication",
    "slice_prefix",
    "taint_times",
]
