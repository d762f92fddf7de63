"""The release invariant: who may still hold a returning owner's GPUs when its call is released.

Pure; no I/O. The agent's return path (:mod:`spotgpu.agent.evictor`) asks, after the spot tasks
were stopped and before the owner's held call goes on, which processes on the node still hold a
device node of the owner's GPUs; :mod:`spotgpu.adapters.holderscan` finds them by what they hold
(the open files of every process in the kubelet's pod cgroups), not by which pod the scheduler
or the kubelet thinks they belong to, and this module judges each one.

A process is judged by its cgroup (the pod UID and container ID the cgroup path names) and by
what it holds (:class:`Holding`):

* **victim pod**: a process of a pod being evicted that holds the owner's GPU nodes or a control
  node dies, in whatever container it runs (init containers, native sidecars, ephemeral
  containers and containers nobody listed yet included: the containers the API and containerd
  know were stopped before through containerd, the rest go with the pod's deletion). A victim
  pod's process that holds nothing is not waited for: killing it (the sandbox's ``pause``
  among them) would only delay the owner, and what it might still receive is the holder
  watch's (:mod:`spotgpu.agent.holderwatch`);
* **foreign GPU holder**: a process holding a device node of the owner's GPUs must be in a pod
  allocated those GPUs (the owner's own pod, as pod-resources says) or in an exempt pod;
* **foreign control holder**: a process holding a shared control node (``nvidiactl``,
  ``nvidia-uvm``: every GPU container has them) must be in a pod that holds some GPU on this node
  (an owner, a spot pod of a GPU still lent) or be unknown to the agent (a pod created since its
  last view: never killed on a guess). A known pod that holds no GPU has no business with them.

Exempt pods are the operator's (``agent.eviction.releaseCheck.exemptNamespaces``: a vendor's
DCGM exporter or device plugin running as pods); processes outside the pod cgroups (node daemons:
persistenced, a host DCGM) are never scanned at all. Everything else a tenant runs is judged.

When the owner's own pod cannot be identified (neither its pod UID nor a container ID is known)
the GPU-holder rule cannot tell the owner from a stranger: :func:`judge` then never condemns a
GPU holder (killing the owner is the one thing worse than a late release) and the scope says so
(:attr:`ReleaseScope.owner_known`), so the caller logs and counts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Verdict(StrEnum):
    """Why a process must die before the owner's release."""

    VICTIM_POD = "victim-pod"
    FOREIGN_GPU_HOLDER = "foreign-gpu-holder"
    FOREIGN_CONTROL_HOLDER = "foreign-control-holder"


@dataclass(frozen=True, slots=True)
class Holding:
    """One process as the scan saw it."""

    pid: int
    pod_uid: str | None
    """The pod UID its cgroup path names (None: not in a pod cgroup)."""
    container_id: str | None
    """The 64-hex container ID its cgroup path names."""
    gpu: bool = False
    """It holds an open file of a device node of the owner's GPUs."""
    control: bool = False
    """It holds an open file of a shared control node."""


@dataclass(frozen=True, slots=True)
class ReleaseScope:
    """What the judgement of one return needs to know (plain data from the eviction plan)."""

    owner_pods: frozenset[str] = frozenset()
    """UIDs of the pods pod-resources says hold the returning owner's GPUs."""
    owner_containers: frozenset[str] = frozenset()
    """Container IDs of the owner (for a pod whose UID the agent does not know)."""
    victim_pods: frozenset[str] = frozenset()
    """UIDs of the spot pods being evicted."""
    gpu_pods: frozenset[str] = frozenset()
    """UIDs of the pods holding any GPU (real or a twin) on this node after the return."""
    known_pods: frozenset[str] = frozenset()
    """UIDs of every pod the agent knows on this node."""
    exempt_pods: frozenset[str] = frozenset()
    """UIDs of the pods in exempt namespaces."""
    only_known: bool = False
    """Judge only pods in :attr:`known_pods` (the holder watch, between returns: a pod the agent
    has not seen yet may be a spot pod that just started)."""

    @property
    def owner_known(self) -> bool:
        return bool(self.owner_pods or self.owner_containers)

    def skips_files(self, pod_uid: str | None, container_id: str | None) -> bool:
        """Whether a process's open files need not be read: it can be condemned by none of the
        file rules (the owner's, an exempt pod's), or by its pod alone (a victim pod's)."""
        if pod_uid is None:
            return True
        return pod_uid in self.exempt_pods or self._is_owner(pod_uid, container_id)

    def _is_owner(self, pod_uid: str | None, container_id: str | None) -> bool:
        return (pod_uid is not None and pod_uid in self.owner_pods) or (
            container_id is not None and container_id in self.owner_containers
        )


def judge(process: Holding, scope: ReleaseScope) -> Verdict | None:
    """Whether ``process`` must die before the owner is released (module docstring); None: not."""
    uid = process.pod_uid
    if uid is None or uid in scope.exempt_pods or scope._is_owner(uid, process.container_id):
        return None
    if scope.only_known and uid not in scope.known_pods:
        return None
    if uid in scope.victim_pods and (process.gpu or process.control):
        return Verdict.VICTIM_POD
    if process.gpu and scope.owner_known:
        return Verdict.FOREIGN_GPU_HOLDER
    if process.control and uid in scope.known_pods and uid not in scope.gpu_pods:
        return Verdict.FOREIGN_CONTROL_HOLDER
    return None


@dataclass(frozen=True, slots=True)
class ReleaseReport:
    """What one release check found and did."""

    killed: dict[Verdict, int] = field(default_factory=dict)
    """Processes SIGKILLed, per verdict."""
    remaining: tuple[Holding, ...] = ()
    """Condemned processes still alive when the check gave up (empty: the invariant holds)."""
    rounds: int = 0
    looked_at: int = 0
    """Processes whose files the scans read (all rounds)."""
    seconds: float = 0.0
    owner_known: bool = True

    @property
    def clean(self) -> bool:
        return not self.remaining


__all__ = ["Holding", "ReleaseReport", "ReleaseScope", "Verdict", "judge"]
