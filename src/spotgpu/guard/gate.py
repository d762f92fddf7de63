"""What the fd holder asks before it lets a held or caught owner call go on by itself.

The holder releases owner calls only when no guard is attached (the agent died, hung, or never
started): then nobody evicted the spot work, and an owner released at once would share its GPUs
with it. The :class:`ReleaseGate` it is given at construction clears the owner's GPUs first
(:class:`spotgpu.adapters.ownerclear.OwnerClearer` on a real node); it is the release invariant
of docs/security.md, applied by the holder. Protocol only: the guard package does no process
walks itself.
"""

from __future__ import annotations

from typing import Protocol


class ReleaseGate(Protocol):
    """Clears the GPUs of the owner container whose process is ``pid`` of every other pod's
    holders; returns a line for the holder's log. Must never kill the owner's pod, must never
    raise (a failure is reported in the line and the call is released anyway: a held owner
    call that is never released is the worse outcome), must return by its own deadline."""

    def clear(self, pid: int) -> str: ...


__all__ = ["ReleaseGate"]
