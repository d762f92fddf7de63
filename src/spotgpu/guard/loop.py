"""One epoll loop with a wakeup fd: what the fd holder and the guard both run on.

Decides nothing. Side effects: an ``epoll`` instance and an ``eventfd`` that other threads (and
signal handlers) write to wake the loop. Each watched fd has one handler, called on the loop's
thread with ``(fd, mask)``; a handler that raises is logged and never ends the loop, because
both processes that use it keep notify fds whose callers wait for an answer.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
from collections.abc import Callable

log = logging.getLogger(__name__)

Handler = Callable[[int, int], None]
"""Called with the fd and the epoll event mask."""


class EventLoop:
    """``watch`` fds with a handler each, ``poll`` on the owning thread, ``poke`` from anywhere."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll = select.epoll()
        self._epoll.register(self._wake, select.EPOLLIN)
        self._handlers: dict[int, Handler] = {}

    def watch(self, fd: int, handler: Handler, mask: int = select.EPOLLIN) -> None:
        """Poll ``fd`` for ``mask`` (0: only EPOLLHUP/EPOLLERR, which epoll always reports)."""
        self._epoll.register(fd, mask)
        self._handlers[fd] = handler

    def handle(self, fd: int, handler: Handler) -> None:
        """Give an fd that is watched already another handler."""
        self._handlers[fd] = handler

    def modify(self, fd: int, mask: int) -> None:
        self._epoll.modify(fd, mask)

    def forget(self, fd: int) -> None:
        """Stop polling ``fd`` (it may be closed already: then there is nothing to undo)."""
        self._handlers.pop(fd, None)
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(fd)

    def poke(self) -> None:
        """Wake a ``poll`` in progress. Safe from any thread and from a signal handler."""
        with contextlib.suppress(OSError):
            os.eventfd_write(self._wake, 1)

    def poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds and run the handler of every fd that is ready."""
        try:
            events = self._epoll.poll(timeout)
        except InterruptedError:
            return
        for fd, mask in events:
            if fd == self._wake:
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(self._wake)
                continue
            handler = self._handlers.get(fd)
            if handler is None:
                continue  # closed earlier in this batch
            try:
                handler(fd, mask)
            except Exception:  # one bad event must not stop the others being answered
                log.exception("%s: handling an event on fd %d failed", self._label, fd)

    @property
    def closed(self) -> bool:
        return self._epoll.closed

    def close(self) -> None:
        """Close the epoll and the wakeup fd (not the watched fds: their owners close them)."""
        self._handlers.clear()
        with contextlib.suppress(OSError):
            os.close(self._wake)
        self._epoll.close()


__all__ = ["EventLoop", "Handler"]
