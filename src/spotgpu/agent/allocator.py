"""The allocation executor: the device plugin's GetPreferredAllocation and Allocate, steered to
the scheduler's GPUs, and the grants they give until pod-resources confirms them.

Decisions come from :mod:`spotgpu.agent.steer` and :func:`~spotgpu.agent.model.allocate_annotations`
(pure); this module holds the served pools, the twins in use, the grants and the last
preference, and applies the decisions. Side effects: metrics and log lines, the host's
publication (a grant turns the other kind of its GPUs Unhealthy at once) and the host's hooks
(re-read pod-resources, wait for the pod watch).

Locking: every state change happens under the host's lock (the solver's); the host hooks that
block (a pod-resources read, the pod watch wait) are called outside it. Methods named
``*_locked`` expect the caller to hold it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.agent.model import AllocateRefused, Sources, TwinView, allocate_annotations, device_index
from spotgpu.agent.settings import SolverSettings
from spotgpu.agent.steer import (
    Candidate,
    DeviceUse,
    MatchResult,
    TwinKind,
    TwinPool,
    admission_candidates,
    device_use,
    in_use_of,
    match_allocation,
    prefer,
    steering_mismatches,
    twin_view,
)
from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.clock import Clock
from spotgpu.core.ids import DeviceID, ResourceName
from spotgpu.core.mapping_cache import IDLE_SPACE, MappingCache
from spotgpu.core.refs import PodRef
from spotgpu.core.types import Health
from spotgpu.ports.kube import PodInfo
from spotgpu.ports.node import GpuDevice

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Grant:
    """A twin an Allocate gave that pod-resources does not report yet, and to whom (a guess:
    the pod the kubelet was admitting, see :func:`~spotgpu.agent.steer.match_allocation`)."""

    resource: ResourceName
    twin: DeviceID
    real: DeviceID
    pod: PodRef | None
    container: str | None
    at: float


class AllocationHost(Protocol):
    """What the allocator needs from the solver."""

    lock: threading.RLock
    mapping: MappingCache

    @property
    def settings(self) -> SolverSettings: ...

    def devices_locked(self) -> tuple[GpuDevice, ...]: ...

    def health_locked(self) -> Mapping[DeviceID, Health]:
        """Per real device, as last published (Healthy: lendable)."""
        ...

    def pods_now(self) -> list[PodInfo]:
        """This node's pods in binding order, as fresh as the host has them."""
        ...

    def await_pods_for(self, ready: Callable[[Sequence[PodInfo]], bool], timeout: float) -> list[PodInfo] | None:
        """Waits for the pod watch until ``ready(pods)`` (None: the host cannot wait)."""
        ...

    def refresh_for_allocate(self) -> bool:
        """Re-reads pod-resources now; False when the host cannot."""
        ...

    def allocated(self) -> None:
        """An Allocate succeeded (the host refreshes soon, so pod-resources confirms the grant)."""
        ...

    def publish_locked(self) -> None: ...

    def sources_locked(self) -> Sources: ...


class Allocator:
    """The served pools, their twins in use, and the device plugin answers (see module docstring)."""

    def __init__(self, pools: Sequence[TwinPool], *, host: AllocationHost, metrics: AgentMetrics, clock: Clock) -> None:
        self.pools = tuple(pools)
        self.host = host
        self.metrics = metrics
        self.clock = clock
        self.kinds = {p.resource: p.kind for p in self.pools}
        self.pool_twins: dict[ResourceName, dict[DeviceID, DeviceID]] = {p.resource: {} for p in self.pools}
        """Per served resource, ``{twin: real}``."""
        self._in_use: set[tuple[ResourceName, DeviceID]] = set()
        """Served twins pod-resources reported allocated at the last refresh."""
        self._admitted: set[tuple[PodRef, str]] = set()
        """Containers holding served twins at the last refresh (no longer admission candidates)."""
        self._grants: dict[tuple[ResourceName, DeviceID], Grant] = {}
        self._preferred: dict[ResourceName, tuple[Candidate, float]] = {}
        self._mismatched: set[tuple[PodRef, str]] = set()

    @property
    def resources(self) -> tuple[ResourceName, ...]:
        """The served resources; the first is the spot resource."""
        return tuple(p.resource for p in self.pools)

    def set_devices_locked(self, devices: Sequence[GpuDevice]) -> None:
        for pool in self.pools:
            twins = self.pool_twins[pool.resource] = pool.twins(devices)
            for device in [d.id for d in devices if d.id not in twins.values()]:
                log.error("GPU %s cannot be lent as %s: its twin IDs would exceed 63 characters", device, pool.resource)

    def use_locked(self) -> dict[DeviceID, DeviceUse]:
        """Twins in use per GPU: pod-resources' and the grants it does not report yet."""
        return device_use([*self._in_use, *self._grants], self.pool_twins, self.kinds)

    def confirm_locked(
        self, allocations: Sequence[AllocatedDevices], pods: Mapping[PodRef, PodInfo], now: float
    ) -> None:
        """Take in what pod-resources says about the served twins: the twins in use and their
        holders, grants it now reports (or that expired) dropped, and every container newly
        found on GPUs other than its assigned ones counted once."""
        self._in_use = in_use_of(allocations, self.pool_twins)
        self._admitted = {(a.pod, a.container) for a in allocations if a.resource in self.pool_twins}
        ttl = self.host.settings.grant_ttl
        for key, grant in list(self._grants.items()):
            if key in self._in_use:
                del self._grants[key]
            elif now - grant.at > ttl:
                log.warning(
                    "Allocate of %s %s (for %s) never showed up in pod-resources within %.0fs: "
                    "the admission failed; the twin is free again",
                    grant.resource,
                    grant.twin,
                    grant.pod or "an unknown pod",
                    ttl,
                )
                del self._grants[key]
        known = {d.id for d in self.host.devices_locked()}
        found = steering_mismatches(allocations, pods, self.pool_twins, known)
        for m in found:
            if (m.pod, m.container) in self._mismatched:
                continue
            self.metrics.allocation_mismatches.labels(resource=m.resource).inc()
            log.warning(
                "steering: %s/%s holds %s twins of GPU(s) %s, but the scheduler assigned %s; "
                "the node annotation reports the truth",
                m.pod,
                m.container,
                m.resource,
                list(m.allocated),
                list(m.assigned),
            )
        self._mismatched = {(m.pod, m.container) for m in found}

    def pool(self, resource: ResourceName) -> TwinPool:
        pool = next((p for p in self.pools if p.resource == resource), None)
        if pool is None:
            raise AllocateRefused(f"resource {resource!r} is not served by this agent")
        return pool

    def grants(self) -> list[Grant]:
        """Allocations pod-resources does not report yet."""
        with self.host.lock:
            return sorted(self._grants.values(), key=lambda g: (g.resource, g.twin))

    # -- GetPreferredAllocation ------------------------------------------------------------------
    def _admitted_keys(self) -> set[tuple[PodRef, str]]:
        """Containers holding twins: per pod-resources, or granted (caller holds the lock)."""
        return self._admitted | {(g.pod, g.container) for g in self._grants.values() if g.pod and g.container}

    def _candidates(self, resource: ResourceName, pods: Sequence[PodInfo]) -> list[Candidate]:
        """Admission candidates for ``resource`` (caller holds the lock)."""
        candidates, problems = admission_candidates(
            pods,
            resource,
            node=self.host.settings.node,
            admitted=self._admitted_keys(),
            known={d.id for d in self.host.devices_locked()},
        )
        for problem in problems:
            log.warning("steering: %s (steered without it)", problem)
        return candidates

    def prefer(
        self, resource: ResourceName, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """The device plugin's GetPreferredAllocation answer for one container request (see
        :func:`~spotgpu.agent.steer.prefer`); remembers the pod it chose for the Allocate that
        follows."""
        host = self.host
        pods = host.pods_now()
        with host.lock:
            admitted = self._admitted_keys()
            known = {d.id for d in host.devices_locked()}
            self.pool(resource)
        node = host.settings.node

        def waiting(candidates_of: Sequence[PodInfo]) -> bool:
            found, _ = admission_candidates(candidates_of, resource, node=node, admitted=admitted, known=known)
            return any(c.size == size for c in found)

        if not waiting(pods):
            waited = host.await_pods_for(waiting, host.settings.candidate_wait)
            pods = pods if waited is None else waited
        now = self.clock.monotonic()
        with host.lock:
            devices = host.devices_locked()
            health = host.health_locked()
            choice = prefer(
                available,
                must_include,
                size,
                pool=self.pool(resource),
                twins=self.pool_twins[resource],
                use=self.use_locked(),
                candidates=self._candidates(resource, pods),
                numa={d.id: d.numa_node for d in devices},
                lendable={r for r, h in health.items() if h is Health.HEALTHY},
                held={d for d, (owner, _) in device_index(host.mapping.snapshot()).items() if owner is not IDLE_SPACE},
            )
            if choice.candidate is not None:
                self._preferred[resource] = (choice.candidate, now)
            else:
                self._preferred.pop(resource, None)
        self.metrics.preferred_allocations.labels(
            resource=resource, result="steered" if choice.steered else "fallback"
        ).inc()
        log.info("GetPreferredAllocation %s size %d -> %s: %s", resource, size, list(choice.ids), choice.reason)
        return list(choice.ids)

    # -- Allocate ----------------------------------------------------------------------------------
    def _twin_view(self, resource: ResourceName, twin: str) -> TwinView | None:
        real = self.pool_twins.get(resource, {}).get(DeviceID(twin))
        if real is None:
            return None
        sources = self.host.sources_locked()
        return twin_view(
            twin,
            real,
            self.kinds[resource],
            self.host.health_locked(),
            self.use_locked(),
            owners=sources.owners,
            pending=sources.pending,
        )

    def allocate(self, resource: ResourceName, twins: Sequence[str]) -> dict[str, str]:
        """The device plugin's Allocate answer for one container of ``resource``: the
        ``container-devices-from`` annotation naming the owner of the real GPUs behind ``twins``
        (:func:`~spotgpu.agent.model.allocate_annotations`, which refuses exactly what
        :func:`~spotgpu.agent.model.allocate_refusal` refuses, the kind rule included). The twins
        are recorded as granted (their GPUs' other kind turns Unhealthy at once) to the pod being
        admitted; when that pod was assigned other GPUs, the mismatch is logged and counted, and
        the answer still names the GPUs behind ``twins``.

        Raises :class:`~spotgpu.agent.model.AllocateRefused` for a twin we cannot give."""
        try:
            annotations = self._allocate(resource, twins)
        except AllocateRefused:
            self.metrics.allocations.labels(resource=resource, result="refused").inc()
            raise
        self.host.allocated()
        return annotations

    def _allocate(self, resource: ResourceName, twins: Sequence[str]) -> dict[str, str]:
        self.pool(resource)  # an unknown resource raises here
        host = self.host
        for attempt in (0, 1):
            with host.lock:
                views = {t: self._twin_view(resource, t) for t in twins}
            needs_refresh = any(v is not None and v.owner is IDLE_SPACE for v in views.values())
            if needs_refresh and attempt == 0:
                log.info("Allocate %s: a twin's GPU has no holder yet; re-reading pod-resources", list(twins))
                if host.refresh_for_allocate():
                    continue
            break
        pods = host.pods_now()
        now = self.clock.monotonic()
        with host.lock:
            views = {t: self._twin_view(resource, t) for t in twins}
            annotations = allocate_annotations(twins, views.get, gpu_resource=host.settings.gpu_resource)
            preferred, at = self._preferred.pop(resource, (None, 0.0))
            if preferred is not None and now - at > host.settings.preference_ttl:
                preferred = None
            match = match_allocation(twins, self.pool_twins[resource], self._candidates(resource, pods), preferred)
            who = match.candidate
            for twin in twins:
                real = self.pool_twins[resource][DeviceID(twin)]
                self._grants[(resource, DeviceID(twin))] = Grant(
                    resource, DeviceID(twin), real, who.pod if who else None, who.container if who else None, now
                )
            host.publish_locked()  # the other kind of these GPUs turns Unhealthy now
        self.metrics.allocations.labels(resource=resource, result=match.result.value).inc()
        if match.result is MatchResult.MISMATCH:
            assert who is not None
            log.warning(
                "Allocate %s %s: the kubelet chose GPU(s) %s, but %s/%s (the pod being admitted) was assigned %s; "
                "the answer names the GPUs behind the twins",
                resource,
                list(twins),
                list(match.allocated),
                who.pod,
                who.container,
                list(who.assigned),
            )
        log.info(
            "Allocate %s %s for %s (%s) -> %s",
            resource,
            list(twins),
            f"{who.pod}/{who.container}" if who else "an unidentified pod",
            match.result.value,
            annotations,
        )
        return annotations

    @property
    def shared_replicas(self) -> int:
        """Replicas per GPU of the shared pool (0: none), for the node annotation."""
        return max((p.replicas for p in self.pools if p.kind is TwinKind.SHARED), default=0)


__all__ = ["AllocationHost", "Allocator", "Grant"]
