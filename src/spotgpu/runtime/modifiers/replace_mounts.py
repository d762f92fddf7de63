"""ReplaceMounts: a synced driver mount replaces the image's mount at the same destination.

Pure. Runs after :mod:`.devices`. For every destination a synced mount uses, every other mount
entry at that destination (the image's own driver directory, a mount containerd added, a
duplicate) is removed and the synced one is kept once, in the position of its first
occurrence. Destinations compare after normalisation (``/usr/lib/`` equals ``/usr/lib``).
Without a sync it does nothing.
"""

from __future__ import annotations

import posixpath
from typing import Any

from spotgpu.runtime.modifiers.base import ModifyContext
from spotgpu.runtime.modifiers.devices import merged_mounts
from spotgpu.runtime.spec import Spec, array


def _destination(entry: Any) -> str | None:
    dest = entry.get("destination") if isinstance(entry, dict) else None
    return posixpath.normpath(dest) if isinstance(dest, str) else None


class ReplaceMounts:
    name = "replace-mounts"

    def modify(self, spec: Spec, ctx: ModifyContext) -> None:
        if ctx.sync is None:
            return
        synced = {posixpath.normpath(m["destination"]): m for m in merged_mounts(ctx.sync)}
        if not synced:
            return
        mounts = array(spec, "mounts", "")
        kept: list[Any] = []
        placed: set[str] = set()
        for entry in mounts:
            dest = _destination(entry)
            if dest is None or dest not in synced:
                kept.append(entry)
            elif entry == synced[dest] and dest not in placed:
                kept.append(entry)
                placed.add(dest)
        for dest, entry in synced.items():
            if dest not in placed:
                kept.append(entry)
        mounts[:] = kept


__all__ = ["ReplaceMounts"]
