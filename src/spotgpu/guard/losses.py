"""The fd holder's loss accounting: which notify fds were lost, and the ledger that shows it.

Decides which recorded fds count as lost (with :func:`spotgpu.guard.ledger.unreturned`): a fd
the last holder recorded, whose process still runs, and that neither runc, a predecessor nor a
re-attaching guard brought back within ``guard_timeout`` + :data:`SUSPECT_SLACK`. Side effects:
reads and writes the ledger file, reads ``/proc`` (is a process still the same one), logs each
loss as an error. Sending the list to the guard and the standby is the holder's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Final

from spotgpu.core.clock import Clock
from spotgpu.guard import handover, ledger
from spotgpu.guard.ledger import LedgerEntry

log = logging.getLogger(__name__)

SUSPECT_SLACK: Final = 1.0
"""Beyond ``guard_timeout``: how long a new holder waits for a guard to bring back the fds the
ledger recorded before it reports them lost (a live guard re-attaches within 0.5 s)."""
PRUNE_INTERVAL: Final = 2.0
"""How often the processes behind lost fds are checked (dropped from the list once gone)."""


class Losses:
    """Suspected and lost fds, and whether the ledger must be written again (``dirty``)."""

    def __init__(self, path: Path, clock: Clock, guard_timeout: float) -> None:
        self.path = path
        self._clock = clock
        self._wait = guard_timeout + SUSPECT_SLACK
        self._suspects: dict[str, LedgerEntry] = {}
        self.suspects_until: float | None = None
        self._lost: dict[str, LedgerEntry] = {}
        self._next_prune = 0.0
        self.dirty = False
        self._warned = False

    def lost(self) -> list[LedgerEntry]:
        return list(self._lost.values())

    def messages(self) -> list[bytes]:
        """The ``lost`` messages that replace a receiver's list with ours."""
        return handover.lost_messages(self.lost())

    def replace(self, entries: Iterable[LedgerEntry], *, first: bool = True) -> None:
        """Take a list from a predecessor or (in chunks, ``first`` starting anew) from the primary."""
        if first:
            self._lost = {}
        self._lost.update((e.key, e) for e in entries)

    def returned(self, key: str, container_id: str) -> bool:
        """A fd came (back) here. True when it was counted lost: the list changed."""
        self._suspects.pop(key, None)
        if self._lost.pop(key, None) is None:
            return False
        log.warning("guard holder: the notify fd of %s came back after all; it is not lost", container_id)
        return True

    def load_suspects(self, have: Collection[str]) -> None:
        """After a start without a complete handover: which fds did the last holder hold that
        are not here? A live guard brings them back within its reconnect interval."""
        book = ledger.read(self.path)
        if book is None:
            return
        self._suspects = ledger.unreturned([*book.held, *book.lost], have, ledger.is_running)
        if self._suspects:
            self.suspects_until = self._clock.monotonic() + self._wait
            log.info(
                "guard holder: the previous holder (pid %d) held %d notify fds of running processes that are "
                "not here; waiting %.1fs for a guard to bring them back",
                book.holder_pid,
                len(self._suspects),
                self._wait,
            )

    def forget_suspects(self) -> None:
        """Handed over: the successor does the accounting now."""
        self._suspects, self.suspects_until = {}, None

    def check_suspects(self, have: Collection[str]) -> bool:
        """Once the wait is over: count the suspects still missing as lost. True when some were."""
        if self.suspects_until is None or self._clock.monotonic() < self.suspects_until:
            return False
        self.suspects_until = None
        lost = ledger.unreturned(self._suspects.values(), have, ledger.is_running)
        self._suspects = {}
        if not lost:
            return False
        self._lost.update(lost)
        for entry in lost.values():
            log.error(
                "guard holder: the notify fd of %s %s (pid %d, owner %s) was LOST: its holder and guard died "
                "together; its caught GPU session starts fail with ENOSYS until the container restarts",
                "exec in" if entry.info.exec else "container",
                entry.info.container_id,
                entry.info.pid,
                entry.info.owner or "unknown",
            )
        return True

    def prune(self) -> bool:
        """Drop lost fds whose process has exited (at most every :data:`PRUNE_INTERVAL`). True
        when the list changed."""
        now = self._clock.monotonic()
        if not self._lost or now < self._next_prune:
            return False
        self._next_prune = now + PRUNE_INTERVAL
        gone = [key for key, entry in self._lost.items() if not ledger.is_running(entry)]
        for key in gone:
            log.info(
                "guard holder: %s exited; its lost notify fd no longer matters", self._lost.pop(key).info.container_id
            )
        return bool(gone)

    def write(self, held: Iterable[LedgerEntry]) -> None:
        """Write the ledger if anything changed since the last write (a failure is warned once)."""
        if not self.dirty:
            return
        self.dirty = False
        book = ledger.Ledger(os.getpid(), tuple(held), tuple(self._lost.values()))
        try:
            ledger.write(self.path, book)
        except OSError as exc:
            if not self._warned:
                log.warning("guard holder: cannot write the fd ledger %s: %s (losses go unreported)", self.path, exc)
                self._warned = True


__all__ = ["PRUNE_INTERVAL", "SUSPECT_SLACK", "Losses"]
