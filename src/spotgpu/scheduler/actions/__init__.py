"""Built-in scheduler actions, one module each; importing this package registers them all.

Each module registers a factory in :data:`spotgpu.scheduler.framework.ACTIONS` under its NAME.
The configured order (default enqueue, allocate, preempt, backfill) is the order they run in.
Each decides one step of a cycle on the session's plain data; none has side effects.
"""

from __future__ import annotations

from spotgpu.scheduler.actions import allocate, backfill, enqueue, preempt

BUILTIN = (enqueue.NAME, allocate.NAME, preempt.NAME, backfill.NAME)

__all__ = ["BUILTIN"]
