"""Gang scheduling over queues with the spot plugin: a pure decision core (snapshot in, decisions out).

Public API (see docs/scheduler.md):

* :func:`run_cycle` ``(snapshot, config, now) -> CycleResult``: one cycle;
* :func:`select_victims` ``(snapshot, group, config, now) -> Preemption``: victim selection alone;
* the snapshot and decision types in :mod:`spotgpu.scheduler.model`;
* :class:`SchedulerConfig` (YAML section ``scheduler``);
* fluent builders for tests and simulations in :mod:`spotgpu.scheduler.testing`.

Nothing in this package does I/O or reads a clock.
"""

from __future__ import annotations

from spotgpu.scheduler.config import NodeOrder, SchedulerConfig
from spotgpu.scheduler.cycle import check_config, open_session, run_cycle, select_victims
from spotgpu.scheduler.decisions import (
    Bind,
    ClearNomination,
    CreateShadowPod,
    CycleResult,
    CycleStats,
    Decision,
    DeleteShadowPod,
    DeviceOwner,
    Evict,
    Nominate,
    PodGroupPhase,
    PodGroupStatus,
    Preemption,
    Unschedulable,
)
from spotgpu.scheduler.model import (
    GPU,
    GPURequest,
    Node,
    Nomination,
    Pod,
    PodGroup,
    Queue,
    SchedulerBug,
    ShadowPod,
    Snapshot,
    SnapshotError,
    SpotOutside,
    VictimScale,
    parse_node_annotations,
)

__all__ = [
    "GPU",
    "Bind",
    "ClearNomination",
    "CreateShadowPod",
    "CycleResult",
    "CycleStats",
    "Decision",
    "DeleteShadowPod",
    "DeviceOwner",
    "Evict",
    "GPURequest",
    "Node",
    "NodeOrder",
    "Nominate",
    "Nomination",
    "Pod",
    "PodGroup",
    "PodGroupPhase",
    "PodGroupStatus",
    "Preemption",
    "Queue",
    "SchedulerBug",
    "SchedulerConfig",
    "ShadowPod",
    "Snapshot",
    "SnapshotError",
    "SpotOutside",
    "Unschedulable",
    "VictimScale",
    "check_config",
    "open_session",
    "parse_node_annotations",
    "run_cycle",
    "select_victims",
]
