"""CDI spec content for a prepared claim (Container Device Interface, shared/reference/dra.md 7.1).

Pure; no I/O. One spec per claim, kind ``k8s.<driver>/claim`` (the DRA drivers' convention),
one CDI device per allocated device named ``<claim UID>-<device name>`` (unique per claim, so a
runtime never meets a stale cached entry). Each device's edits are what the vendor's device
plugin ``Allocate`` returns for the real GPU (device nodes, env, mounts), as the runtime's
device sync applies them, plus ``SPOTGPU_DRA_DEVICE_<n>=<real ID>`` naming the lent GPU (also
keeping the edits non-empty: CDI rejects a device without edits). ``cdiVersion`` is 0.5.0, the
least the content needs (``hostPath`` and names that start with a digit; containerd 2.2.0
accepts at most 1.0.0).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from spotgpu.core.ids import DeviceID
from spotgpu.dra.claim import ClaimUID, DriverName
from spotgpu.ports.lookup import Allocation

CDI_VERSION: Final = "0.5.0"
CDI_CLASS: Final = "claim"
_NAME: Final = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")


@dataclass(frozen=True, slots=True)
class CdiDevice:
    """One device of a claim's spec: its allocated device name, the real GPU, the vendor's edits."""

    device: str
    real: DeviceID
    allocation: Allocation


def cdi_kind(driver: DriverName) -> str:
    return f"k8s.{driver}/{CDI_CLASS}"


def cdi_device_name(claim: ClaimUID, device: str) -> str:
    name = f"{claim}-{device}"
    if _NAME.fullmatch(name) is None:
        raise ValueError(f"CDI device name {name!r} is not valid")
    return name


def qualified(driver: DriverName, claim: ClaimUID, device: str) -> str:
    """The fully qualified CDI name the kubelet gets: ``k8s.<driver>/claim=<uid>-<device>``."""
    return f"{cdi_kind(driver)}={cdi_device_name(claim, device)}"


def spec_file_name(driver: DriverName, claim: ClaimUID) -> str:
    """``<vendor>-<class>_<claim UID>.json`` (the CDI library's transient-spec naming)."""
    return f"k8s.{driver}-{CDI_CLASS}_{claim}.json"


def _edits(index: int, d: CdiDevice) -> dict[str, Any]:
    a = d.allocation
    env = [f"{k}={v}" for k, v in a.envs] + [f"SPOTGPU_DRA_DEVICE_{index}={d.real}"]
    edits: dict[str, Any] = {"env": env}
    if a.devices:
        edits["deviceNodes"] = [
            {"path": n.container_path, "hostPath": n.host_path, "permissions": n.permissions} for n in a.devices
        ]
    if a.mounts:
        edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"],
            }
            for m in a.mounts
        ]
    return edits


def claim_spec(driver: DriverName, claim: ClaimUID, devices: Sequence[CdiDevice]) -> dict[str, Any]:
    """The spec for ``devices`` of ``claim`` (at least one: CDI rejects a spec without devices)."""
    if not devices:
        raise ValueError("a CDI spec needs at least one device")
    return {
        "cdiVersion": CDI_VERSION,
        "kind": cdi_kind(driver),
        "devices": [
            {"name": cdi_device_name(claim, d.device), "containerEdits": _edits(i, d)} for i, d in enumerate(devices)
        ],
    }


__all__ = [
    "CDI_CLASS",
    "CDI_VERSION",
    "CdiDevice",
    "cdi_device_name",
    "cdi_kind",
    "claim_spec",
    "qualified",
    "spec_file_name",
]
