"""Jobs' lives: arrival, placement, start, finish, and the requeue of evicted spot gangs.

No I/O. A job's pods are created at its arrival (and again at each requeue, named by attempt);
once the scheduler has placed all of them the gang is bound and starts after the start latency
(spot or reserved, drawn from its table); it runs for its remaining work and its pods go away
when it is done. An evicted spot gang (:meth:`spotgpu.sim.apply.Decisions.evict_job`) is
requeued once its pods are gone, after ``requeueDelay``.
"""

from __future__ import annotations

from typing import assert_never

from spotgpu.core.refs import PodRef
from spotgpu.scheduler.decisions import PodGroupPhase
from spotgpu.scheduler.model import GPURequest
from spotgpu.sim.apply import Decisions
from spotgpu.sim.engine import Priority
from spotgpu.sim.events import JobArrival, JobEvent, JobFinish, JobStart, PodsGone, Requeue
from spotgpu.sim.model import JobPhase, JobSim, PodSim
from spotgpu.sim.state import Cycles, PlacedSpot, Run, World


class Jobs:
    """The job events (see module docstring)."""

    __slots__ = ("cycles", "decisions", "placed", "run", "world")

    def __init__(self, run: Run, world: World, placed: PlacedSpot, cycles: Cycles, decisions: Decisions) -> None:
        self.run = run
        self.world = world
        self.placed = placed
        self.cycles = cycles
        self.decisions = decisions

    def start(self) -> None:
        """Schedule every job's arrival."""
        engine = self.run.engine
        for job in self.world.jobs:
            engine.at(job.arrival, JobArrival(job.index))

    def handle(self, event: JobEvent) -> None:
        job = self.world.jobs[event.job]
        match event:
            case JobArrival():
                self._new_pods(job)
            case Requeue():
                job.attempt += 1
                self._new_pods(job)
            case JobStart():
                self._job_start(job, event.attempt)
            case JobFinish():
                self._job_finish(job, event.attempt)
            case PodsGone():
                self._pods_gone(job, event.attempt)
            case _:
                assert_never(event)

    def _new_pods(self, job: JobSim) -> None:
        world = self.world
        ns = job.group_ref.namespace
        job.pods = []
        for i, gpus in enumerate(job.spec.pod_gpus):
            ref = PodRef(ns, f"{job.spec.name}-{job.attempt}-{i}")
            request = GPURequest.spot(gpus) if job.spot else GPURequest.reserved(gpus)
            pod = PodSim(job, ref, request)
            job.pods.append(pod)
            world.pods[ref] = pod
        job.phase = JobPhase.PENDING
        job.pod_phase = PodGroupPhase.PENDING
        job.cached_group = None
        job.submitted_at = self.run.engine.now
        world.pending[job.index] = job
        self.cycles.want()

    def bound(self, job: JobSim) -> None:
        """All of ``job``'s pods are placed: it starts after the start latency."""
        run = self.run
        now = run.engine.now
        job.phase = JobPhase.BOUND
        job.bound_at = now
        for pod in job.pods:
            pod.cached = None
        del self.world.pending[job.index]
        if job.spot:
            self.placed.add(job)
        start = (run.lat.spot_start if job.spot else run.lat.reserved_start).sample(run.rng)
        if start > 0:
            job.completion = run.engine.at(now + start, JobStart(job.index, job.attempt))
        else:
            self._job_start(job, job.attempt)

    def _job_start(self, job: JobSim, attempt: int) -> None:
        if attempt != job.attempt or job.phase is not JobPhase.BOUND:
            return
        run = self.run
        now = run.engine.now
        job.phase = JobPhase.RUNNING
        job.started_at = now
        if job.first_start is None:
            job.first_start = now
            times = run.metrics.jobs
            (times.spot_waits if job.spot else times.reserved_waits).append(now - job.arrival)
        job.completion = run.engine.at(now + job.remaining, JobFinish(job.index, job.attempt))
        for pod in job.pods:
            for gpu in pod.gpus:
                run.touch(gpu)

    def _job_finish(self, job: JobSim, attempt: int) -> None:
        if attempt != job.attempt or job.phase is not JobPhase.RUNNING:
            return
        metrics = self.run.metrics
        now = self.run.engine.now
        if job.spot:
            metrics.spot.useful += job.remaining * job.spec.gpus
            metrics.jobs.spot_jcts.append(now - job.arrival)
        else:
            metrics.jobs.reserved_jcts.append(now - job.arrival)
        job.remaining = 0.0
        job.phase = JobPhase.DONE
        job.done_at = now
        job.completion = None
        self.decisions.remove_pods(job)

    def _pods_gone(self, job: JobSim, attempt: int) -> None:
        if attempt != job.attempt or job.phase is not JobPhase.EVICTED:
            return
        self.decisions.remove_pods(job)
        if job.spot:
            engine = self.run.engine
            delay = self.run.lat.requeue_delay
            if delay > 0:
                engine.at(engine.now + delay, Requeue(job.index), Priority.CONTROLLER)
            else:
                job.attempt += 1
                self._new_pods(job)


__all__ = ["Jobs"]
