"""The NVML backend over a module double with pynvml's API (no GPU and no libnvidia-ml here).

The double mirrors nvidia-ml-py 13's behaviour that matters (protocols.md 8.1): the unversioned
process call raises ``NVMLLibraryMismatchError`` when the driver lacks the ``_v3`` symbol,
process entries carry host PIDs and ``usedGpuMemory``, ``GPU_IS_LOST`` errors, NUMA via
``nvmlDeviceGetNumaNodeId`` or, failing that, sysfs from the PCI bus ID.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from spotgpu.adapters.nvml import NvmlBackend, NvmlError


class NVMLError(Exception):
    pass


class NVMLError_FunctionNotFound(NVMLError):
    pass


class NVMLLibraryMismatchError(Exception):
    pass


def fake_nvml(*, has_v3: bool, numa_api: bool = True, lost: set[int] = frozenset()) -> SimpleNamespace:  # type: ignore[assignment]
    procs = {0: [SimpleNamespace(pid=4242, usedGpuMemory=1 << 30)], 1: []}
    graphics = {0: [SimpleNamespace(pid=4242, usedGpuMemory=None)], 1: [SimpleNamespace(pid=99, usedGpuMemory=None)]}
    calls: list[str] = []

    def check(h: int) -> None:
        if h in lost:
            raise NVMLError("GPU is lost")

    def compute(h: int) -> list[SimpleNamespace]:
        calls.append("v3")
        if not has_v3:
            raise NVMLLibraryMismatchError("use nvmlDeviceGetComputeRunningProcesses_v2")
        check(h)
        return procs[h]

    def compute_v2(h: int) -> list[SimpleNamespace]:
        calls.append("v2")
        check(h)
        return procs[h]

    def numa(h: int) -> int:
        if not numa_api:
            raise NVMLError_FunctionNotFound("Function Not Found")
        return h

    return SimpleNamespace(
        NVMLError=NVMLError,
        NVMLError_FunctionNotFound=NVMLError_FunctionNotFound,
        NVMLLibraryMismatchError=NVMLLibraryMismatchError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h:08x}-aaaa-bbbb-cccc-000000000000".encode(),
        nvmlDeviceGetMinorNumber=lambda h: h + 4,
        nvmlDeviceGetNumaNodeId=numa,
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode()),
        nvmlDeviceGetComputeRunningProcesses=compute,
        nvmlDeviceGetComputeRunningProcesses_v2=compute_v2,
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: graphics[h],
        nvmlDeviceGetGraphicsRunningProcesses_v2=lambda h: graphics[h],
        nvmlDeviceGetUtilizationRates=lambda h: (check(h), SimpleNamespace(gpu=[73, 0][h], memory=10))[1],
        calls=calls,
    )


def test_inventory_processes_and_utilization() -> None:
    nv = fake_nvml(has_v3=True)
    backend = NvmlBackend(nv)  # type: ignore[arg-type]
    devices = backend.devices()
    assert [(d.id, d.index, d.minor, d.numa_node) for d in devices] == [
        ("GPU-00000000-aaaa-bbbb-cccc-000000000000", 0, 4, 0),
        ("GPU-00000001-aaaa-bbbb-cccc-000000000000", 1, 5, 1),
    ]
    procs = backend.processes()
    assert [(p.pid, p.used_memory) for p in procs[devices[0].id]] == [(4242, None)]
    assert [p.pid for p in procs[devices[1].id]] == [99]
    assert backend.utilization() == {devices[0].id: 73.0, devices[1].id: 0.0}
    assert nv.calls == ["v3", "v3"]


def test_v3_missing_falls_back_to_v2_once() -> None:
    nv = fake_nvml(has_v3=False)
    backend = NvmlBackend(nv)  # type: ignore[arg-type]
    backend.processes()
    backend.processes()
    assert nv.calls == ["v3"] + ["v2"] * 4  # two GPUs, two rounds; _v3 tried once


def test_numa_from_sysfs_when_nvml_cannot_say(tmp_path: Path) -> None:
    for bus, node in (("0000:18:00.0", "1"), ("0000:19:00.0", "-1")):
        (tmp_path / "bus/pci/devices" / bus).mkdir(parents=True)
        (tmp_path / "bus/pci/devices" / bus / "numa_node").write_text(node + "\n")
    backend = NvmlBackend(fake_nvml(has_v3=True, numa_api=False), sys_root=tmp_path)  # type: ignore[arg-type]
    assert [d.numa_node for d in backend.devices()] == [1, None]


def test_lost_gpu_errors() -> None:
    backend = NvmlBackend(fake_nvml(has_v3=True, lost={1}))  # type: ignore[arg-type]
    assert backend.utilization()["GPU-00000001-aaaa-bbbb-cccc-000000000000"] is None
    with pytest.raises(NvmlError, match="GPU-00000001"):
        backend.processes()
