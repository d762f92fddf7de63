"""Error taxonomy shared by every spotgpu component.

Decides nothing and has no side effects. Every error spotgpu raises on purpose derives from
:class:`SpotgpuError` and says whether retrying can help:

* :class:`TemporaryError`: the operation may succeed later unchanged (a socket not up yet, a
  409 conflict, containerd restarting). Callers retry with backoff.
* :class:`PermanentError`: retrying the same input cannot succeed (malformed annotation, a sync
  kubelet did not grant, a snapshot that contradicts itself). Callers report and move on.

Input-validation errors are also :class:`ValueError` subclasses so generic callers can catch
them as such; each carries the offending value in its message.
"""

from __future__ import annotations


class SpotgpuError(Exception):
    """Base of every error spotgpu raises on purpose."""

    temporary: bool = False


class TemporaryError(SpotgpuError):
    """A failure that may go away if the same operation is retried later."""

    temporary = True


class PermanentError(SpotgpuError):
    """A failure that retrying the same input cannot fix."""


class ValidationError(PermanentError, ValueError):
    """Bad input at a boundary; the message names the offending key or value."""


__all__ = ["PermanentError", "SpotgpuError", "TemporaryError", "ValidationError"]
