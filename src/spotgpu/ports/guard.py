"""The return guard as the agent drives it: :class:`GuardPort` and :data:`OwnerBackHandler`.

Protocols only; no side effects. :class:`~spotgpu.guard.service.GuardService` implements the
port; the agent's solver uses it (re-exported by :mod:`spotgpu.ports.kube`). The port lives
here, below the agent, so that the guard never imports the agent: the layers are agent, then
runtime, then guard (an import-linter contract in pyproject.toml keeps them so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from spotgpu.core.refs import ContainerRef

OwnerBackHandler = Callable[[ContainerRef], None]
"""Called by the guard, from its own thread, when an armed owner starts a GPU session."""


class GuardPort(Protocol):
    """The return guard as the agent's solver drives it."""

    @property
    def available(self) -> bool:
        """Seccomp user notification works here (runc >= 1.1, libseccomp >= 2.5, kernel >= 5.5)."""
        ...

    def arm(self, owner: ContainerRef) -> None:
        """The owner's GPUs are lent: hold its next GPU session and report it. Idempotent."""
        ...

    def disarm(self, owner: ContainerRef) -> None:
        """The owner's GPUs are clean again: release any held call and stop holding. Idempotent."""
        ...

    def is_armed(self, owner: ContainerRef) -> bool: ...

    @property
    def attached(self) -> bool:
        """Attached to (and synced with) the fd holder that keeps its notify fds across restarts."""
        ...

    def start(self) -> None:
        """Start (check support, connect to the fd holder); ``available`` is known after it."""
        ...

    def stop(self) -> None: ...

    def wait_attached(self, timeout: float) -> bool:
        """Block until :attr:`attached` or ``timeout`` seconds; whether it attached."""
        ...

    def covers(self, owner: ContainerRef) -> bool:
        """A notify fd of ``owner`` is held here: the guard can catch its return. False for an
        owner the rule was not injected into (``spotgpu.io/guard-skipped``), whose fd was lost,
        or while the guard is unavailable."""
        ...


__all__ = ["GuardPort", "OwnerBackHandler"]
