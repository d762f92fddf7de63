"""The fd holder's ledger: which notify fds the node's holder held, so that a loss is noticed.

If the holder and the guard die together (both SIGKILLed, with no successor holder), the last
copies of the owners' notify fds close and each owner's next GPU session start fails with
ENOSYS until the container restarts (seccomp(2)); nothing can re-attach a listener to a filter.
What can be done is to *know*: the primary holder keeps this ledger next to its control socket
(``/run/spotgpu/fd-holder.ledger``, a tmpfs, so a reboot clears it with the containers), and a
holder that starts without a complete handover compares it with the fds that reach it
(from runc, a predecessor or a re-attaching guard). Entries whose process still runs and whose
fd never came back are reported as lost (log, ``lost`` message to the guard, metric there).

Encoding, decoding and :func:`unreturned` are pure; :func:`read`, :func:`write` and
:func:`process_start_time` touch files.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from spotgpu.core.errors import ValidationError
from spotgpu.guard.listener import NotifyFdInfo
from spotgpu.util.fileio import write_atomic

log = logging.getLogger(__name__)

LEDGER_VERSION: Final = 1
MAX_LEDGER_BYTES: Final = 8 << 20


class LedgerError(ValidationError):
    """The ledger file or a ledger entry on the wire is malformed."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """A notify fd as the ledger records it: its info and the start time of its process, so
    that a reused PID is never mistaken for the same process."""

    info: NotifyFdInfo
    start_time: int
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks after boot); 0 when it could not be read."""

    @property
    def key(self) -> str:
        return self.info.key

    def to_wire(self) -> dict[str, Any]:
        return {**self.info.to_wire(), "start_time": self.start_time}

    @classmethod
    def from_wire(cls, data: object) -> LedgerEntry:
        if not isinstance(data, dict):
            raise LedgerError(f"ledger entry: expected an object, got {data!r}")
        start = data.get("start_time", 0)
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise LedgerError(f"ledger entry: start_time must be a non-negative integer, got {start!r}")
        try:
            info = NotifyFdInfo.from_wire({k: v for k, v in data.items() if k != "start_time"})
        except ValidationError as exc:
            raise LedgerError(f"ledger entry: {exc}") from None
        return cls(info, start)


@dataclass(frozen=True, slots=True)
class Ledger:
    holder_pid: int
    held: tuple[LedgerEntry, ...] = ()
    lost: tuple[LedgerEntry, ...] = ()


def encode(ledger: Ledger) -> bytes:
    return json.dumps(
        {
            "version": LEDGER_VERSION,
            "holder_pid": ledger.holder_pid,
            "held": [e.to_wire() for e in ledger.held],
            "lost": [e.to_wire() for e in ledger.lost],
        },
        separators=(",", ":"),
    ).encode()


def decode(data: bytes) -> Ledger:
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise LedgerError(f"ledger is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise LedgerError(f"ledger: expected an object, got {type(obj).__name__}")
    if obj.get("version") != LEDGER_VERSION:
        raise LedgerError(f"ledger: unknown version {obj.get('version')!r}")
    pid = obj.get("holder_pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
        raise LedgerError(f"ledger: holder_pid must be a non-negative integer, got {pid!r}")
    lists = []
    for name in ("held", "lost"):
        items = obj.get(name, [])
        if not isinstance(items, list):
            raise LedgerError(f"ledger: {name} must be a list")
        lists.append(tuple(LedgerEntry.from_wire(item) for item in items))
    return Ledger(pid, lists[0], lists[1])


def path_for(control_path: Path) -> Path:
    """The ledger lives next to the holder's control socket: ``fd-holder.sock`` ->
    ``fd-holder.ledger``."""
    return control_path.with_suffix(".ledger")


def read(path: Path) -> Ledger | None:
    """The ledger at ``path``; None when there is none. A damaged ledger is logged and ignored
    (it only serves to report losses; it never decides what the holder does with an fd)."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_LEDGER_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("guard holder: cannot read the fd ledger %s: %s", path, exc)
        return None
    try:
        if len(data) > MAX_LEDGER_BYTES:
            raise LedgerError(f"ledger larger than {MAX_LEDGER_BYTES} bytes")
        return decode(data)
    except LedgerError as exc:
        log.warning("guard holder: ignoring the damaged fd ledger %s: %s", path, exc)
        return None


def write(path: Path, ledger: Ledger) -> None:
    """Replace the ledger atomically (a private temporary file, then a rename). Not flushed to
    the disk: the holder writes it from the loop that answers calls, where a disk flush must not
    be, and the ledger lives on a tmpfs that a reboot clears along with the containers anyway."""
    write_atomic(path, encode(ledger), mode=0o600, durable=False, make_parents=False)


def process_start_time(pid: int, proc: Path = Path("/proc")) -> int | None:
    """Field 22 (``starttime``) of ``/proc/<pid>/stat``; None when the process is gone."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # fields from 3 (state) on; comm may contain spaces
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def is_running(entry: LedgerEntry, proc: Path = Path("/proc")) -> bool:
    """The entry's process still runs (same PID, same start time)."""
    started = process_start_time(entry.info.pid, proc)
    return started is not None and entry.start_time in (0, started)


def unreturned(
    recorded: Iterable[LedgerEntry], have: Collection[str], running: Callable[[LedgerEntry], bool]
) -> dict[str, LedgerEntry]:
    """Recorded fds that are not among the keys ``have`` and whose process still runs: their
    filters outlive their listener, so those processes' caught calls fail with ENOSYS."""
    return {e.key: e for e in recorded if e.key not in have and running(e)}


__all__ = [
    "LEDGER_VERSION",
    "Ledger",
    "LedgerEntry",
    "LedgerError",
    "decode",
    "encode",
    "is_running",
    "path_for",
    "process_start_time",
    "read",
    "unreturned",
    "write",
]
