"""What one detection cycle measures: GPU processes, utilization, and which owner container each
process on an owner's GPU belongs to; turned into one sample per owner.

Decides nothing (the rules are :func:`spotgpu.agent.detect.owner_samples`). Side effects: reads
through the ports (the GPU backend's process list, the utilization reader, containerd's init PIDs,
the PID attributor's ``/proc``), an error metric and a log line per failed read. A read that fails
is unknown (``None``), never idle: the lending state machine counts unknown as active.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.adapters.procattr import ContainerRefPoint
from spotgpu.agent.detect import WatchedOwner, owner_samples, pids_on
from spotgpu.core.clock import Clock
from spotgpu.core.errors import SpotgpuError
from spotgpu.core.ids import DeviceID
from spotgpu.core.lending import ActivitySample
from spotgpu.core.refs import ContainerRef
from spotgpu.ports.node import GpuBackend, GpuDevice, PidAttributor, TaskPort, UtilizationReader

log = logging.getLogger(__name__)

REF_RETRY_INTERVAL = 5.0
"""Seconds before asking containerd again for the init PID of an owner container not running."""


class BackendUtilization:
    """Utilization straight from the GPU backend (NVML): the direct alternative to exporters."""

    def __init__(self, backend: GpuBackend) -> None:
        self.backend = backend
        self.name = backend.name

    def read(self, devices: Sequence[GpuDevice]) -> Mapping[DeviceID, float | None]:
        return self.backend.utilization()


def _resolved(point: Any) -> bool:
    """A reference point that knows more than the container ID (init PID was found)."""
    return not isinstance(point, ContainerRefPoint) or point.cgroup_path is not None or point.pid_ns is not None


class ReferencePoints:
    """Per owner container, what its processes are matched against (its init's cgroup and pid
    namespace), cached while the container is watched; a container whose init was not found is
    asked again every ``retry_interval`` seconds."""

    def __init__(self, tasks: TaskPort, attributor: PidAttributor, retry_interval: float = REF_RETRY_INTERVAL) -> None:
        self.tasks = tasks
        self.attributor = attributor
        self.retry_interval = retry_interval
        self._refs: dict[str, Any] = {}
        self._retry: dict[str, float] = {}

    def of(self, owners: Sequence[WatchedOwner]) -> dict[str, Any]:
        """The reference point of every owner container with an ID (others are forgotten)."""
        wanted = {o.container_id for o in owners if o.container_id}
        for cid in [c for c in self._refs if c not in wanted]:
            del self._refs[cid]
            self._retry.pop(cid, None)
        now = time.monotonic()
        for cid in wanted:
            point = self._refs.get(cid)
            retry_at = self._retry.get(cid, 0.0)
            if point is None or (not _resolved(point) and now >= retry_at):
                try:
                    pid = self.tasks.init_pid(cid)
                except SpotgpuError:
                    pid = None
                self._refs[cid] = point = self.attributor.reference(cid, pid)
                if not _resolved(point):
                    self._retry[cid] = now + self.retry_interval  # not running yet: ask again later
                else:
                    self._retry.pop(cid, None)
        return {cid: self._refs[cid] for cid in wanted}


class Measurer:
    """One detection cycle's measurements, as samples for :meth:`spotgpu.agent.solver.Solver.observe`."""

    def __init__(
        self,
        backend: GpuBackend,
        utilization: UtilizationReader,
        refs: ReferencePoints,
        *,
        metrics: AgentMetrics,
        clock: Clock,
    ) -> None:
        self.backend = backend
        self.utilization = utilization
        self.refs = refs
        self.metrics = metrics
        self.clock = clock

    def samples(
        self, devices: Sequence[GpuDevice], owners: Callable[[], Sequence[WatchedOwner]]
    ) -> dict[ContainerRef, ActivitySample]:
        """Read the GPUs' processes and utilization, then attribute the processes on the GPUs of
        the owners (``owners()`` is asked after the reads) and sample each owner."""
        gpu_pids = self._gpu_pids()
        utilization = self._utilization(devices)
        watched = owners()
        pid_container: dict[int, str] = {}
        if gpu_pids is not None:
            candidates = set().union(*(pids_on(o.devices, gpu_pids) for o in watched)) if watched else set()
            if candidates:
                pid_container = self.refs.attributor.attribute(sorted(candidates), self.refs.of(watched))
        return owner_samples(self.clock.monotonic(), watched, utilization, gpu_pids, pid_container)

    def _gpu_pids(self) -> dict[DeviceID, list[int]] | None:
        try:
            return {d: [p.pid for p in procs] for d, procs in self.backend.processes().items()}
        except SpotgpuError as exc:
            self.metrics.detector_errors.labels(kind="processes").inc()
            log.warning("GPU process list failed (owners count as active): %s", exc)
            return None

    def _utilization(self, devices: Sequence[GpuDevice]) -> Mapping[DeviceID, float | None] | None:
        try:
            return self.utilization.read(devices)
        except SpotgpuError as exc:
            self.metrics.collector_error(self.utilization.name, "read")
            log.warning("utilization read failed (owners not lent count as active): %s", exc)
            return None


__all__ = ["REF_RETRY_INTERVAL", "BackendUtilization", "Measurer", "ReferencePoints"]
