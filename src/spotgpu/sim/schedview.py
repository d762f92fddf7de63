"""The simulator's nodes as the scheduler's GPU rules read them (:mod:`spotgpu.scheduler.rules`).

No I/O; read-only views built per node rebuild. The simulator decides which nodes a trimmed
snapshot needs from the same per-node summary the scheduler indexes nodes by
(:func:`spotgpu.scheduler.rules.summarize`): room for spot pods (lendable twins without users),
room for reserved pods (bindable GPUs) and the preemption order (top live spot priority, GPUs
free without victims, reclaimable GPUs). The views translate the model: a GPU whose device ID
is nominated for a preemptor has that pod as nominee; a ShadowPod is draining while any of its
GPUs is nominated; nothing is tentative (a simulated cycle's placements are applied at once).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from spotgpu.core.ids import DeviceID
from spotgpu.core.types import GPU_MILLI, Health
from spotgpu.scheduler import lease
from spotgpu.scheduler.rules import NodeSummary, summarize

if TYPE_CHECKING:
    from spotgpu.sim.model import GpuSim, NodeSim, PodSim, ShadowSim


class SimUser:
    __slots__ = ("evicting", "priority")

    def __init__(self, pod: PodSim) -> None:
        self.evicting = pod.evicting
        priority = pod.job.spec.priority
        self.priority = priority.value_int if priority is not None else 0


class SimShadow:
    __slots__ = ("_live", "deleting", "new", "nominated")

    def __init__(self, shadow: ShadowSim, nominated: Mapping[DeviceID, object]) -> None:
        self.deleting = shadow.deleting
        self.new = False
        self.nominated = sum(1 for g in shadow.gpus if g.id in nominated)
        self._live = any(not u.evicting for g in shadow.gpus for u in g.users)

    def live_users(self) -> bool:
        return self._live


class SimGpu:
    __slots__ = (
        "exclusive",
        "healthy",
        "holder",
        "lease",
        "live",
        "nominee",
        "owner",
        "shadow",
        "twin_ok",
        "used_milli",
        "users",
    )

    def __init__(self, gpu: GpuSim, twin: Health, nominee: object | None, shadow: SimShadow | None) -> None:
        self.healthy = True  # the simulator models no broken devices
        self.twin_ok = twin is Health.HEALTHY
        self.nominee = nominee
        self.owner = gpu.owner
        self.shadow = shadow
        self.holder = None  # nothing is tentative between simulated cycles
        self.users = [SimUser(u) for u in gpu.users]
        self.exclusive = sum(1 for u in gpu.users if not u.request.is_shared)
        self.used_milli = sum(u.request.milli if u.request.is_shared else GPU_MILLI for u in gpu.users)
        self.live = sum(1 for u in gpu.users if not u.evicting)
        self.lease = lease.UNKNOWN


def node_views(node: NodeSim, health: Mapping[DeviceID, Health], nominated: Mapping[DeviceID, object]) -> list[SimGpu]:
    """One view per GPU of ``node`` (ShadowPods viewed once each)."""
    shadows: dict[int, SimShadow] = {}
    out = []
    for gpu in node.gpus:
        view = None
        if gpu.shadow is not None:
            view = shadows.get(id(gpu.shadow))
            if view is None:
                view = shadows[id(gpu.shadow)] = SimShadow(gpu.shadow, nominated)
        out.append(SimGpu(gpu, health[gpu.id], nominated.get(gpu.id), view))
    return out


def node_summary(views: Sequence[SimGpu], lending: bool) -> NodeSummary:
    """The scheduler's summary of a simulated node (lent partials are not needed for trimming)."""
    return summarize(views, lending)


__all__ = ["SimGpu", "SimShadow", "SimUser", "node_summary", "node_views"]
