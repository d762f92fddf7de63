"""Built-in scheduler plugins, one module each; importing this package registers them all.

Each module registers a factory in :data:`spotgpu.scheduler.framework.PLUGINS` under its NAME.
A new plugin is one new module added to the import list below. Each decides one aspect
(gang completeness, GPU fit, priority, queue share, spot placement) on plain data; none has
side effects.
"""

from __future__ import annotations

from spotgpu.scheduler.plugins import gang, gpufit, priority, queue, spot

BUILTIN = (gang.NAME, gpufit.NAME, priority.NAME, queue.NAME, spot.NAME)

__all__ = ["BUILTIN"]
