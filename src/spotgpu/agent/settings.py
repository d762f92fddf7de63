"""The solver's settings: one frozen record the coordinator and its executors read.

Plain data; no side effects. Built by :class:`spotgpu.agent.service.Agent` from the agent's
configuration (:class:`~spotgpu.core.config.AgentConfig`). One of the agent's pure modules
(``model``, ``steer``, ``detect``, ``settings``, ``ports``): an import-linter contract keeps
adapters, gRPC, protobuf, Prometheus and NVML out of it and of everything it imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spotgpu.agent.steer import TwinPool, twin_pools
from spotgpu.core import keys
from spotgpu.core.config import AgentConfig, EvictionConfig, LendingConfig
from spotgpu.core.ids import NodeName, ResourceName
from spotgpu.core.lending import LendRules


@dataclass(frozen=True, slots=True)
class EvictionSettings:
    """How an eviction stops spot tasks and how long it retries their pods' deletion."""

    sigterm_grace: float = 0.0
    stop_timeout: float = 10.0
    """Longest wait for spot tasks to exit (after the grace)."""
    delete_budget: float = 2.0
    """Real seconds spent retrying pod deletions before they are left for
    :meth:`~spotgpu.agent.evictor.Evictor.retry_pending`."""


@dataclass(frozen=True, slots=True)
class SolverSettings:
    node: NodeName
    gpu_resource: ResourceName
    spot_resource: ResourceName
    max_inactive_time: float
    sigterm_grace: float = 0.0
    stop_timeout: float = 10.0
    """Longest wait for spot tasks to exit (after the grace)."""
    delete_budget: float = 2.0
    """Time spent retrying pod deletions during an eviction before the owner is released anyway."""
    twin_replicas: int = 1
    """Legacy: replicas of the spot resource itself (:func:`~spotgpu.agent.steer.twin_pools`)."""
    shared_replicas: int = 0
    """Replicas per GPU of the shared spot resource (0: not served)."""
    grant_ttl: float = 60.0
    """Seconds an Allocate's grant counts as in use before pod-resources reports it (an admission
    that failed after our Allocate never shows up there)."""
    preference_ttl: float = 10.0
    """Seconds a GetPreferredAllocation's chosen pod waits for its Allocate."""
    shadow_namespace: str = keys.DEFAULT_SHADOW_NAMESPACE
    """Where authentic ShadowPods live (:mod:`spotgpu.core.shadow`)."""
    candidate_wait: float = 1.0
    """Seconds GetPreferredAllocation waits for the pod watch when no pod of the requested size is
    waiting for admission: the kubelet's own watch may deliver a freshly bound pod a moment
    before ours does."""
    lending: LendingConfig = field(default_factory=LendingConfig)
    """The lending policy (``agent.lending``)."""
    return_path: EvictionConfig = field(default_factory=EvictionConfig)
    """The return path's switches (``agent.eviction``): the evictor's thread priority, pinning."""

    @classmethod
    def from_config(cls, config: AgentConfig, node: NodeName) -> SolverSettings:
        """The settings the agent on ``node`` runs with (the rest keep their defaults)."""
        return cls(
            node=node,
            gpu_resource=config.gpu_resource,
            spot_resource=config.spot_resource,
            max_inactive_time=config.max_inactive_time,
            lending=config.lending,
            sigterm_grace=config.sigterm_grace,
            stop_timeout=config.eviction_timeout,
            twin_replicas=config.twin_replicas,
            shared_replicas=config.shared_replicas,
            shadow_namespace=config.shadow_namespace,
            return_path=config.eviction,
        )

    @property
    def pools(self) -> tuple[TwinPool, ...]:
        return twin_pools(self.spot_resource, twin_replicas=self.twin_replicas, shared_replicas=self.shared_replicas)

    @property
    def exempt_namespaces(self) -> tuple[str, ...]:
        """Namespaces the release check exempts (``agent.eviction.releaseCheck.exemptNamespaces``)."""
        return self.return_path.release_check.exempt_namespaces

    @property
    def rules(self) -> LendRules:
        return LendRules(self.max_inactive_time, self.lending)

    @property
    def eviction(self) -> EvictionSettings:
        return EvictionSettings(self.sigterm_grace, self.stop_timeout, self.delete_budget)


__all__ = ["EvictionSettings", "SolverSettings"]
