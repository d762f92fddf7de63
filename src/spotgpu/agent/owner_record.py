"""The owner record of spotgpu-runtime's ``local`` fallback, kept in step with the MappingCache.

Decides nothing. Side effects: writes the record file (:func:`spotgpu.runtime.ownerstate.write_owner_state`,
atomically) when the owners changed, an error metric and a log line when that fails (the next
refresh tries again). Only owners and their devices are written: spot users change all the
time, and the runtime needs owners only.
"""

from __future__ import annotations

import logging
from pathlib import Path

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.core.mapping_cache import DeviceEntry, MappingCache, MappingSnapshot, OwnerEntry
from spotgpu.runtime.ownerstate import write_owner_state

log = logging.getLogger(__name__)


class OwnerRecord:
    """Writes the owners of a MappingCache to ``path`` when they changed (``path`` None: nothing)."""

    def __init__(self, path: Path | None, metrics: AgentMetrics) -> None:
        self.path = path
        self.metrics = metrics
        self._written: MappingSnapshot | None = None

    def update(self, mapping: MappingCache) -> None:
        if self.path is None:
            return
        snapshot = mapping.snapshot()
        owners = MappingSnapshot(
            tuple(OwnerEntry(e.owner, tuple(DeviceEntry(d.device, ()) for d in e.devices)) for e in snapshot.owners)
        )
        if owners == self._written:
            return
        try:
            write_owner_state(self.path, owners)
        except OSError as exc:
            self.metrics.detector_errors.labels(kind="owner_record").inc()
            log.warning("writing the runtime's owner record %s failed: %s", self.path, exc)
            return
        self._written = owners


__all__ = ["OwnerRecord"]
