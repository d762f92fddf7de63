"""What ``spotgpu status`` shows: per node the GPUs, what is lendable and lent to whom; per queue the gangs.

:func:`build_report` is pure (API JSON in, a :class:`StatusReport` out); :func:`collect` does
the I/O (a handful of list calls through the connection) and calls it. :func:`render_table`
formats a report for people; :meth:`StatusReport.to_json` for programs.

Sources: the agent's ``spotgpu.io/spot-gpu-state`` node annotation (per real GPU: owner,
owner state, twin health, spot user count), spot pods' ``spotgpu.io/assigned-devices`` (which
spot pod uses which twin), the Queue, PodGroup and GangJob custom resources.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from spotgpu.core import keys
from spotgpu.core.codec import parse_assigned_devices
from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import SPOT_GPU_RESOURCE, from_spot_id
from spotgpu.kube.client import Connection
from spotgpu.kube.informer import collection_path
from spotgpu.kube.objects import node_ready, pod_phase
from spotgpu.kube.resources import GROUP, VERSION, GangJobPhase, QueueView, name_of, namespace_of
from spotgpu.scheduler.model import parse_node_annotations

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class GPUStatus:
    id: str
    owner: str | None
    """``ns/pod/container`` holding the real GPU; None when unallocated."""
    state: str
    """Owner state: ``unallocated``, ``active`` or ``idle``."""
    twin: str
    """The twin's health: ``Healthy`` = lendable."""
    users: tuple[str, ...] = ()
    """Spot pods (``ns/pod``) using it."""

    @property
    def lendable(self) -> bool:
        return self.twin == "Healthy"

    @property
    def lent(self) -> bool:
        return bool(self.users)


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: str
    ready: bool
    lending: bool
    strategy: str
    gpus: tuple[GPUStatus, ...]
    problem: str = ""

    @property
    def total(self) -> int:
        return len(self.gpus)

    @property
    def lendable(self) -> int:
        return sum(1 for g in self.gpus if g.lendable)

    @property
    def lent(self) -> int:
        return sum(1 for g in self.gpus if g.lent)


@dataclass(frozen=True, slots=True)
class QueueStatus:
    name: str
    type: str
    weight: int
    capacity: str
    pending: int
    running: int
    gangjobs: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StatusReport:
    nodes: tuple[NodeStatus, ...]
    queues: tuple[QueueStatus, ...]

    def to_json(self) -> JSON:
        return {
            "nodes": [
                {
                    **asdict(n),
                    "total": n.total,
                    "lendable": n.lendable,
                    "lent": n.lent,
                    "gpus": [asdict(g) for g in n.gpus],
                }
                for n in self.nodes
            ],
            "queues": [asdict(q) for q in self.queues],
        }


def _spot_users(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """(node, real device) -> spot pods using it, from their assigned twins."""
    users: dict[tuple[str, str], list[str]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or pod_phase(pod) in ("Succeeded", "Failed"):
            continue
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.ASSIGNED_DEVICES)
        twins = parse_assigned_devices(raw, strict=False).get(SPOT_GPU_RESOURCE, []) if raw else []
        try:
            reals = [from_spot_id(t) for t in twins]
        except ValidationError:
            continue
        for real in reals:
            users.setdefault((node, real), []).append(f"{namespace_of(pod)}/{name_of(pod)}")
    return users


def build_report(
    *,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    queues: Iterable[Mapping[str, Any]],
    podgroups: Iterable[Mapping[str, Any]],
    gangjobs: Iterable[Mapping[str, Any]],
) -> StatusReport:
    users = _spot_users(pods)
    node_rows: list[NodeStatus] = []
    for obj in sorted(nodes, key=name_of):
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        raw = annotations.get(keys.NODE_SPOT_GPU_STATE)
        if raw is None:
            continue
        name = name_of(obj)
        problem = ""
        try:
            lending, strategy = parse_node_annotations(name, annotations)
        except ValidationError as exc:
            lending, strategy, problem = False, None, str(exc)
        gpus: list[GPUStatus] = []
        try:
            state = json.loads(raw)
            if not isinstance(state, dict):
                raise ValueError("not a JSON object")
            for device, raw_entry in sorted(state.items()):
                entry = raw_entry if isinstance(raw_entry, dict) else {}
                owner = entry.get("owner")
                gpus.append(
                    GPUStatus(
                        id=str(device),
                        owner=None if owner in (None, "", "IdleSpace") else str(owner),
                        state=str(entry.get("state", "unknown")),
                        twin=str(entry.get("health", "Unhealthy")),
                        users=tuple(sorted(users.get((name, str(device)), []))),
                    )
                )
        except ValueError as exc:
            problem = problem or f"{keys.NODE_SPOT_GPU_STATE} is malformed: {exc}"
        node_rows.append(
            NodeStatus(name, node_ready(obj), lending, strategy.value if strategy else "?", tuple(gpus), problem)
        )

    pending: dict[str, int] = {}
    running: dict[str, int] = {}
    for pg in podgroups:
        queue = str((pg.get("spec") or {}).get("queue") or "")
        phase = str((pg.get("status") or {}).get("phase") or "Pending")
        if phase == "Running":
            running[queue] = running.get(queue, 0) + 1
        elif phase in ("Pending", "Inqueue"):
            pending[queue] = pending.get(queue, 0) + 1
    jobs: dict[str, dict[str, int]] = {}
    for gj in gangjobs:
        queue = str((gj.get("spec") or {}).get("queue") or "")
        phase = str((gj.get("status") or {}).get("phase") or GangJobPhase.PENDING.value)
        jobs.setdefault(queue, {})
        jobs[queue][phase] = jobs[queue].get(phase, 0) + 1
    queue_rows: list[QueueStatus] = []
    for obj in sorted(queues, key=name_of):
        try:
            qv = QueueView.parse(obj)
        except ValidationError:
            continue
        capacity = (obj.get("spec") or {}).get("capacity")
        queue_rows.append(
            QueueStatus(
                qv.name,
                qv.type.value,
                qv.weight,
                "-" if capacity is None else str(capacity),
                pending.get(qv.name, 0),
                running.get(qv.name, 0),
                dict(sorted(jobs.get(qv.name, {}).items())),
            )
        )
    return StatusReport(tuple(node_rows), tuple(queue_rows))


def collect(connection: Connection) -> StatusReport:
    """List what the report needs (raw JSON, one request per kind) and build it."""

    def items(path: str, what: str, params: Mapping[str, str] | None = None) -> list[JSON]:
        return list(connection.get(path, params or {}, what).get("items") or [])

    return build_report(
        nodes=items(collection_path("", "v1", "nodes"), "list nodes"),
        pods=items(
            collection_path("", "v1", "pods"),
            "list spotgpu pods",
            {"fieldSelector": f"spec.schedulerName={keys.SCHEDULER_NAME}"},
        ),
        queues=items(collection_path(GROUP, VERSION, "queues"), "list queues"),
        podgroups=items(collection_path(GROUP, VERSION, "podgroups"), "list podgroups"),
        gangjobs=items(collection_path(GROUP, VERSION, "gangjobs"), "list gangjobs"),
    )


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain, aligned text table (kubectl style)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["   ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def render_table(report: StatusReport) -> str:
    node_rows = []
    for n in report.nodes:
        lent_to = sorted({u for g in n.gpus for u in g.users})
        states: dict[str, int] = {}
        for g in n.gpus:
            states[g.state] = states.get(g.state, 0) + 1
        node_rows.append(
            [
                n.name,
                "Ready" if n.ready else "NotReady",
                str(n.total),
                str(n.lendable),
                str(n.lent),
                ",".join(lent_to) or "-",
                " ".join(f"{k}={v}" for k, v in sorted(states.items())) or "-",
                f"{'lending' if n.lending else 'idle-only'}/{n.strategy}" + (f" ({n.problem})" if n.problem else ""),
            ]
        )
    queue_rows = [
        [
            q.name,
            q.type,
            str(q.weight),
            q.capacity,
            str(q.pending),
            str(q.running),
            " ".join(f"{k}={v}" for k, v in q.gangjobs.items()) or "-",
        ]
        for q in report.queues
    ]
    return (
        table(["NODE", "STATUS", "GPUS", "LENDABLE", "LENT", "LENT TO", "OWNERS", "MODE"], node_rows)
        + "\n\n"
        + table(["QUEUE", "TYPE", "WEIGHT", "CAPACITY", "PENDING", "RUNNING", "GANGJOBS"], queue_rows)
    )


__all__ = ["GPUStatus", "NodeStatus", "QueueStatus", "StatusReport", "build_report", "collect", "render_table", "table"]
