"""Publishing the node's ResourceSlices: the pool plan of :mod:`spotgpu.dra.slices`, applied.

Side effects: ResourceSlice list/create/update/delete through :class:`~spotgpu.dra.ports.DraApi`.
:meth:`SlicePublisher.sync` reads what is stored, plans (keeping stored taints' ``timeAdded``)
and writes. :class:`~spotgpu.dra.host.DraHost` calls it on every change of the twins and
periodically, which also brings the slices back after the kubelet deleted them (it does at its
start, and 30 s after the driver's last connection ended). A 409 Conflict or any temporary
failure is left to the next sync.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Sequence

from spotgpu.core.ids import NodeName
from spotgpu.dra.claim import DriverName
from spotgpu.dra.ports import DraApi
from spotgpu.dra.slices import NodeOwner, Publication, SlicePlan, desired_slices, plan_pool, taint_times


def rfc3339(now: float) -> str:
    return dt.datetime.fromtimestamp(int(now), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SlicePublisher:
    def __init__(
        self,
        api: DraApi,
        driver: DriverName,
        node: NodeName,
        publication: Callable[[], Publication],
        clock: Callable[[], float],
    ) -> None:
        self._api = api
        self._driver = driver
        self._node = node
        self._publication = publication
        self._clock = clock
        self._owner: NodeOwner | None = None
        self._lock = threading.Lock()

    def sync(self) -> SlicePlan:
        """One pass: make the stored slices what the twins are now; the plan carried out."""
        with self._lock:
            if self._owner is None:
                self._owner = NodeOwner(self._node, self._api.node_uid(self._node))
            existing: Sequence[dict[str, object]] = [dict(o) for o in self._api.list_slices(self._driver, self._node)]
            desired = desired_slices(self._publication(), rfc3339(self._clock()), taint_times(existing))
            plan = plan_pool(existing, desired, self._driver, self._owner)
            for name, uid, rv in plan.deletes:
                self._api.delete_slice(name, uid, rv)
            for obj in plan.updates:
                self._api.update_slice(obj)
            for obj in plan.creates:
                self._api.create_slice(obj)
            return plan


__all__ = ["SlicePublisher", "rfc3339"]
