"""Acting out decisions in the model: a cycle's binds, ShadowPods, evictions and nominations,
and what follows them (a gang torn down, pods and ShadowPods going away).

No I/O. :meth:`Decisions.apply` first hands a cycle's result to the model-level applier
(:class:`spotgpu.scheduler.apply.ModelApplier`, the one statement of what each decision does),
which checks it against the snapshot it was made from; then it changes the model, with the
latencies, keeping the invariant checker, the metrics and the node index informed. An evicted
spot gang loses the work since its last checkpoint on every member and its pods go away after
the teardown latency.
"""

from __future__ import annotations

import math

from spotgpu.core.types import EvictionReason
from spotgpu.scheduler.apply import ApplyError, ModelApplier
from spotgpu.scheduler.decisions import Bind, CreateShadowPod, CycleResult
from spotgpu.scheduler.model import Nomination, Snapshot
from spotgpu.sim.engine import Priority
from spotgpu.sim.events import PodsGone, ShadowGone
from spotgpu.sim.model import JobPhase, JobSim, PodSim, ShadowSim
from spotgpu.sim.state import CONTAINER, Cycles, NodeIndex, PlacedSpot, Run, World


class Decisions:
    """Applies decisions and their consequences to the model (see module docstring)."""

    __slots__ = ("cycles", "index", "placed", "run", "world")

    def __init__(self, run: Run, world: World, index: NodeIndex, placed: PlacedSpot, cycles: Cycles) -> None:
        self.run = run
        self.world = world
        self.index = index
        self.placed = placed
        self.cycles = cycles

    def apply(self, result: CycleResult, snapshot: Snapshot) -> list[JobSim]:
        """Act out a cycle's decisions in the model, with their latencies; the pending jobs the
        cycle placed whole, in bind order (the caller starts them).

        First the model-level applier checks them against the snapshot they were made from: a
        decision naming a pod, device or PodGroup the snapshot does not have fails the run.
        What it does not judge (double booking, twin health, evicting reserved work) the
        invariant checker catches as the model changes.
        """
        run, world = self.run, self.world
        now = run.engine.now
        try:
            ModelApplier(snapshot, now, evicted="evicting").apply(result)
        except ApplyError as exc:
            raise run.checker.fail(now, str(exc)) from None
        for evict in result.evictions:
            pod = world.pods[evict.pod]
            run.checker.evict_allowed(now, pod)
            if not pod.evicting:
                self.evict_job(pod.job, evict.reason)
        for delete in result.shadow_deletions:
            shadow = world.shadows.get(delete.pod)
            if shadow is not None and not shadow.deleting:
                self._delete_shadow(shadow)
        for clear in result.cleared_nominations:
            cleared = world.pods.get(clear.pod)  # an evicted pod may be gone
            if cleared is not None and cleared.nominated is not None:
                self._clear_nomination(cleared)
        for nominate in result.nominations:
            pod = world.pods[nominate.pod]
            if pod.nominated is not None:
                self._clear_nomination(pod)
            pod.nominated = Nomination(nominate.node, nominate.devices)
            pod.cached = None
            for device in nominate.devices:
                world.nominated[device] = pod
            self.index.dirty.add(world.nodes_by_name[nominate.node])
        for create in result.shadow_creations:
            self._create_shadow(create)
        placed: dict[int, JobSim] = {}
        for bind in result.binds:
            job = self._bind(bind)
            placed[job.index] = job
        for status in result.statuses:
            target = world.job_by_group[status.group]
            if target.pod_phase is not status.phase:
                target.pod_phase = status.phase
                target.cached_group = None
        return [job for job in placed.values() if job.phase is JobPhase.PENDING and job.placed()]

    def _delete_shadow(self, shadow: ShadowSim) -> None:
        shadow.deleting = True
        shadow.cached = None
        self.index.dirty.add(shadow.node)
        self.world.idle_shadows.pop(shadow.ref, None)
        engine = self.run.engine
        engine.at(engine.now + self.run.lat.shadow_release, ShadowGone(shadow.ref), Priority.CONTROLLER)

    def _clear_nomination(self, pod: PodSim) -> None:
        assert pod.nominated is not None
        nominated = self.world.nominated
        for device in pod.nominated.devices:
            if nominated.get(device) is pod:
                del nominated[device]
        self.index.dirty.add(self.world.nodes_by_name[pod.nominated.node])
        pod.nominated = None
        pod.cached = None

    def _create_shadow(self, create: CreateShadowPod) -> None:
        """Create a ShadowPod (its devices are on its node: the model-level applier checked)."""
        run = self.run
        now = run.engine.now
        node = self.world.nodes_by_name[create.node]
        by_id = {g.id: g for g in node.gpus}
        gpus = []
        for device in create.devices:
            gpu = by_id[device]
            run.checker.real_alloc(now, gpu, f"ShadowPod {create.pod}")
            gpus.append(gpu)
        shadow = ShadowSim(create.pod, node, gpus, create.group, now)
        for gpu in gpus:
            gpu.owner = create.container_ref
            gpu.shadow = shadow
            run.touch(gpu)
        self.world.shadows[create.pod] = shadow
        self.index.dirty.add(node)

    def _bind(self, bind: Bind) -> JobSim:
        """Bind (checked by the model-level applier: a pending pod, devices on the node, device owners)."""
        run, world = self.run, self.world
        now = run.engine.now
        pod = world.pods[bind.pod]
        node = world.nodes_by_name[bind.node]
        by_id = {g.id: g for g in node.gpus}
        gpus = [by_id[device] for device in bind.devices]
        if bind.spot:
            for gpu in gpus:
                run.checker.spot_bind(now, pod, gpu, bind.milli)
                gpu.users.append(pod)
                if gpu.shadow is not None:
                    world.idle_shadows.pop(gpu.shadow.ref, None)
        else:
            container = pod.ref.container(CONTAINER)
            for gpu in gpus:
                run.checker.real_alloc(now, gpu, f"reserved pod {bind.pod}")
                gpu.owner = container
                gpu.reserved_pod = pod
        pod.node = node
        pod.gpus = gpus
        pod.cached = None
        if pod.nominated is not None:
            self._clear_nomination(pod)
        for gpu in gpus:
            run.touch(gpu)
        self.index.dirty.add(node)
        run.metrics.cycles.binds += 1
        return pod.job

    # --- evictions and what goes away -------------------------------------------------------
    def evict_job(self, job: JobSim, reason: EvictionReason) -> None:
        """Tear the whole gang down now: its work stops, its pods go away after the teardown."""
        if job.phase in (JobPhase.EVICTED, JobPhase.DONE):
            return
        run = self.run
        now = run.engine.now
        if job.phase is JobPhase.PENDING:
            raise run.checker.fail(now, f"eviction of job {job.spec.name}, which has no placed pod")
        for pod in job.pods:
            run.checker.evict_allowed(now, pod)
        if job.phase is JobPhase.RUNNING:
            self._lose_work(job, now)
        if job.completion is not None:
            run.engine.cancel(job.completion)
            job.completion = None
        job.phase = JobPhase.EVICTED
        self.placed.discard(job)
        job.evictions.append(reason)
        run.metrics.returns.eviction(reason, len(job.pods))
        for pod in job.pods:
            pod.killed = True
            pod.evicting = True
            pod.cached = None
            for gpu in pod.gpus:
                run.touch(gpu)
            if pod.node is not None:
                self.index.dirty.add(pod.node)  # its preemption key: these GPUs are being freed
        run.engine.at(now + run.lat.gang_teardown, PodsGone(job.index, job.attempt), Priority.CONTROLLER)

    def _lose_work(self, job: JobSim, now: float) -> None:
        """A running gang stops: the work since its last checkpoint is lost on every member."""
        assert job.started_at is not None
        work = self.run.metrics.spot
        elapsed = now - job.started_at
        step = self.run.scenario.checkpoint_interval
        saved = min(job.remaining, math.floor(elapsed / step) * step) if step > 0 else 0.0
        gpus = job.spec.gpus
        work.useful += saved * gpus
        work.checkpointed += saved * gpus
        work.wasted += (elapsed - saved) * gpus
        job.remaining -= saved

    def remove_pods(self, job: JobSim) -> None:
        """The gang's pods are gone (done, or torn down): their GPUs are free again."""
        run, world = self.run, self.world
        now = run.engine.now
        self.placed.discard(job)
        for pod in job.pods:
            for gpu in pod.gpus:
                if job.spot:
                    gpu.users.remove(pod)
                    shadow = gpu.shadow
                    if shadow is not None and not shadow.deleting and all(not g.users for g in shadow.gpus):
                        # The scheduler deletes a ShadowPod without users once it is shadowGcGrace
                        # old; a cluster's scheduler cycles anyway, so ask for one then.
                        world.idle_shadows[shadow.ref] = shadow
                        grace = run.scenario.scheduler.shadow_gc_grace
                        self.cycles.want(max(now, shadow.created_at + grace), force=True)
                else:
                    gpu.owner = None
                    gpu.reserved_pod = None
                self.index.dirty.add(gpu.node)
                run.touch(gpu)
            if pod.nominated is not None:
                self._clear_nomination(pod)
            pod.gpus = []
            pod.node = None
            del world.pods[pod.ref]
        job.pods = []
        self.cycles.want()

    def shadow_gone(self, event: ShadowGone) -> None:
        run, world = self.run, self.world
        shadow = world.shadows.pop(event.shadow)
        world.idle_shadows.pop(shadow.ref, None)
        now = run.engine.now
        for gpu in shadow.gpus:
            run.checker.shadow_gone(now, gpu)
            gpu.owner = None
            gpu.shadow = None
            run.touch(gpu)
        self.index.dirty.add(shadow.node)
        self.cycles.want()


__all__ = ["Decisions"]
