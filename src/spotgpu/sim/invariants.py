"""The invariant checker: the simulated cluster must never break the promises spotgpu makes.

Pure checks over the model; no I/O. The simulation calls it on every change that could break
a promise (a bind, an allocation, an owner coming back) and runs a full :meth:`audit` every
simulated hour and at the end. A broken invariant raises :class:`InvariantViolation` at once,
with the policy, the simulated time and the objects involved: the run fails loudly, it never
reports figures from a broken model.

The promises (the checker's own specification, written independently of the code it checks):

1. No GPU is double-booked: a real GPU has at most one holder (trace owner, reserved pod or
   ShadowPod); an exclusive spot pod is alone on its GPU; shared spot pods stay within 1000
   milli and never mix with an exclusive one.
2. Spot pods only go where the twin is Healthy: an unallocated GPU held by a ShadowPod, or a
   lent GPU of an idle owner on a lending node; never onto a reserved job's GPU or an owner
   that is using its GPU. Reserved work is never evicted.
3. An active owner never shares its GPU with spot work beyond the modelled hold: when an owner
   comes back, every spot process on its GPUs must be gone within the return path's bound
   (guard: signal + kill of every task + release; polling: time to the next poll + kill),
   computed here from the scenario's latencies.
4. The model's cross-references agree (GPU <-> pod, GPU <-> ShadowPod, GPU <-> owner).
"""

from __future__ import annotations

from collections.abc import Iterable

from spotgpu.core.errors import PermanentError
from spotgpu.core.lending import LendState
from spotgpu.core.types import GPU_MILLI
from spotgpu.sim.latency import Latencies
from spotgpu.sim.model import GpuSim, JobPhase, NodeSim, OwnerSim, PodSim

EPSILON = 1e-9


class InvariantViolation(PermanentError):
    """The simulated cluster broke one of spotgpu's promises; the message says which and where."""


class InvariantChecker:
    """Checks one policy run. ``lending`` is whether the policy lends allocated GPUs."""

    def __init__(self, policy: str, lending: bool, latencies: Latencies) -> None:
        self.policy = policy
        self.lending = lending
        self.latencies = latencies
        self.checks = 0

    def fail(self, now: float, message: str) -> InvariantViolation:
        return InvariantViolation(f"invariant broken (policy {self.policy}, t={now:.6f}s): {message}")

    # --- promise 1 and 2: placement ---------------------------------------------------------
    def twin_should_be_healthy(self, gpu: GpuSim) -> bool:
        if gpu.reserved_pod is not None:
            return False
        if gpu.owner_sim is not None:
            return self.lending and gpu.owner_sim.lend is LendState.LENT
        return gpu.shadow is not None or gpu.owner is None

    def real_alloc(self, now: float, gpu: GpuSim, holder: str) -> None:
        self.checks += 1
        if gpu.owner is not None:
            raise self.fail(now, f"GPU {gpu.id} on {gpu.node.name} is double-booked: held by {gpu.owner}, now {holder}")
        if holder.startswith("reserved ") and gpu.users:
            live = [u.ref.format() for u in gpu.users]
            raise self.fail(now, f"GPU {gpu.id} given to {holder} while spot pods {live} are still on it")

    def spot_bind(self, now: float, pod: PodSim, gpu: GpuSim, milli: int) -> None:
        self.checks += 1
        where = f"spot pod {pod.ref} on GPU {gpu.id} ({gpu.node.name})"
        if gpu.reserved_pod is not None:
            raise self.fail(now, f"{where}: the GPU belongs to reserved pod {gpu.reserved_pod.ref}")
        if gpu.owner_sim is not None:
            owner = gpu.owner_sim
            if not self.lending:
                raise self.fail(now, f"{where}: the policy does not lend allocated GPUs, owner {owner.ref}")
            if owner.lend is not LendState.LENT:
                raise self.fail(now, f"{where}: twin is Unhealthy, owner {owner.ref} is {owner.lend.value}")
        elif gpu.shadow is None:
            raise self.fail(now, f"{where}: an unallocated GPU without a ShadowPod to sync from")
        others = [u for u in gpu.users if u is not pod]
        if milli == 0 and others:
            raise self.fail(now, f"{where}: exclusive spot on a GPU already used by {[u.ref.format() for u in others]}")
        if milli:
            if any(u.request.milli == 0 for u in others):
                raise self.fail(now, f"{where}: shared spot on a GPU with an exclusive user")
            total = milli + sum(u.request.milli for u in others)
            if total > GPU_MILLI:
                raise self.fail(now, f"{where}: shared spot use {total} milli exceeds {GPU_MILLI}")

    def evict_allowed(self, now: float, pod: PodSim) -> None:
        if not pod.job.spot:
            raise self.fail(now, f"reserved pod {pod.ref} was evicted; only spot work may be")

    def shadow_gone(self, now: float, gpu: GpuSim) -> None:
        live = [u.ref.format() for u in gpu.users if not u.killed]
        if live:
            raise self.fail(now, f"GPU {gpu.id}: its ShadowPod went away while spot pods {live} still run on it")

    # --- promise 3: the owner's hold --------------------------------------------------------
    def return_bound(self, owner: OwnerSim, detect_delay: float, guard: bool) -> float:
        """Longest time spot work may stay on ``owner``'s GPUs after it comes back.

        ``detect_delay`` is the time until the agent acts (the drawn guard signal, or the wait
        for the next poll). Every task that is or may get there (the current users, plus one
        per GPU for binds in the instant before the twins turn Unhealthy) is counted in the
        kill time, at the largest value the latency tables can draw.
        """
        lat = self.latencies
        tasks = len({u.ref for g in owner.gpus for u in g.users}) + len(owner.gpus)
        return detect_delay + lat.kill_upper(tasks) + (lat.guard_release.upper if guard else 0.0)

    def owner_deadline(self, now: float, owner: OwnerSim, since: float) -> None:
        """Called at the bound: an owner still active must not share its GPUs with spot work."""
        self.checks += 1
        if not owner.active:
            return
        live = sorted({u.ref.format() for g in owner.gpus for u in g.users if g.running_spot() and not u.killed})
        if live:
            raise self.fail(
                now,
                f"owner {owner.ref} has been back for {(now - since) * 1000:.3f} ms and still shares its GPUs with "
                f"spot pods {live}, beyond the modelled hold",
            )

    # --- promise 4: the full audit ----------------------------------------------------------
    def audit(self, now: float, nodes: Iterable[NodeSim], pods: Iterable[PodSim]) -> None:
        self.checks += 1
        live = set(pods)
        for node in nodes:
            for gpu in node.gpus:
                self._audit_gpu(now, gpu, live)
        for pod in live:
            if pod.node is None:
                if pod.gpus:
                    raise self.fail(now, f"pending pod {pod.ref} holds GPUs {pod.devices}")
                continue
            for gpu in pod.gpus:
                if gpu.node is not pod.node:
                    raise self.fail(now, f"pod {pod.ref} on {pod.node.name} lists GPU {gpu.id} of {gpu.node.name}")
                if pod.job.spot and pod not in gpu.users:
                    raise self.fail(now, f"spot pod {pod.ref} lists GPU {gpu.id}, which does not list it")
                if not pod.job.spot and gpu.reserved_pod is not pod:
                    raise self.fail(now, f"reserved pod {pod.ref} lists GPU {gpu.id}, held by {gpu.owner}")

    def _audit_gpu(self, now: float, gpu: GpuSim, live: set[PodSim]) -> None:
        holders = [h for h in (gpu.owner_sim, gpu.reserved_pod, gpu.shadow) if h is not None]
        if len(holders) > 1:
            raise self.fail(now, f"GPU {gpu.id} is double-booked: {holders}")
        expected = None
        if gpu.owner_sim is not None:
            expected = gpu.owner_sim.ref
        elif gpu.reserved_pod is not None:
            pod = gpu.reserved_pod
            expected = pod.ref.container("main")
        elif gpu.shadow is not None:
            expected = gpu.shadow.ref.container("main")
        if gpu.owner != expected:
            raise self.fail(now, f"GPU {gpu.id}: recorded holder {gpu.owner} but {expected} holds it")
        exclusive = [u for u in gpu.users if u.request.milli == 0]
        if len(exclusive) > 1 or (exclusive and len(gpu.users) > 1):
            raise self.fail(now, f"GPU {gpu.id} is double-booked by spot pods {[u.ref.format() for u in gpu.users]}")
        if gpu.reserved_pod is not None and gpu.reserved_pod not in live:
            raise self.fail(now, f"GPU {gpu.id} is held by reserved pod {gpu.reserved_pod.ref}, which no longer exists")
        for user in gpu.users:
            if user not in live:
                raise self.fail(now, f"GPU {gpu.id} lists spot pod {user.ref}, which no longer exists")
            if gpu not in user.gpus:
                raise self.fail(now, f"GPU {gpu.id} lists spot pod {user.ref}, which does not list it")
            if user.job.phase is JobPhase.DONE:
                raise self.fail(now, f"GPU {gpu.id} still lists pod {user.ref} of a finished job")
        if gpu.reserved_pod is not None and any(not u.killed for u in gpu.users):
            raise self.fail(now, f"GPU {gpu.id} of reserved pod {gpu.reserved_pod.ref} shares with live spot pods")


__all__ = ["InvariantChecker", "InvariantViolation"]
