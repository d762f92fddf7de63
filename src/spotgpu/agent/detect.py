"""Turning GPU measurements into one :class:`~spotgpu.core.lending.ActivitySample` per owner.

Pure; no I/O. The agent measures (GPU backend processes and utilization, process attribution)
and calls :func:`owner_samples`; the simulator can build the same inputs from its model.
One of the agent's pure modules (``model``, ``steer``, ``detect``, ``settings``, ``ports``): an
import-linter contract keeps adapters, gRPC, protobuf, Prometheus and NVML out of it and of
everything it imports.

Rules:

* ``utilization_active``: any of the owner's GPUs shows utilization > 0; unknown (``None``)
  when utilization could not be read for one of them.
* ``owner_process_active``: a process attributed to the owner's container runs on one of the
  owner's GPUs; unknown when the GPU process list could not be read.

While lent, the lending state machine (:mod:`spotgpu.core.lending`) ignores utilization (it is the
spot work's) and judges by ``owner_process_active`` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spotgpu.core.ids import DeviceID
from spotgpu.core.lending import ActivitySample
from spotgpu.core.refs import ContainerRef


@dataclass(frozen=True, slots=True)
class WatchedOwner:
    """An owner container the detector judges: its GPUs and its runtime container ID."""

    owner: ContainerRef
    devices: tuple[DeviceID, ...]
    container_id: str | None


def utilization_active(devices: Sequence[DeviceID], utilization: Mapping[DeviceID, float | None] | None) -> bool | None:
    if utilization is None:
        return None
    values = [utilization.get(d) for d in devices]
    if any(v is not None and v > 0 for v in values):
        return True
    return None if any(v is None for v in values) else False


def owner_samples(
    at: float,
    owners: Sequence[WatchedOwner],
    utilization: Mapping[DeviceID, float | None] | None,
    gpu_pids: Mapping[DeviceID, Sequence[int]] | None,
    pid_container: Mapping[int, str],
) -> dict[ContainerRef, ActivitySample]:
    """One sample per owner (see module docstring). ``pid_container``: host PID -> container ID."""
    samples: dict[ContainerRef, ActivitySample] = {}
    for watched in owners:
        process: bool | None
        if gpu_pids is None:
            process = None
        elif watched.container_id is None:
            process = None  # cannot attribute: unknown, which the detector treats as activity
        else:
            process = any(
                pid_container.get(pid) == watched.container_id for d in watched.devices for pid in gpu_pids.get(d, ())
            )
        samples[watched.owner] = ActivitySample(at, utilization_active(watched.devices, utilization), process)
    return samples


def pids_on(devices: Sequence[DeviceID], gpu_pids: Mapping[DeviceID, Sequence[int]]) -> set[int]:
    return {pid for d in devices for pid in gpu_pids.get(d, ())}


__all__ = ["WatchedOwner", "owner_samples", "pids_on", "utilization_active"]
