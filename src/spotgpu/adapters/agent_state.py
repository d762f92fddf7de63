"""The agent's lending record on disk: which owners are lent and what each taught the lending
model, for the next agent start.

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

Format (version 2): ``{"version": 2, "lent": [{"owner": "ns/pod/ctr", "devices": [...],
"containerId": ..., "since": <epoch seconds>}], "owners": {"ns/pod/ctr": {"idle": [32 numbers],
"observed": n, "strikes": s, "struckAt": <epoch seconds>}}}``: ``lent`` as in version 1 (which
still loads, with nothing learned), ``owners`` what each current owner taught the lending model
(:func:`spotgpu.core.idle_forecast.encode_history`; bounded: 32 numbers and a backoff per
owner, and only the node's current owners). An unreadable or malformed record loads as empty,
so the worst case is the old behaviour (the owner waits ``maxInactiveTime`` again, its history
starts from the prior), never a wrong loan.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from spotgpu.core.errors import TemporaryError, ValidationError
from spotgpu.core.idle_forecast import decode_history, encode_history
from spotgpu.core.ids import validate_device_id
from spotgpu.core.refs import ContainerRef
from spotgpu.ports.node import LearnedOwner, LentOwner
from spotgpu.util.fileio import write_atomic

log = logging.getLogger(__name__)

VERSION: Final = 2


def encode(lent: Sequence[LentOwner], learned: Mapping[ContainerRef, LearnedOwner] | None = None) -> bytes:
    entries = [
        {"owner": e.owner.format(), "devices": list(e.devices), "containerId": e.container_id, "since": e.since}
        for e in sorted(lent, key=lambda e: e.owner.format())
    ]
    owners = {o.format(): encode_history(v.history, v.backoff) for o, v in (learned or {}).items()}
    return json.dumps({"version": VERSION, "lent": entries, "owners": owners}, sort_keys=True).encode()


def decode(data: bytes) -> list[LentOwner]:
    """The lent owners in ``data``; raises :class:`ValidationError` naming what is wrong."""
    return decode_record(data)[0]


def decode_record(data: bytes) -> tuple[list[LentOwner], dict[ContainerRef, LearnedOwner]]:
    """The lent owners and the learned state in ``data``; raises :class:`ValidationError`."""
    try:
        doc: Any = json.loads(data)
    except ValueError as exc:
        raise ValidationError(f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") not in (1, VERSION) or not isinstance(doc.get("lent"), list):
        raise ValidationError(f"expected {{'version': {VERSION}, 'lent': [...], 'owners': {{...}}}}")
    result = [_lent(i, raw) for i, raw in enumerate(doc["lent"])]
    owners = doc.get("owners", {}) if doc["version"] == VERSION else {}
    if not isinstance(owners, dict):
        raise ValidationError("owners must be an object")
    learned = {}
    for key, raw in owners.items():
        owner = ContainerRef.parse(str(key))
        if owner.is_relative or not isinstance(raw, dict):
            raise ValidationError(f"owners[{key!r}] must name its namespace and hold an object")
        try:
            history, backoff = decode_history(raw)
        except ValidationError as exc:
            raise ValidationError(f"owners[{key!r}]: {exc}") from None
        learned[owner] = LearnedOwner(history, backoff)
    return result, learned


def _lent(i: int, raw: object) -> LentOwner:
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
    return LentOwner(owner, tuple(validate_device_id(d) for d in devices), container_id, float(since))


class LendStateFile:
    """A :class:`~spotgpu.ports.node.LendStore` in one JSON file (see module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[LentOwner]:
        return self._read()[0]

    def load_learned(self) -> dict[ContainerRef, LearnedOwner]:
        return self._read()[1]

    def _read(self) -> tuple[list[LentOwner], dict[ContainerRef, LearnedOwner]]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return [], {}
        except OSError as exc:
            log.warning("lending record %s unreadable (owners start as active): %s", self.path, exc.strerror)
            return [], {}
        try:
            return decode_record(data)
        except ValidationError as exc:
            log.warning("lending record %s is malformed (owners start as active): %s", self.path, exc)
            return [], {}

    def save(self, lent: Sequence[LentOwner], learned: Mapping[ContainerRef, LearnedOwner] | None = None) -> None:
        try:
            # no fsync: see the module docstring
            write_atomic(self.path, encode(lent, learned), mode=0o600, durable=False)
        except OSError as exc:
            raise TemporaryError(f"lending record {self.path}: {exc.strerror}") from None


__all__ = ["VERSION", "LendStateFile", "decode", "decode_record", "encode"]
