"""The notify fds a process holds: one table for the fd holder and the guard.

Decides nothing. Each notify fd is known by its key (runc's connection, named once by the
holder and carried with every copy) and by its fd number (what epoll reports); the table keeps
both indexes in step, refuses a second copy of a key (the duplicate fd is closed at once, so a
copy is never leaked) and closes every fd it drops. Side effects: ``close(2)`` of those fds,
``is_notify_fd`` checks, and the ``watch``/``unwatch`` callbacks its owner gives it (its
event loop's registration).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, KeysView
from dataclasses import dataclass

from spotgpu.core.refs import ContainerRef
from spotgpu.guard import seccomp
from spotgpu.guard.ledger import LedgerEntry
from spotgpu.guard.listener import NotifyFdInfo


@dataclass(frozen=True, slots=True)
class HeldFd:
    fd: int
    info: NotifyFdInfo
    start_time: int = 0
    """Of the fd's process (:func:`spotgpu.guard.ledger.process_start_time`); 0 when unknown."""

    @property
    def key(self) -> str:
        return self.info.key

    @property
    def entry(self) -> LedgerEntry:
        return LedgerEntry(self.info, self.start_time)


class NotifyFds:
    """The notify fds held here, by key and by fd number.

    ``watch(fd)`` runs after an fd is added, ``unwatch(fd)`` before one is closed.
    """

    def __init__(self, watch: Callable[[int], None], unwatch: Callable[[int], None]) -> None:
        self._watch = watch
        self._unwatch = unwatch
        self._by_key: dict[str, HeldFd] = {}
        self._by_fd: dict[int, str] = {}

    def adopt(self, fd: int, info: NotifyFdInfo, start_time: int = 0, *, verify: bool = False) -> HeldFd | None:
        """Hold ``fd``; None (and ``fd`` closed) when its key is held already or, with ``verify``,
        when it is not a seccomp notify fd (a peer sent something else)."""
        if info.key in self._by_key or (verify and not seccomp.is_notify_fd(fd)):
            os.close(fd)
            return None
        held = HeldFd(fd, info, start_time)
        self._by_key[info.key] = held
        self._by_fd[fd] = info.key
        self._watch(fd)
        return held

    def pop(self, key: str) -> HeldFd:
        """Remove ``key`` from the table but leave its fd open (:meth:`discard` closes it)."""
        held = self._by_key.pop(key)
        del self._by_fd[held.fd]
        return held

    def discard(self, held: HeldFd) -> None:
        """Stop watching and close an fd :meth:`pop` removed."""
        self._unwatch(held.fd)
        with contextlib.suppress(OSError):
            os.close(held.fd)

    def drop(self, key: str) -> HeldFd:
        held = self.pop(key)
        self.discard(held)
        return held

    def close(self) -> None:
        """Drop every fd."""
        for key in list(self._by_key):
            self.drop(key)

    def get(self, key: str) -> HeldFd | None:
        return self._by_key.get(key)

    def by_fd(self, fd: int) -> HeldFd | None:
        key = self._by_fd.get(fd)
        return None if key is None else self._by_key[key]

    def owned_by(self, owner: ContainerRef) -> bool:
        """Some process of ``owner`` runs under the rule and its fd is here."""
        return any(h.info.owner == owner for h in self._by_key.values())

    def keys(self) -> KeysView[str]:
        return self._by_key.keys()

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __iter__(self) -> Iterator[HeldFd]:
        return iter(list(self._by_key.values()))

    def __len__(self) -> int:
        return len(self._by_key)


__all__ = ["HeldFd", "NotifyFds"]
