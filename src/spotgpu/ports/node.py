"""The agent's node-side ports: GPUs, container tasks, the kubelet's pod-resources view.

Protocols and plain data only; no side effects here. Used by :mod:`spotgpu.agent`; it lives in
:mod:`spotgpu.ports`, below both the agent and the adapters, so an adapter never imports the agent.
Implementations:

* :class:`GpuBackend`: :mod:`spotgpu.adapters.nvml` (NVIDIA through NVML),
  :mod:`spotgpu.adapters.devnode_gpu` (any vendor whose GPUs are device nodes; also the
  stand-in GPUs of tests and the node end-to-end harness), and
  :class:`spotgpu.testing.fakes.FakeGpuBackend`. A new backend is one module implementing four
  methods.
* :class:`TaskPort`: :mod:`spotgpu.adapters.containerd` (containerd's Tasks and Containers
  API over gRPC; also a :class:`PinningTaskPort`) and :class:`spotgpu.testing.fakes.FakeTasks`.
* :class:`PodResourcesPort`: :class:`spotgpu.adapters.kubelet.PodResourcesView` (kubelet
  pod-resources v1, the same client spotgpu-runtime's service uses) and
  :class:`spotgpu.testing.fakes.FakePodResources`.
* :class:`LendStore`: :class:`spotgpu.adapters.agent_state.LendStateFile` (which owners are
  lent and what they taught the lending model, kept across agent restarts) and
  :class:`spotgpu.testing.fakes.FakeLendStore`.
* :class:`UtilizationReader`: the GPU backend's own utilization (NVML) or a vendor exporter
  scraped over HTTP (:mod:`spotgpu.adapters.exporters`).

Errors: implementations raise :class:`~spotgpu.core.errors.TemporaryError` for failures that
may pass (socket down, timeout) and :class:`~spotgpu.core.errors.PermanentError` otherwise.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from spotgpu.core.allocations import AllocatedDevices  # re-exported: its home is the core (no adapter -> agent import)
from spotgpu.core.holders import ReleaseReport, ReleaseScope
from spotgpu.core.idle_forecast import EMPTY_HISTORY, NO_BACKOFF, Backoff, IdleHistory
from spotgpu.core.ids import DeviceID
from spotgpu.core.refs import ContainerRef


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One real GPU as the vendor's device plugin names it."""

    id: DeviceID
    """The ID the vendor device plugin reports (NVIDIA: the UUID, ``GPU-...``)."""
    index: int
    """The vendor's device index (NVML index, exporter ``gpu`` label)."""
    uuid: str | None = None
    minor: int | None = None
    """The device node's minor number (``/dev/nvidia<minor>``)."""
    numa_node: int | None = None
    """NUMA node for the twin's topology; ``None``: no preference."""
    healthy: bool = True
    """False when the backend reports the GPU failed (its twin is then never Healthy)."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process using a GPU, by host PID."""

    pid: int
    device: DeviceID
    used_memory: int | None = None
    """Bytes, when the backend knows."""


class GpuBackend(Protocol):
    """Inventory, running processes and utilization of this node's real GPUs."""

    name: str

    def devices(self) -> tuple[GpuDevice, ...]:
        """Every real GPU, in index order. Called at start and on each detection cycle."""
        ...

    def processes(self) -> Mapping[DeviceID, tuple[GpuProcess, ...]]:
        """Processes on each GPU (host PIDs); every device of :meth:`devices` is a key."""
        ...

    def utilization(self) -> Mapping[DeviceID, float | None]:
        """Busy percentage (0-100) per GPU over the backend's sample period; ``None``: unknown."""
        ...

    def close(self) -> None: ...


class UtilizationReader(Protocol):
    """Where the detector gets utilization: the backend itself, or a vendor exporter."""

    name: str

    def read(self, devices: Sequence[GpuDevice]) -> Mapping[DeviceID, float | None]:
        """Percent per device; a device the source has no series for maps to ``None``."""
        ...


class TaskState(StrEnum):
    STOPPED = "stopped"
    """The task exited (Wait returned) or had already exited."""
    GONE = "gone"
    """containerd knows no task (or container) of that ID: nothing runs."""
    FAILED = "failed"
    """Kill or Wait failed, or the task did not stop in time; it may still run."""


@dataclass(frozen=True, slots=True)
class TaskStopResult:
    container_id: str
    state: TaskState
    exit_status: int | None = None
    detail: str = ""
    signal_sent: int | None = None


@dataclass(frozen=True, slots=True)
class RuntimeContainer:
    """A container as the container runtime lists it."""

    id: str
    labels: Mapping[str, str]
    running: bool | None = None
    """Whether its task runs; ``None`` when the listing does not say."""


class TaskPort(Protocol):
    """Stopping and inspecting container tasks (containerd's Tasks/Containers API)."""

    def stop_tasks(self, container_ids: Sequence[str], *, grace: float, timeout: float) -> list[TaskStopResult]:
        """Stop every task: SIGTERM and up to ``grace`` seconds, then SIGKILL to all its
        processes; wait until each exited or ``timeout`` passed. Concurrent across tasks;
        idempotent (a stopped or missing task is success)."""
        ...

    def init_pid(self, container_id: str) -> int | None:
        """Host PID of the task's init process; ``None`` when it does not run."""
        ...

    def list_containers(self) -> list[RuntimeContainer]:
        """Every container of the configured namespace with its labels."""
        ...


@runtime_checkable
class PinningTaskPort(TaskPort, Protocol):
    """A task port that can prepare a return (:mod:`spotgpu.adapters.containerd`): it keeps
    pidfds of the containers a return would stop, and tells the runtime about verified stops
    only when the owner no longer waits."""

    def pin(self, container_ids: Collection[str]) -> None:
        """Keep the processes of these containers pinned (a pidfd each), forget the others';
        never raises (a container not pinned is stopped the slower way)."""
        ...

    def after_release(self) -> None:
        """Do the runtime bookkeeping the last stops deferred (the owner was released)."""
        ...


class PidAttributor(Protocol):
    """Host PID -> container: :class:`spotgpu.adapters.procattr.ProcessAttributor` (real /proc)."""

    def reference(self, container_id: str, init_pid: int | None) -> Any:
        """What to match processes against for one container (its init's cgroup and namespace)."""
        ...

    def attribute(self, pids: Iterable[int], containers: Mapping[str, Any]) -> dict[int, str]:
        """``{pid: container_id}`` for the PIDs that belong to one of ``containers``."""
        ...


class PodResourcesPort(Protocol):
    def list(self, timeout: float | None = None) -> list[AllocatedDevices]:
        """Device assignments of every active pod on the node (pod-resources ``List``), within
        ``timeout`` seconds (None: the client's default)."""
        ...


@dataclass(frozen=True, slots=True)
class LentOwner:
    """One owner the agent has lent out, as recorded for the next agent start."""

    owner: ContainerRef
    devices: tuple[DeviceID, ...]
    container_id: str | None
    """The owner container's runtime ID when it was lent: a restarted container is not trusted."""
    since: float
    """Wall-clock (epoch) seconds when it was lent."""


@dataclass(frozen=True, slots=True)
class LearnedOwner:
    """What an owner taught the lending model (:mod:`spotgpu.core.idle_forecast`), as recorded:
    its idle history and its backoff (``backoff.at`` in wall-clock seconds)."""

    history: IdleHistory = EMPTY_HISTORY
    backoff: Backoff = NO_BACKOFF


class LendStore(Protocol):
    """Where the agent keeps which owners are lent and what each owner taught the lending model,
    so a restart neither restarts their idle clock nor forgets their history."""

    def load(self) -> list[LentOwner]:
        """The owners recorded as lent; nothing (never an error) when there is no readable record."""
        ...

    def load_learned(self) -> dict[ContainerRef, LearnedOwner]:
        """Every recorded owner's learned state; nothing (never an error) when there is no readable record."""
        ...

    def save(self, lent: Sequence[LentOwner], learned: Mapping[ContainerRef, LearnedOwner] | None = None) -> None:
        """Replace the record atomically (``learned`` None: none). Raises
        :class:`~spotgpu.core.errors.TemporaryError` on failure."""
        ...


class ReleaseCheck(Protocol):
    """The release invariant's enforcement (:mod:`spotgpu.adapters.holderscan`): before a
    returning owner's call is released, no process but the owner's (and exempt ones) may hold a
    device node of its GPUs (:mod:`spotgpu.core.holders`)."""

    def clear(self, devices: Sequence[DeviceID], scope: ReleaseScope, deadline: float) -> ReleaseReport:
        """Kill every process :func:`~spotgpu.core.holders.judge` condemns, verify, scan again;
        until none is left or ``deadline`` (monotonic seconds) passes."""
        ...


__all__ = [
    "GpuBackend",
    "GpuDevice",
    "GpuProcess",
    "LearnedOwner",
    "LendStore",
    "LentOwner",
    "PidAttributor",
    "PinningTaskPort",
    "PodResourcesPort",
    "ReleaseCheck",
    "RuntimeContainer",
    "TaskPort",
    "TaskState",
    "TaskStopResult",
    "UtilizationReader",
]
