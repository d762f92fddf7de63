"""The scheduling framework's extension points, registries and the check that plugins enrol.

Pure decision code; no I/O, no clock. A cycle opens a :class:`~spotgpu.scheduler.session.Session`
on a checked :class:`~spotgpu.scheduler.state.ClusterState`, runs the configured actions (registry
:data:`ACTIONS`), each of which asks the enabled plugins (registry :data:`PLUGINS`) through the
small Protocols below, and closes it into a :class:`~spotgpu.scheduler.model.CycleResult`. Gangs
are placed through a :class:`~spotgpu.scheduler.statement.Statement`.

A plugin is any object; the session looks at which Protocols it implements (by method name) and
calls it at those extension points only. :func:`extension_points` refuses a plugin that implements
none, half of one, or has a method whose name is one letter off an extension point's (a misspelt
``class_scroe`` would otherwise enrol nowhere, silently). Plugins are built per session by their
factory ``factory(session)`` so they can read the configuration and precompute per-cycle data.

Extension points answer a :class:`~spotgpu.scheduler.status.Status` where they can refuse
(enqueue, task admission, class filters, reserve): its code says whether more capacity could
change the answer (docs/scheduler.md, "Statuses").

Node choice works on node *classes* (:class:`~spotgpu.scheduler.state.NodeClass`): class filters
and class scores must depend only on the task's shape and the class, never on a node's name;
that makes them cacheable per (shape, class) for the whole cycle.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

from spotgpu.core.registry import Registry, RegistryError
from spotgpu.scheduler.mirrors import (
    GPUState,
    JobState,
    NodeClass,
    NodeState,
    QueueState,
    TaskKind,
    TaskShape,
    TaskState,
)
from spotgpu.scheduler.status import Status

if TYPE_CHECKING:
    from spotgpu.scheduler.session import Session
    from spotgpu.scheduler.statement import Statement

SortKey = tuple[float | str, ...]


@dataclass(frozen=True, slots=True)
class Placement:
    node: NodeState
    gpus: list[GPUState]


# --------------------------------------------------------------------------------------------
# Extension points
# --------------------------------------------------------------------------------------------


@runtime_checkable
class QueueOrderPlugin(Protocol):
    def queue_key(self, queue: QueueState) -> SortKey:
        """Smaller first. Called whenever a queue is (re)considered; may depend on its usage."""
        ...


@runtime_checkable
class JobOrderPlugin(Protocol):
    def job_key(self, job: JobState) -> SortKey:
        """Smaller first, within a queue."""
        ...


@runtime_checkable
class EnqueuePlugin(Protocol):
    def enqueue_status(self, job: JobState) -> Status:
        """Whether a Pending gang may be admitted now (``OK``) or why not."""
        ...


@runtime_checkable
class TaskAdmitPlugin(Protocol):
    def admit_status(self, task: TaskState) -> Status:
        """Whether ``task`` may be placed now regardless of nodes (e.g. queue capacity)."""
        ...


@runtime_checkable
class JobReadyPlugin(Protocol):
    def job_ready(self, job: JobState) -> bool:
        """Whether the gang's placed pods suffice to commit it."""
        ...


@runtime_checkable
class ClassFilterPlugin(Protocol):
    def class_status(self, shape: TaskShape, cls: NodeClass) -> Status:
        """Whether nodes of ``cls`` can take a task of ``shape`` (reason: short, the same text for
        the same cause; ``UnschedulableAndUnresolvable`` when no freed capacity could change it)."""
        ...


@runtime_checkable
class ClassScorePlugin(Protocol):
    def class_score(self, shape: TaskShape, cls: NodeClass) -> float:
        """0..100, higher is better, for a class that passed every filter."""
        ...


@runtime_checkable
class DevicePickPlugin(Protocol):
    def handles(self, kind: TaskKind) -> bool: ...

    def pick_devices(self, shape: TaskShape, task: TaskState, node: NodeState) -> list[GPUState] | None:
        """The exact GPUs ``task`` would take on ``node`` when placed as ``shape`` (its own shape,
        or a restriction of it the session tries first), or ``None`` if it does not fit there."""
        ...


@runtime_checkable
class ReservePlugin(Protocol):
    def reserve(self, stmt: Statement, task: TaskState, placement: Placement) -> Status:
        """Claim what ``task`` needs besides its GPUs, once its node and GPUs are chosen and just
        before it is placed on them (in ``stmt``).

        Changes go through the session state's reversible primitives (the placement that follows
        refreshes the node). A refusal undoes the reservations before it; the task is not placed.
        Called for every placement, in plugin order."""
        ...

    def unreserve(self, stmt: Statement, task: TaskState, placement: Placement) -> None:
        """Undo exactly what :meth:`reserve` did (the statement is discarded), newest first."""
        ...


@runtime_checkable
class VictimScorePlugin(Protocol):
    def victim_score(self, job: JobState) -> float:
        """Cost of evicting a running gang; lower is evicted first."""
        ...


@runtime_checkable
class EvictionGatePlugin(Protocol):
    def may_evict(self, preemptor: JobState, victim: JobState) -> bool:
        """Whether ``preemptor`` may evict ``victim`` at all."""
        ...


@dataclass(frozen=True, slots=True)
class ExtensionPoint:
    name: str
    protocol: type
    methods: tuple[str, ...]


EXTENSION_POINTS: Final = (
    ExtensionPoint("QueueOrder", QueueOrderPlugin, ("queue_key",)),
    ExtensionPoint("JobOrder", JobOrderPlugin, ("job_key",)),
    ExtensionPoint("Enqueue", EnqueuePlugin, ("enqueue_status",)),
    ExtensionPoint("TaskAdmit", TaskAdmitPlugin, ("admit_status",)),
    ExtensionPoint("JobReady", JobReadyPlugin, ("job_ready",)),
    ExtensionPoint("ClassFilter", ClassFilterPlugin, ("class_status",)),
    ExtensionPoint("ClassScore", ClassScorePlugin, ("class_score",)),
    ExtensionPoint("DevicePick", DevicePickPlugin, ("handles", "pick_devices")),
    ExtensionPoint("Reserve", ReservePlugin, ("reserve", "unreserve")),
    ExtensionPoint("VictimScore", VictimScorePlugin, ("victim_score",)),
    ExtensionPoint("EvictionGate", EvictionGatePlugin, ("may_evict",)),
)
"""Every extension point, in the order the session enrols a plugin at them."""

_METHODS: Final = tuple(m for p in EXTENSION_POINTS for m in p.methods)


def extension_points(plugin: object, name: str) -> list[ExtensionPoint]:
    """The extension points ``plugin`` (registered as ``name``) implements.

    Raises :class:`~spotgpu.core.registry.RegistryError` when it implements none, only part of
    one, or has a public method whose name is close to an extension point's but not equal.
    """
    kind = type(plugin).__name__
    public = sorted(m for m in dir(plugin) if not m.startswith("_") and callable(getattr(plugin, m, None)))
    for method in public:
        if method in _METHODS:
            continue
        near = difflib.get_close_matches(method, _METHODS, n=1, cutoff=0.8)
        if near:
            raise RegistryError(
                f"scheduler plugin {name!r} ({kind}) has a method {method!r}, which is no extension point; "
                f"did you mean {near[0]!r}?"
            )
    points = []
    for point in EXTENSION_POINTS:
        have = [m for m in point.methods if m in public]
        if have and len(have) < len(point.methods):
            missing = ", ".join(m for m in point.methods if m not in have)
            raise RegistryError(
                f"scheduler plugin {name!r} ({kind}) implements {', '.join(have)} of extension point "
                f"{point.name} but not {missing}"
            )
        if have:
            points.append(point)
    if not points:
        known = ", ".join(f"{p.name} ({'/'.join(p.methods)})" for p in EXTENSION_POINTS)
        raise RegistryError(
            f"scheduler plugin {name!r} ({kind}) implements no extension point (public methods: "
            f"{', '.join(public) or 'none'}); a plugin implements at least one of: {known}"
        )
    return points


class Action(Protocol):
    name: str

    def execute(self, session: Session) -> None: ...


PluginFactory = Callable[["Session"], object]
ActionFactory = Callable[[], Action]

PLUGINS: Registry[PluginFactory] = Registry("scheduler plugin")
ACTIONS: Registry[ActionFactory] = Registry("scheduler action")


__all__ = [
    "ACTIONS",
    "EXTENSION_POINTS",
    "PLUGINS",
    "Action",
    "ActionFactory",
    "ClassFilterPlugin",
    "ClassScorePlugin",
    "DevicePickPlugin",
    "EnqueuePlugin",
    "EvictionGatePlugin",
    "ExtensionPoint",
    "JobOrderPlugin",
    "JobReadyPlugin",
    "Placement",
    "PluginFactory",
    "QueueOrderPlugin",
    "ReservePlugin",
    "SortKey",
    "TaskAdmitPlugin",
    "VictimScorePlugin",
    "extension_points",
]
