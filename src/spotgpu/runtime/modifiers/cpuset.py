"""CPUSet: pin a spot container to the NUMA node(s) of the GPUs it synced.

Pure; reads the topology through the context: the devices' NUMA nodes from the kubelet
(pod-resources topology of the source, or ``GetAllocatableResources`` for Direct) and each
node's CPU list from the host. Sets ``linux.resources.cpu.cpus`` only when

* devices were synced and every one has a known NUMA node, and
* the spec has no CPU set yet: an existing one comes from the kubelet's CPU manager (exclusive
  CPUs or the shared pool), which we must never narrow or widen.

Best effort: a topology lookup that fails leaves the spec as it is (noted for the log); the
kubelet may later replace the CPU set through UpdateContainerResources.
"""

from __future__ import annotations

import re
from typing import Final

from spotgpu.core.errors import SpotgpuError
from spotgpu.runtime.modifiers.base import ModifyContext
from spotgpu.runtime.spec import Spec, obj

_CPULIST: Final = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")


class CPUSet:
    name = "cpuset"

    def modify(self, spec: Spec, ctx: ModifyContext) -> None:
        if ctx.sync is None or not ctx.sync.plan.devices:
            return
        linux = spec.get("linux")
        resources = linux.get("resources") if isinstance(linux, dict) else None
        cpu = resources.get("cpu") if isinstance(resources, dict) else None
        if isinstance(cpu, dict) and cpu.get("cpus"):
            return
        nodes: set[int] = set()
        try:
            for device in ctx.sync.plan.devices:
                numa = device.numa_nodes or ctx.lookup.device_numa(device.resource).get(device.device, ())
                if not numa:
                    ctx.notes.append(f"cpuset: NUMA node of {device.device} unknown; CPU set left as it is")
                    return
                nodes.update(numa)
        except SpotgpuError as exc:
            ctx.notes.append(f"cpuset: topology lookup failed ({exc}); CPU set left as it is")
            return
        lists = [ctx.host.numa_cpus(n) for n in sorted(nodes)]
        if any(c is None or _CPULIST.fullmatch(c) is None for c in lists):
            ctx.notes.append(f"cpuset: CPU list of NUMA node(s) {sorted(nodes)} unknown; CPU set left as it is")
            return
        obj(obj(obj(spec, "linux", ""), "resources", "linux."), "cpu", "linux.resources.")["cpus"] = ",".join(
            c for c in lists if c is not None
        )


__all__ = ["CPUSet"]
