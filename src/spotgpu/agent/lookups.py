"""Read-only views of the solver's state, and what the allocator asks of its host.

No decisions and no side effects beyond reading under the solver's lock (and the hooks the
agent wires in). :class:`SolverLookups` is the base of :class:`spotgpu.agent.solver.Solver`:
the device plugin's, spotgpu-runtime's, the CLI's and the tests' questions, kept apart from
the coordination.

Not one of the agent's pure modules: it reads live state (the allocator's grants, the
publisher's twins, which record metrics), so it belongs with the solver.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from spotgpu.agent.allocator import Allocator, Grant
from spotgpu.agent.model import Sources, WatchScope, device_index, pending_shadows, watch_scopes
from spotgpu.agent.publisher import Publisher
from spotgpu.agent.settings import SolverSettings
from spotgpu.core.ids import DeviceID, ResourceName
from spotgpu.core.lending import LendState, OwnerLending
from spotgpu.core.mapping_cache import MappingCache, Owner
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import Health
from spotgpu.ports.kube import PodInfo
from spotgpu.ports.node import GpuDevice, RuntimeContainer


@dataclass
class SolverState:
    """Read-only view for tests, the CLI and the runtime's lookups."""

    lend_states: dict[ContainerRef, LendState] = field(default_factory=dict)
    health: dict[DeviceID, Health] = field(default_factory=dict)


class SolverLookups:
    """The solver's read-only side (see module docstring); the solver sets these attributes."""

    lock: threading.RLock
    mapping: MappingCache
    allocator: Allocator
    publisher: Publisher
    settings: SolverSettings
    _devices: tuple[GpuDevice, ...]
    _owners: dict[ContainerRef, OwnerLending]
    _pods: dict[PodRef, PodInfo]
    _runtime: list[RuntimeContainer]
    _evicting: set[Owner]
    live_pods: Callable[[], Sequence[PodInfo]] | None
    await_pods: Callable[[Callable[[Sequence[PodInfo]], bool], float], Sequence[PodInfo]] | None
    on_allocate: Callable[[], None] | None
    refresh_hook: Callable[[], None] | None

    # -- the allocator's host ------------------------------------------------------------------------
    def devices_locked(self) -> tuple[GpuDevice, ...]:
        return self._devices

    def health_locked(self) -> Mapping[DeviceID, Health]:
        return self.publisher.health

    def sources_locked(self) -> Sources:
        """Who holds each GPU, and the ShadowPods announced for unheld ones."""
        snapshot = self.mapping.snapshot()
        pending = pending_shadows(
            self._pods.values(), snapshot, node=self.settings.node, shadow_namespace=self.settings.shadow_namespace
        )
        return Sources({d: owner for d, (owner, _) in device_index(snapshot).items()}, pending)

    def pods_now(self) -> list[PodInfo]:
        if self.live_pods is not None:
            return list(self.live_pods())
        with self.lock:
            return list(self._pods.values())

    def await_pods_for(self, ready: Callable[[Sequence[PodInfo]], bool], timeout: float) -> list[PodInfo] | None:
        return None if self.await_pods is None else list(self.await_pods(ready, timeout))

    def allocated(self) -> None:
        if self.on_allocate is not None:
            self.on_allocate()

    def refresh_for_allocate(self) -> bool:
        if self.refresh_hook is None:
            return False
        self.refresh_hook()
        return True

    # -- device plugin and runtime lookups --------------------------------------------------------
    @property
    def resources(self) -> tuple[ResourceName, ...]:
        """The served resources; the first is the spot resource."""
        return self.allocator.resources

    def owner_of(self, device: str) -> Owner | None:
        """The recorded owner of real ``device`` (for spotgpu-runtime's source check)."""
        return self.mapping.get_device_owner(device)

    def lendable(self, device: str) -> bool | None:
        """True when real ``device``'s twin is Healthy now (spot work may use it), False when it
        is not (owner active or being evicted, GPU failed), None for a device we do not serve."""
        with self.lock:
            health = self.publisher.health.get(DeviceID(device))
        return None if health is None else health is Health.HEALTHY

    def twin_health(self) -> dict[DeviceID, Health]:
        """``{twin: health}`` of every served twin as last published (exclusive twins and
        shared replicas have distinct IDs)."""
        with self.lock:
            return {twin: h for table in self.publisher.twin_health.values() for twin, h in table.items()}

    def twin_health_of(self, resource: ResourceName) -> dict[DeviceID, Health]:
        with self.lock:
            return dict(self.publisher.twin_health.get(resource, {}))

    def grants(self) -> list[Grant]:
        """Allocations pod-resources does not report yet."""
        return self.allocator.grants()

    def state(self) -> SolverState:
        with self.lock:
            return SolverState({o: s.state for o, s in self._owners.items()}, dict(self.publisher.health))

    def watch_scopes(self, owners: Collection[ContainerRef], lent: Collection[ContainerRef]) -> list[WatchScope]:
        """The holder watch's scopes for ``owners`` not evicting now (:func:`~spotgpu.agent.model.watch_scopes`)."""
        with self.lock:
            wanted = [o for o in owners if o not in self._evicting]
            spot = [self.settings.spot_resource, *self.allocator.resources]
            return watch_scopes(
                self.mapping.snapshot(), wanted, lent, self._pods, self._runtime, spot,
                self.settings.exempt_namespaces,
            )  # fmt: skip

    def lending_states(self) -> dict[ContainerRef, OwnerLending]:
        """Every owner's state-machine state (read-only copies; for ``/debug/state`` and tests)."""
        with self.lock:
            return dict(self._owners)

    def devices(self) -> tuple[GpuDevice, ...]:
        with self.lock:
            return self._devices


__all__ = ["SolverLookups", "SolverState"]
