"""NVIDIA GPUs through NVML (``nvidia-ml-py``): inventory, compute processes, utilization.

Decides nothing. Side effects: loads ``libnvidia-ml.so.1`` (the driver's library) and calls
NVML; reads ``/sys/bus/pci/devices/<bus id>/numa_node`` when NVML cannot say the NUMA node.

Facts (protocols.md 8.1):

* devices are identified by UUID (``GPU-...``, the NVIDIA device plugin's default device ID)
  and minor number (``/dev/nvidia<minor>``);
* process lists carry **host** PIDs (the driver is not PID-namespace aware; run the agent
  with ``hostPID``). ``nvmlDeviceGetComputeRunningProcesses`` calls the ``_v3`` symbol; an
  older driver lacks it and the wrapper raises ``NVMLLibraryMismatchError`` (or
  ``NVMLError_FunctionNotFound``): then the ``_v2`` symbol is used, and remembered. Graphics
  processes are included (same fallback), so an owner's display or Vulkan work counts too;
* utilization is ``nvmlDeviceGetUtilizationRates().gpu``, percent over the driver's sample
  period.

A GPU whose calls fail with ``GPU_IS_LOST`` (or any error reading its identity) is reported
unhealthy, so its twin is never lent; NVML failures for the whole node raise
:class:`NvmlError` (temporary) and the detector counts the owners as active.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from spotgpu.core.errors import TemporaryError
from spotgpu.core.ids import DeviceID
from spotgpu.ports.node import GpuDevice, GpuProcess

log = logging.getLogger(__name__)


class NvmlError(TemporaryError):
    """NVML could not be initialised or a node-wide NVML call failed."""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _sysfs_numa(bus_id: str, sys_root: Path) -> int | None:
    """``00000000:3B:00.0`` (NVML) -> ``/sys/bus/pci/devices/0000:3b:00.0/numa_node``."""
    domain, _, rest = bus_id.partition(":")
    name = f"{int(domain, 16):04x}:{rest}".lower() if domain else bus_id.lower()
    try:
        value = int((sys_root / "bus/pci/devices" / name / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


class NvmlBackend:
    """A :class:`~spotgpu.ports.node.GpuBackend` on NVML (see module docstring).

    ``nvml`` is the ``pynvml`` module (injectable); ``sys_root`` is where sysfs is mounted.
    """

    name = "nvml"

    def __init__(self, nvml: ModuleType | None = None, *, sys_root: Path = Path("/sys")) -> None:
        if nvml is None:
            import pynvml as nvml_module

            nvml = nvml_module
        self.nvml: Any = nvml
        self.sys_root = sys_root
        self._lock = threading.Lock()
        self._handles: dict[DeviceID, Any] = {}
        self._devices: tuple[GpuDevice, ...] = ()
        self._proc_fns: dict[str, Callable[[Any], list[Any]]] = {}
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            raise NvmlError(f"NVML init failed: {exc}") from None
        self._inventory()

    def _inventory(self) -> None:
        nv = self.nvml
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            raise NvmlError(f"NVML device count failed: {exc}") from None
        devices, handles = [], {}
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
                minor = int(nv.nvmlDeviceGetMinorNumber(handle))
            except nv.NVMLError as exc:
                log.error("NVML: GPU index %d cannot be identified (not lent): %s", index, exc)
                continue
            devices.append(GpuDevice(DeviceID(uuid), index, uuid, minor, self._numa(handle)))
            handles[DeviceID(uuid)] = handle
        self._devices, self._handles = tuple(devices), handles

    def _numa(self, handle: Any) -> int | None:
        nv = self.nvml
        getter = getattr(nv, "nvmlDeviceGetNumaNodeId", None)
        if getter is not None:
            try:
                node = int(getter(handle))
                return node if node >= 0 else None
            except nv.NVMLError:
                pass
        try:
            bus_id = _text(nv.nvmlDeviceGetPciInfo(handle).busId)
        except nv.NVMLError:
            return None
        return _sysfs_numa(bus_id, self.sys_root)

    def devices(self) -> tuple[GpuDevice, ...]:
        with self._lock:
            return self._devices

    def _running(self, kind: str, handle: Any) -> list[Any]:
        """Processes of one kind (``Compute``/``Graphics``), falling back from _v3 to _v2 once."""
        nv = self.nvml
        fn = self._proc_fns.get(kind)
        if fn is not None:
            return fn(handle)
        unversioned = getattr(nv, f"nvmlDeviceGet{kind}RunningProcesses")
        try:
            result: list[Any] = unversioned(handle)
        except (nv.NVMLLibraryMismatchError, nv.NVMLError_FunctionNotFound):
            log.info("NVML: the driver lacks nvmlDeviceGet%sRunningProcesses_v3; using _v2", kind)
            fallback: Callable[[Any], list[Any]] = getattr(nv, f"nvmlDeviceGet{kind}RunningProcesses_v2")
            self._proc_fns[kind] = fallback
            return fallback(handle)
        self._proc_fns[kind] = unversioned
        return result

    def processes(self) -> dict[DeviceID, tuple[GpuProcess, ...]]:
        nv = self.nvml
        result: dict[DeviceID, tuple[GpuProcess, ...]] = {}
        with self._lock:
            for device in self._devices:
                handle = self._handles[device.id]
                procs: dict[int, GpuProcess] = {}
                try:
                    for kind in ("Compute", "Graphics"):
                        for info in self._running(kind, handle):
                            used = getattr(info, "usedGpuMemory", None)
                            procs[int(info.pid)] = GpuProcess(int(info.pid), device.id, used)
                except nv.NVMLError as exc:
                    raise NvmlError(f"NVML process list of {device.id} failed: {exc}") from None
                result[device.id] = tuple(sorted(procs.values(), key=lambda p: p.pid))
        return result

    def utilization(self) -> dict[DeviceID, float | None]:
        nv = self.nvml
        result: dict[DeviceID, float | None] = {}
        with self._lock:
            for device in self._devices:
                try:
                    result[device.id] = float(nv.nvmlDeviceGetUtilizationRates(self._handles[device.id]).gpu)
                except nv.NVMLError as exc:
                    log.warning("NVML utilization of %s failed: %s", device.id, exc)
                    result[device.id] = None
        return result

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as exc:
            log.debug("NVML shutdown: %s", exc)


__all__ = ["NvmlBackend", "NvmlError"]
