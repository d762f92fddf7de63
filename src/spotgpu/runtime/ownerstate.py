"""The agent's owner record as a file, for spotgpu-runtime's ``local`` fallback.

Decides nothing. Side effects: :func:`write_owner_state` writes one file atomically (temporary
file in the same directory, ``fsync``, rename), so a reader sees the old or the new record,
never a torn one; :class:`OwnerStateFile` reads it once per instance.

Format: ``{"version": 1, "owners": <MappingSnapshot.to_json()>}``. The agent should call
:func:`write_owner_state` after every change of its MappingCache's owners (the runtime needs
owners only; users may be left out). A record that is missing or unreadable makes every
synced device "owner unknown", so the local fallback refuses syncs rather than guessing.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Final

from spotgpu.core.errors import TemporaryError, ValidationError
from spotgpu.core.ids import DeviceID
from spotgpu.core.mapping_cache import MappingSnapshot, Owner
from spotgpu.util.fileio import write_atomic

VERSION: Final = 1


def write_owner_state(path: Path, snapshot: MappingSnapshot) -> None:
    """Write ``snapshot``'s owners to ``path`` atomically (mode 0644)."""
    data = json.dumps({"version": VERSION, "owners": snapshot.to_json()}, sort_keys=True).encode()
    write_atomic(path, data, mode=0o644)


def read_owner_state(path: Path) -> MappingSnapshot:
    """The snapshot in ``path``; :class:`TemporaryError` when unreadable, ValidationError when malformed."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TemporaryError(f"owner record {path}: {exc.strerror}") from None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ValidationError(f"owner record {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValidationError(f"owner record {path}: expected version {VERSION}")
    return MappingSnapshot.from_json(data.get("owners"))


class OwnerStateFile:
    """Owners from the agent's record file, read on first use."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._owners: dict[DeviceID, Owner] | None = None

    def owner_of(self, device: DeviceID) -> Owner | None:
        with self._lock:
            if self._owners is None:
                snapshot = read_owner_state(self.path)
                self._owners = {d.device: e.owner for e in snapshot.owners for d in e.devices}
            return self._owners.get(device)


__all__ = ["VERSION", "OwnerStateFile", "read_owner_state", "write_owner_state"]
