"""The agent's lending record on disk: which owners are lent, for the next agent start.

Decides nothing (the solver decides what is lent and, after a restart, whether a recorded
loan still holds). Side effects: :meth:`LendStateFile.save` writes one file atomically
(temporary file in the same directory, then rename: a reader sees the old or the new record,
never a torn one); :meth:`LendStateFile.load` reads it. There is no ``fsync``: the record
protects against agent crashes and restarts (the page cache survives those), not against
power loss, after which it is meant to be gone anyway; and a save lies on a returning owner's
path (it is written before the owner is released), where a disk flush must not be.

Why a file (and where): after an agent restart an owner that was lent with no spot user yet
looked like any other owner, so it waited ``maxInactiveTime`` again before its GPUs could be
lent. Spot users on its GPUs prove a loan by themselves, but an idle owner without users left
no trace. The record lives next to the agent's sockets (``/run/spotgpu``, a host tmpfs the
agent already mounts): it survives agent restarts and upgrades, and a node reboot, after which
every container is new anyway, forgets it. The node annotation was the alternative; reading it
back needs the API server at start, which recovery should not depend on.

Format: ``{"version": 1, "lent": [{"owner": "ns/pod/ctr", "devices": [...], "containerId": ...,
"since": <epoch seconds>}]}``. An unreadable or malformed record loads as empty, so the worst
case is the old behaviour (the owner waits ``maxInactiveTime`` again), never a wrong loan.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from spotgpu.agent.node_ports import LentOwner
from spotgpu.core.errors import TemporaryError, ValidationError
from spotgpu.core.ids import validate_device_id
from spotgpu.core.refs import ContainerRef
from spotgpu.util.fileio import write_atomic

log = logging.getLogger(__name__)

VERSION: Final = 1


def encode(lent: Sequence[LentOwner]) -> bytes:
    entries = [
        {"owner": e.owner.format(), "devices": list(e.devices), "containerId": e.container_id, "since": e.since}
        for e in sorted(lent, key=lambda e: e.owner.format())
    ]
    return json.dumps({"version": VERSION, "lent": entries}, sort_keys=True).encode()


def decode(data: bytes) -> list[LentOwner]:
    """The record in ``data``; raises :class:`ValidationError` naming what is wrong."""
    try:
        doc: Any = json.loads(data)
    except ValueError as exc:
        raise ValidationError(f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("lent"), list):
        raise ValidationError(f"expected {{'version': {VERSION}, 'lent': [...]}}")
    result = []
    for i, raw in enumerate(doc["lent"]):
        if not isinstance(raw, dict):
            raise ValidationError(f"lent[{i}] must be an object")
        owner = ContainerRef.parse(str(raw.get("owner")))
        if owner.is_relative:
            raise ValidationError(f"lent[{i}].owner {raw.get('owner')!r} must name its namespace")
        devices = raw.get("devices")
        if not isinstance(devices, list) or not devices:
            raise ValidationError(f"lent[{i}].devices must be a non-empty list")
        container_id = raw.get("containerId")
        since = raw.get("since")
        if container_id is not None and not isinstance(container_id, str):
            raise ValidationError(f"lent[{i}].containerId must be a string or null")
        if not isinstance(since, int | float) or isinstance(since, bool):
            raise ValidationError(f"lent[{i}].since must be a number")
        result.append(LentOwner(owner, tuple(validate_device_id(d) for d in devices), container_id, float(since)))
    return result


class LendStateFile:
    """A :class:`~spotgpu.agent.node_ports.LendStore` in one JSON file (see module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[LentOwner]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("lending record %s unreadable (owners start as active): %s", self.path, exc.strerror)
            return []
        try:
            return decode(data)
        except ValidationError as exc:
            log.warning("lending record %s is malformed (owners start as active): %s", self.path, exc)
            return []

    def save(self, lent: Sequence[LentOwner]) -> None:
        try:
            write_atomic(self.path, encode(lent), mode=0o600, durable=False)  # no fsync: see the module docstring
        except OSError as exc:
            raise TemporaryError(f"lending record {self.path}: {exc.strerror}") from None


__all__ = ["VERSION", "LendStateFile", "decode", "encode"]
