"""GPU fit plugin: which nodes can take a task's GPUs, binpack or spread, fragmentation-aware.

Pure decision code; no side effects. Filters node classes by pool and, for reserved tasks, by
resource and free real GPUs; scores classes for every task kind; picks the exact real GPUs for
reserved tasks (its nominated GPUs first).

Scores (0..100, higher is better) for a task of ``k`` GPUs on a node class with ``c`` usable
GPUs out of ``G``:

* binpack: ``100 * (1 - (c - k) / G)`` (fill the fullest node that fits); spread: ``100 * (c - k) / G``.
* fragmentation: with ``P(s)`` the share of this cycle's pending tasks of the same kind that need
  ``s`` GPUs, ``frag(r) = r * P(s > r)`` is how many of ``r`` free GPUs the pending work could not
  use (the node would be a fragment for it). The score is ``50 * (1 - (frag(c-k) - frag(c)) / G)``:
  placements that leave a node's free GPUs usable by the queue score higher (after FGD,
  "Beware of Fragmentation", USENIX ATC '23, reduced to whole GPUs).
* The two are combined as ``(order + w * frag) / (1 + w)``, ``w`` = ``fragmentationWeight``.
* Shared spot: a partly used GPU with the tightest fitting remainder scores highest under binpack
  (whole GPUs stay free for exclusive work); under spread fresh GPUs come first.
"""

from __future__ import annotations

from typing import Final

from spotgpu.core.types import GPU_MILLI
from spotgpu.scheduler.config import NodeOrder
from spotgpu.scheduler.framework import PLUGINS
from spotgpu.scheduler.mirrors import GPUState, NodeClass, NodeState, TaskKind, TaskShape, TaskState
from spotgpu.scheduler.session import Session
from spotgpu.scheduler.status import OK, Status

NAME: Final = "gpufit"


class GPUFitPlugin:
    def __init__(self, session: Session) -> None:
        self.binpack = session.config.node_order is NodeOrder.BINPACK
        self.frag_weight = session.config.fragmentation_weight
        sizes: dict[TaskKind, dict[int, int]] = {TaskKind.RESERVED: {}, TaskKind.EXCLUSIVE: {}}
        for task in session.state.tasks.values():
            if task.node is None and task.kind in sizes:
                hist = sizes[task.kind]
                hist[task.gpus] = hist.get(task.gpus, 0) + 1
        self._sizes = sizes
        self._frag: dict[tuple[TaskKind, int], list[float]] = {}

    # -- filter -----------------------------------------------------------------------------
    def class_status(self, shape: TaskShape, cls: NodeClass) -> Status:
        if shape.pool is not None and cls.pool != shape.pool:
            return Status.unresolvable(f"not in pool {shape.pool!r}")
        if shape.kind is TaskKind.RESERVED:
            if cls.resource != shape.resource:
                return Status.unresolvable(f"have {cls.resource}, not {shape.resource}")
            if cls.free < shape.gpus:
                reason = f"have fewer than {shape.gpus} free {shape.resource}"
                return Status.unresolvable(reason) if cls.gpus < shape.gpus else Status.unschedulable(reason)
        return OK

    # -- score ------------------------------------------------------------------------------
    def frag_table(self, kind: TaskKind, gpus: int) -> list[float]:
        """``frag(r)`` for r = 0..gpus for pending tasks of ``kind``."""
        table = self._frag.get((kind, gpus))
        if table is None:
            hist = self._sizes.get(kind, {})
            total = sum(hist.values())
            table = []
            for r in range(gpus + 1):
                larger = sum(n for s, n in hist.items() if s > r)
                table.append(r * larger / total if total else 0.0)
            self._frag[(kind, gpus)] = table
        return table

    def class_score(self, shape: TaskShape, cls: NodeClass) -> float:
        size = max(cls.gpus, 1)
        if shape.kind is TaskKind.SHARED:
            return self._shared_score(shape, cls, size)
        c = cls.free if shape.kind is TaskKind.RESERVED else cls.spot_usable(shape)
        k = shape.gpus
        left = max(c - k, 0)
        order = 100.0 * (1 - left / size) if self.binpack else 100.0 * left / size
        if not self.frag_weight:
            return order
        table = self.frag_table(shape.kind, cls.gpus)
        delta = table[min(left, cls.gpus)] - table[min(c, cls.gpus)]
        frag = min(100.0, max(0.0, 50.0 * (1 - delta / size)))
        return (order + self.frag_weight * frag) / (1 + self.frag_weight)

    def _shared_score(self, shape: TaskShape, cls: NodeClass, size: int) -> float:
        milli = shape.milli
        best = next((p for p in cls.partials if p >= milli), None)
        fresh = cls.spot_usable(shape)
        if self.binpack:
            if best is not None:
                return 50.0 + 50.0 * (1 - (best - milli) / GPU_MILLI)
            return 50.0 * (1 - (fresh - 1) / size) if fresh else 0.0
        if fresh:
            return 50.0 + 50.0 * (fresh - 1) / size
        return 50.0 * (best - milli) / GPU_MILLI if best is not None else 0.0

    # -- devices ----------------------------------------------------------------------------
    def handles(self, kind: TaskKind) -> bool:
        return kind is TaskKind.RESERVED

    def pick_devices(self, shape: TaskShape, task: TaskState, node: NodeState) -> list[GPUState] | None:
        del shape  # reserved tasks are tried as they are
        out: list[GPUState] = []
        nom = task.nomination
        if nom is not None and nom[0] is node:
            out = [g for g in nom[1] if g.healthy and g.owner is None and not g.users]
        for g in node.gpus:
            if len(out) >= task.gpus:
                break
            if g.bindable():
                out.append(g)
        return out[: task.gpus] if len(out) >= task.gpus else None


PLUGINS.register(NAME, GPUFitPlugin)
