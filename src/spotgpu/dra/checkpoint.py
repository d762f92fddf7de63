"""The prepared claims, kept in a file so a restarted plugin answers the same.

Side effects: one JSON file, replaced atomically and durably on every change
(:func:`spotgpu.util.fileio.write_atomic`). A file that cannot be read or parsed is an error at
start (the driver must not forget what it prepared: Unprepare has no API access to find out).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from spotgpu.core.errors import PermanentError
from spotgpu.core.ids import DeviceID
from spotgpu.dra.claim import ClaimKey, ClaimUID
from spotgpu.util.fileio import write_atomic

VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    real: DeviceID
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    key: ClaimKey
    devices: tuple[PreparedDevice, ...]
    spec_file: str | None
    """The CDI spec file written for it (None: only vendor CDI devices)."""


def _dump(c: PreparedClaim) -> dict[str, Any]:
    return {
        "namespace": c.key.namespace,
        "name": c.key.name,
        "uid": c.key.uid,
        "specFile": c.spec_file,
        "devices": [
            {"request": d.request, "pool": d.pool, "device": d.device, "real": d.real, "cdiIds": list(d.cdi_ids)}
            for d in c.devices
        ],
    }


def _load(e: Mapping[str, Any]) -> PreparedClaim:
    return PreparedClaim(
        ClaimKey(str(e["namespace"]), str(e["name"]), ClaimUID(str(e["uid"]))),
        tuple(
            PreparedDevice(
                str(d["request"]),
                str(d["pool"]),
                str(d["device"]),
                DeviceID(str(d["real"])),
                tuple(str(i) for i in d["cdiIds"]),
            )
            for d in e["devices"]
        ),
        None if e.get("specFile") is None else str(e["specFile"]),
    )


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[ClaimUID, PreparedClaim]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(text)
            if doc.get("version") != VERSION:
                raise ValueError(f"version {doc.get('version')!r}, expected {VERSION}")
            claims = [_load(e) for e in doc["claims"]]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PermanentError(f"DRA checkpoint {self.path} is unreadable: {exc}") from exc
        return {c.key.uid: c for c in claims}

    def save(self, claims: Mapping[ClaimUID, PreparedClaim]) -> None:
        doc = {"version": VERSION, "claims": [_dump(c) for _, c in sorted(claims.items())]}
        write_atomic(self.path, (json.dumps(doc, indent=1) + "\n").encode(), mode=0o600, durable=True)


__all__ = ["Checkpoint", "PreparedClaim", "PreparedDevice"]
