"""containerd's Tasks and Containers API over gRPC: stop spot containers' tasks, list containers.

Decides nothing: it carries out "stop these tasks" and answers "what runs here". Side effects:
gRPC calls on containerd's unix socket (``Kill`` sends signals to container processes).

Wire facts (protocols.md section 3): the namespace travels as gRPC metadata
``containerd-namespace`` (``k8s.io`` for Kubernetes); ``Kill`` with ``all=true`` signals every
process of the container; ``Wait`` returns when the task's init process has exited (at once if
it already has); a missing task or container is ``NOT_FOUND``. The container ID equals the CRI
container ID the Kubernetes API reports (without ``containerd://``).

Stopping is concurrent across tasks (every victim is signalled before any stop is verified),
so the time to stop N tasks is about the time to stop the slowest one. Two switches
(``agent.eviction``), both on by default:

* ``pin_pidfds``: :meth:`ContainerdTasks.pin` (the agent calls it on every refresh with the
  spot containers on lent GPUs) keeps a pidfd of each one's init, and of every process of a
  container that shares a PID namespace (:mod:`spotgpu.adapters.pidpins`); a return signals
  them at once, with no containerd call first. A container not pinned (started since the last
  refresh, or restarted: its pinned init has exited) has its init PID read from its shim's
  bundle in containerd's state folder (``state_dir``, :mod:`spotgpu.adapters.taskbundle`,
  verified by the process's cgroup), else asked from containerd (``Tasks.Get``) in parallel
  with those signals.
* ``verify_by_pidfd``: a task whose init is its PID namespace's init (every container without
  ``shareProcessNamespace``) is verified by that init's pidfd turning readable instead of
  containerd's Wait: the kernel makes a namespace's init a zombie only after every other
  process of the namespace has exited, and an exited process has closed its files (the GPU's
  among them); a pinned container sharing a PID namespace is verified by the pidfds of all its
  processes (and its ``cgroup.procs`` listing no other). containerd hears of the exits from its
  shims a moment later; what we tell it (``Kill(all)``, for any process outside the namespace)
  waits for :meth:`ContainerdTasks.after_release`, after the owner's release. Off: every stop
  is verified by containerd's Wait before the release.

A third, ``boost_cpu`` (``agent.eviction.boostCpu``, on by default): right after the SIGKILLs,
the CPU weight of the killed containers' cgroups and their ancestors is raised, and restored
once their stops are verified (:mod:`spotgpu.util.cpuboost`): a dying process must still
run to exit, and a spot pod's cgroups otherwise get the smallest share of a busy node.
A fourth, ``hold_mount_ns`` (``agent.eviction.holdMountNs``, on by default): just before the
SIGKILLs a reference to each victim's mount namespace is taken and dropped after the release
(:mod:`spotgpu.adapters.mntns`): otherwise the last process of a container tears its mount
namespace down inside its exit, an RCU grace period that a busy node stretches to tens of ms.

When containerd itself cannot be reached (restarting, crashed; its shims and containers keep
running), a spot container must still leave the owner's GPU: its processes are found through
``/proc`` (the cgroup path names the CRI container ID), pinned with a pidfd, SIGKILLed and
waited for. That needs the host's PID namespace (``hostPID``, which the agent runs with); a
container none of whose processes can be seen is reported as not verified stopped.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from spotgpu.adapters import pidpins, taskbundle
from spotgpu.adapters.mntns import MountNamespaceHold
from spotgpu.adapters.pidpins import Pinned, PinTable
from spotgpu.adapters.procattr import container_processes
from spotgpu.adapters.proto import containerd_containers_pb2 as cpb
from spotgpu.adapters.proto import containerd_containers_pb2_grpc as cpb_grpc
from spotgpu.adapters.proto import containerd_tasks_pb2 as tpb
from spotgpu.adapters.proto import containerd_tasks_pb2_grpc as tpb_grpc
from spotgpu.adapters.reaper import kill_and_wait
from spotgpu.core import keys
from spotgpu.core.errors import PermanentError, TemporaryError
from spotgpu.ports.node import RuntimeContainer, TaskState, TaskStopResult
from spotgpu.util.cpuboost import CpuBoost, Raised, cpu_knobs

log = logging.getLogger(__name__)

_TEMPORARY_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)


class ContainerdError(TemporaryError):
    """containerd could not be reached or did not answer in time."""


def _error(action: str, exc: grpc.RpcError) -> Exception:
    code = exc.code()
    text = f"containerd {action}: {code.name}: {exc.details()}"
    return ContainerdError(text) if code in _TEMPORARY_CODES else PermanentError(text)


@dataclass
class _Pending:
    container_id: str
    wait: Any
    kill: Any = None
    signal: int | None = None
    kill_error: str = ""
    unreachable: bool = False
    """containerd did not answer at all (UNAVAILABLE): the /proc fallback applies."""


def _task_id(task: tpb.Process) -> str:
    """containerd's List fills ``id`` (the task ID = container ID), not ``container_id``."""
    return task.id or task.container_id


def _log_late_kill(future: Any) -> None:
    try:
        future.result()
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            log.warning("containerd Kill after the task exited: %s: %s", exc.code().name, exc.details())
    except Exception:  # a cancelled future at shutdown
        log.debug("late Kill future ended", exc_info=True)


class ContainerdTasks:
    """A :class:`~spotgpu.ports.node.TaskPort` on a containerd socket and namespace."""

    def __init__(
        self,
        address: str,
        namespace: str = keys.CONTAINERD_K8S_NAMESPACE,
        *,
        proc_root: Path = Path("/proc"),
        verify_by_pidfd: bool = True,
        pin_pidfds: bool = True,
        boost_cpu: bool = True,
        boost: CpuBoost | None = None,
        hold_mount_ns: bool = True,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        state_dir: Path | None = None,
    ) -> None:
        target = address if address.startswith("unix:") else f"unix://{address}"
        self.address = address
        self.namespace = namespace
        self.proc_root = proc_root
        self.verify_by_pidfd = verify_by_pidfd
        """See the module docstring. It releases the owner before the shim has reaped the
        init: containerd records the task's exit a moment after the release."""
        self.cgroup_root = cgroup_root
        self.state_dir = state_dir
        """containerd's state folder (its task bundles: an unpinned task's init PID with no
        containerd call); None: init PIDs of unpinned tasks come from ``Tasks.Get``."""
        self.boost: CpuBoost | None = (boost or CpuBoost()) if boost_cpu else None
        """Raises the killed containers' CPU weight until their stops are verified; None: off
        (``boost``: a counter shared with the guard's releases)."""
        self.mntns: MountNamespaceHold | None = MountNamespaceHold(proc_root) if hold_mount_ns else None
        """Holds the killed containers' mount namespaces until after the release; None: off."""
        self.pins: PinTable | None = (
            PinTable(self._init_pids, proc_root=proc_root, cgroup_root=cgroup_root, cpu_knobs=boost_cpu)
            if pin_pidfds
            else None
        )
        """The pinned spot containers (:meth:`pin`); None when pinning is off."""
        self._deferred: list[str] = []
        """Container IDs whose ``Kill(all)`` waits for :meth:`after_release`."""
        self._deferred_lock = threading.Lock()
        # A local socket: after a containerd restart, reconnect within seconds, not gRPC's default minutes.
        self._channel = grpc.insecure_channel(
            target, options=[("grpc.min_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 2000)]
        )
        self._tasks = tpb_grpc.TasksStub(self._channel)
        self._containers = cpb_grpc.ContainersStub(self._channel)
        self._md = ((keys.CONTAINERD_NAMESPACE_HEADER, namespace),)

    def close(self) -> None:
        if self.pins is not None:
            self.pins.close()
        if self.mntns is not None:
            self.mntns.release(wait=True)
        self._channel.close()

    # -- before a return ----------------------------------------------------------------------
    def _init_pids(self, container_ids: Sequence[str]) -> dict[str, int | None]:
        """The running init PID of each task (``Tasks.Get``, in parallel); None: not running."""
        futures = {
            cid: self._tasks.Get.future(tpb.GetRequest(container_id=cid), metadata=self._md, timeout=2)
            for cid in container_ids
        }
        pids: dict[str, int | None] = {}
        for cid, future in futures.items():
            try:
                process = future.result().process
            except grpc.RpcError:
                pids[cid] = None
                continue
            pids[cid] = int(process.pid) if process.status == tpb.RUNNING and process.pid > 1 else None
        return pids

    def pin(self, container_ids: Collection[str]) -> None:
        """Keep pidfds of these containers' processes (see the module docstring and
        :meth:`PinTable.refresh`). Never raises."""
        if self.pins is None:
            return
        try:
            self.pins.refresh(container_ids)
        except Exception:  # best effort: an unpinned container goes through Tasks.Get
            log.exception("pinning spot containers failed")

    def after_release(self) -> None:
        """Tell containerd of the stops verified by pidfd (``Kill(all)``, answered off any
        waiting path): call after the owner's release."""
        if self.mntns is not None:  # the namespaces' teardowns, on a thread of their own
            self.mntns.release()
        with self._deferred_lock:
            deferred, self._deferred = self._deferred, []
        for cid in deferred:
            self._kill(cid, signal.SIGKILL, all_processes=True, timeout=10).add_done_callback(_log_late_kill)

    # -- stopping ---------------------------------------------------------------------------
    def _kill(self, container_id: str, sig: int, *, all_processes: bool, timeout: float) -> Any:
        request = tpb.KillRequest(container_id=container_id, signal=sig, all=all_processes)
        return self._tasks.Kill.future(request, metadata=self._md, timeout=timeout)

    def _wait(self, container_id: str, timeout: float) -> Any:
        request = tpb.WaitRequest(container_id=container_id)
        return self._tasks.Wait.future(request, metadata=self._md, timeout=timeout)

    def stop_tasks(self, container_ids: Sequence[str], *, grace: float, timeout: float) -> list[TaskStopResult]:
        """Stop every task (see :meth:`TaskPort.stop_tasks`); never raises for one task's failure.

        After the grace (if any), every task's processes are SIGKILLed directly
        (:meth:`_kill_now`: pinned ones at once, the others from their bundles or a ``Tasks.Get``), all before any
        stop is verified. With ``verify_by_pidfd`` a task whose pidfds can prove it gone
        (:attr:`Pinned.verifiable`) is verified by them, with no containerd round trip; every
        other task by containerd's Wait, and one not known to be its namespace's init also gets
        ``Kill(all)`` at once. containerd unreachable: through ``/proc``."""
        ids = list(dict.fromkeys(container_ids))
        if not ids:
            return []
        deadline = time.monotonic() + timeout
        pending: dict[str, _Pending] = {}
        if grace > 0 or not self.verify_by_pidfd:
            pending = {cid: _Pending(cid, self._wait(cid, timeout)) for cid in ids}
        if grace > 0:
            self._terminate(pending, min(deadline, time.monotonic() + grace), timeout)
        unfinished = [cid for cid in ids if cid not in pending or not pending[cid].wait.done()]
        pinned: dict[str, str] = {}
        raised: list[Raised] = []
        try:
            killed = self._kill_now(unfinished, pinned, raised) if unfinished else {}
            return self._finish(
                ids, unfinished, pending, killed=killed, pinned=pinned, deadline=deadline, timeout=timeout
            )
        finally:
            for r in raised:  # the victims are gone (or given up on): their weight goes back
                r.restore()

    def _finish(
        self,
        ids: list[str],
        unfinished: list[str],
        pending: dict[str, _Pending],
        *,
        killed: dict[str, Pinned],
        pinned: dict[str, str],
        deadline: float,
        timeout: float,
    ) -> list[TaskStopResult]:
        """Verify the stops of :meth:`stop_tasks` (``killed``: signalled directly; the others
        through containerd) and report each task."""
        by_pidfd = {c for c, k in killed.items() if self.verify_by_pidfd and k.verifiable}
        try:
            for cid in unfinished:
                if cid in by_pidfd:
                    continue
                p = pending.get(cid)
                if p is None:
                    p = pending[cid] = _Pending(cid, self._wait(cid, timeout))
                p.signal = 9
                if cid not in killed or not killed[cid].namespace_init:  # its others need Kill(all) too
                    p.kill = self._kill(cid, signal.SIGKILL, all_processes=True, timeout=timeout)
            gone = pidpins.wait_pinned([killed[c] for c in by_pidfd], deadline)
        finally:
            for k in killed.values():
                k.close()
        results = {cid: self._settle(p, deadline) for cid, p in pending.items() if cid not in by_pidfd}
        for cid in by_pidfd:
            state, detail = (
                (TaskState.STOPPED, "init exited" if killed[cid].namespace_init else "every process exited")
                if cid in gone
                else (TaskState.FAILED, "task did not exit in time")
            )
            how = pinned.get(cid, "pid from containerd")
            results[cid] = TaskStopResult(cid, state, None, f"{detail} ({how})", 9)
        unreachable = [
            c for c, r in results.items() if r.state is TaskState.FAILED and c in pending and pending[c].unreachable
        ]
        if unreachable:
            log.warning("containerd at %s unreachable: stopping %s through /proc", self.address, unreachable)
            results.update(self._stop_without_containerd(unreachable, deadline))
        with self._deferred_lock:  # containerd is told after the owner's release (after_release)
            self._deferred += sorted(by_pidfd | {c for c, k in killed.items() if k.namespace_init})
        return [results[cid] for cid in ids]

    def _terminate(self, pending: dict[str, _Pending], grace_end: float, timeout: float) -> None:
        """SIGTERM every task's init through containerd; wait for their exits until ``grace_end``."""
        for p in pending.values():
            p.kill, p.signal = self._kill(p.container_id, signal.SIGTERM, all_processes=False, timeout=timeout), 15
        for p in pending.values():
            remaining = grace_end - time.monotonic()
            if remaining <= 0:
                break
            try:
                p.wait.result(timeout=remaining)
            except grpc.FutureTimeoutError:
                break
            except grpc.RpcError:
                pass

    def _kill_now(self, container_ids: list[str], pinned: dict[str, str], raised: list[Raised]) -> dict[str, Pinned]:
        """SIGKILL every task's processes directly; returns the signalled ones' pins (the caller
        closes them), records in ``pinned`` how each signalled task's init was found when not by
        containerd (``pinned`` before, or ``pid from the task bundle``), adds to ``raised`` the
        CPU-weight raises of the signalled containers (the caller restores them). Pinned containers
        (:meth:`pin`) are signalled at once; for the others the init PIDs are read from their
        shims' bundles (:meth:`_bundle_init`) or, failing that, asked from containerd
        (``Tasks.Get``, issued before those signals, read after them), each pinned with a pidfd
        and signalled.

        containerd's Kill runs the OCI runtime (``runc kill``) once per task, a process start
        each, and on a small node those compete with the very exits we wait for (measured: 8
        tasks stop in ~16 ms with direct signals, ~36-46 ms through Kill). Signalling the init
        ourselves ends a container whose init is its PID namespace's init (every Kubernetes
        container without ``shareProcessNamespace``): the kernel kills the rest of the
        namespace, and the init turns into a zombie (its pidfd readable) only after all of them
        exited. A PID read from containerd is pinned with a pidfd before the signal, so a reused
        PID is never signalled after that point. Tasks not signalled here (no hostPID, not
        running) go through containerd's Kill at once.
        """
        taken = self.pins.take(container_ids) if self.pins is not None else {}
        found = {cid: f for cid in container_ids if cid not in taken and (f := self._bundle_init(cid)) is not None}
        gets = {
            cid: self._tasks.Get.future(tpb.GetRequest(container_id=cid), metadata=self._md, timeout=2)
            for cid in container_ids
            if cid not in taken and cid not in found
        }
        if self.mntns is not None:
            self.mntns.hold((fd, pid) for p in taken.values() for pid, fd in ((p.pid, p.fd), *p.members.items()))
        pidpins.signal_pinned(taken.values())
        if self.boost is not None:
            raised.append(self.boost.raise_(k for p in taken.values() for k in p.knobs))
        pinned.update(dict.fromkeys(taken, "pinned"))
        signalled = dict(taken)
        for cid, (pid, fd) in found.items():
            if (pin := self._signal_unpinned(cid, pid, fd)) is not None:
                signalled[cid], pinned[cid] = pin, "pid from the task bundle"
        for cid, future in gets.items():
            try:
                process = future.result().process
            except grpc.RpcError:
                continue
            if process.status != tpb.RUNNING or process.pid <= 1:
                continue
            try:
                fd = os.pidfd_open(process.pid)
            except OSError:
                continue  # already gone, or not visible from here (no hostPID)
            if (pin := self._signal_unpinned(cid, process.pid, fd)) is not None:
                signalled[cid] = pin
        if self.boost is not None and len(signalled) > len(taken):
            raised.append(self.boost.raise_(k for c, p in signalled.items() if c not in taken for k in p.knobs))
        return signalled

    def _bundle_init(self, container_id: str) -> tuple[int, int] | None:
        """The pinned init of an unpinned task from its shim's bundle (no containerd call,
        :mod:`spotgpu.adapters.taskbundle`); None: ask containerd."""
        if self.state_dir is None:
            return None
        return taskbundle.pin_init(self.state_dir, self.namespace, container_id, self.proc_root)

    def _signal_unpinned(self, container_id: str, pid: int, fd: int) -> Pinned | None:
        """SIGKILL one task's init pinned just now (``fd``); its pin, or None (the fd closed)
        when the signal failed."""
        pin = Pinned(container_id, pid, fd, pidpins.namespace_init(fd))  # read before the signal
        if self.boost is not None:  # also before the signal: an exited init is reaped at once
            pin.knobs = cpu_knobs(pid, proc_root=self.proc_root, cgroup_root=self.cgroup_root)
            if pidpins.exited_fds([fd]):
                pin.knobs = ()  # gone meanwhile: the PID's cgroup may be another process's
        if self.mntns is not None:
            self.mntns.hold([(fd, pid)])
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError as exc:
            log.debug("direct SIGKILL of %s (pid %d) failed: %s", container_id, pid, exc)
            pin.close()
            return None
        return pin

    def _settle(self, p: _Pending, deadline: float) -> TaskStopResult:
        kill_gone = False
        if p.kill is not None:
            try:
                p.kill.result(timeout=max(0.0, deadline - time.monotonic()))
            except grpc.FutureTimeoutError:
                p.kill_error = "Kill did not answer in time"
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    kill_gone = True  # no task, or its process already finished: Wait tells which
                else:
                    p.kill_error = f"Kill failed: {exc.code().name}: {exc.details()}"
                    p.unreachable = p.unreachable or exc.code() == grpc.StatusCode.UNAVAILABLE
        try:
            response = p.wait.result(timeout=max(0.0, deadline - time.monotonic()))
        except grpc.FutureTimeoutError:
            p.wait.cancel()
            detail = "task did not exit in time" + (f"; {p.kill_error}" if p.kill_error else "")
            return TaskStopResult(p.container_id, TaskState.FAILED, None, detail, p.signal)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return TaskStopResult(p.container_id, TaskState.GONE, None, "no such task", p.signal)
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return TaskStopResult(p.container_id, TaskState.FAILED, None, "task did not exit in time", p.signal)
            p.unreachable = p.unreachable or exc.code() == grpc.StatusCode.UNAVAILABLE
            detail = f"Wait failed: {exc.code().name}: {exc.details()}"
            return TaskStopResult(p.container_id, TaskState.FAILED, None, detail, p.signal)
        detail = "had already exited" if kill_gone else ""
        return TaskStopResult(p.container_id, TaskState.STOPPED, response.exit_status, detail, p.signal)

    def _stop_without_containerd(self, container_ids: Sequence[str], deadline: float) -> dict[str, TaskStopResult]:
        """SIGKILL every process of the containers found through ``/proc`` and wait for them."""
        wanted = set(container_ids)
        found = container_processes(wanted, self.proc_root)
        reaped = kill_and_wait(
            (pid for pids in found.values() for pid in pids),
            lambda identity: identity.container_id if identity.container_id in wanted else None,
            deadline,
            self.proc_root,
        )
        results: dict[str, TaskStopResult] = {}
        for cid in container_ids:
            killed, left = len(reaped.killed.get(cid, [])), len(reaped.alive.get(cid, []))
            if killed == 0:
                detail = "containerd unreachable and no process of the container is visible in /proc (hostPID?)"
                results[cid] = TaskStopResult(cid, TaskState.FAILED, None, detail, None)
            elif left:
                detail = f"containerd unreachable; {left} of {killed} process(es) still running after SIGKILL"
                results[cid] = TaskStopResult(cid, TaskState.FAILED, None, detail, 9)
            else:
                detail = f"containerd unreachable: {killed} process(es) SIGKILLed directly and gone"
                results[cid] = TaskStopResult(cid, TaskState.STOPPED, None, detail, 9)
        return results

    # -- inspection -------------------------------------------------------------------------
    def _process(self, container_id: str) -> tpb.Process | None:
        try:
            response = self._tasks.Get(tpb.GetRequest(container_id=container_id), metadata=self._md, timeout=5)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise _error(f"Get task {container_id}", exc) from None
        process: tpb.Process = response.process
        return process

    def init_pid(self, container_id: str) -> int | None:
        process = self._process(container_id)
        return int(process.pid) if process is not None and process.status == tpb.RUNNING and process.pid > 0 else None

    def task_status(self, container_id: str) -> str | None:
        """The task's status name (``RUNNING``, ``STOPPED``, ...); ``None`` when there is no task."""
        process = self._process(container_id)
        return None if process is None else str(tpb.Status.Name(process.status))

    def list_containers(self) -> list[RuntimeContainer]:
        try:
            containers = self._containers.List(cpb.ListContainersRequest(), metadata=self._md, timeout=10)
            tasks = self._tasks.List(tpb.ListTasksRequest(), metadata=self._md, timeout=10)
        except grpc.RpcError as exc:
            raise _error("List containers", exc) from None
        running = {_task_id(t) for t in tasks.tasks if t.status == tpb.RUNNING}
        return [RuntimeContainer(c.id, dict(c.labels), c.id in running) for c in containers.containers]


__all__ = ["ContainerdError", "ContainerdTasks"]
