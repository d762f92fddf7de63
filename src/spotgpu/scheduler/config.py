"""The scheduler's configuration (section ``scheduler`` of the YAML file).

Pure data; no side effects. Load it with ``core.config.from_mapping(SchedulerConfig, data)``
or ``core.config.load_yaml_file(path, SchedulerConfig, "scheduler")``; YAML keys are camelCase::

    scheduler:
      actions: [enqueue, allocate, preempt, backfill]
      plugins: [priority, gang, queue, gpufit, spot]
      nodeOrder: binpack            # or spread
      fragmentationWeight: 1
      victim: {priorityClass: 100, taskNumber: 10, taskResource: 10, runningDuration: 10,
               durationPolicy: shortest}
      preemptCandidateNodes: 100
      shadowGcGrace: 60s
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from spotgpu.core import keys
from spotgpu.core.configfile import ConfigError, Seconds
from spotgpu.core.refs import ContainerRef, RefError
from spotgpu.core.types import VictimWeights

DEFAULT_ACTIONS = ("enqueue", "allocate", "preempt", "backfill")
DEFAULT_PLUGINS = ("priority", "gang", "queue", "gpufit", "spot")
DEFAULT_SHADOW_GC_GRACE: Final = Seconds(60.0)


class NodeOrder(StrEnum):
    BINPACK = "binpack"
    """Fill the fullest node that fits first (keeps whole nodes free for large gangs)."""
    SPREAD = "spread"
    """Use the emptiest node first (spreads load, more headroom per node)."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    actions: tuple[str, ...] = DEFAULT_ACTIONS
    """Actions run in order each cycle (registry ``spotgpu.scheduler.framework.ACTIONS``)."""
    plugins: tuple[str, ...] = DEFAULT_PLUGINS
    """Plugins enabled; their order is the tie-break order of their sort keys."""
    node_order: NodeOrder = NodeOrder.BINPACK
    fragmentation_weight: int = 1
    """Weight of the fragmentation score against the binpack/spread score (each 0..100); 0 disables."""
    victim: VictimWeights = dataclasses.field(default_factory=VictimWeights)
    preempt_candidate_nodes: int = 100
    """At most this many feasible nodes are evaluated per preempting task (like kube-scheduler's
    minCandidateNodesAbsolute); nodes with only low-priority spot work are evaluated first."""
    shadow_gc_grace: Seconds = DEFAULT_SHADOW_GC_GRACE
    """A ShadowPod with no spot user is deleted once it is at least this old."""
    shadow_container: str = "main"
    """Container name of the ShadowPods the scheduler creates (their device-owner container)."""
    shadow_namespace: str = keys.DEFAULT_SHADOW_NAMESPACE
    """Namespace of the ShadowPods the scheduler creates: one only the scheduler may write (the
    chart's release namespace); the agents must be given the same (:mod:`spotgpu.core.shadow`)."""

    def __post_init__(self) -> None:
        if not self.actions:
            raise ConfigError("actions: at least one action is needed")
        if len(set(self.actions)) != len(self.actions):
            raise ConfigError(f"actions: {list(self.actions)} lists an action twice")
        if len(set(self.plugins)) != len(self.plugins):
            raise ConfigError(f"plugins: {list(self.plugins)} lists a plugin twice")
        if self.fragmentation_weight < 0:
            raise ConfigError(f"fragmentationWeight: must not be negative, got {self.fragmentation_weight}")
        if self.preempt_candidate_nodes < 1:
            raise ConfigError(f"preemptCandidateNodes: must be at least 1, got {self.preempt_candidate_nodes}")
        try:
            ContainerRef(self.shadow_namespace, "pod", "main")
        except RefError:
            raise ConfigError(f"shadowNamespace: {self.shadow_namespace!r} is not a valid namespace") from None
        try:
            ContainerRef("ns", "pod", self.shadow_container)
        except RefError:
            raise ConfigError(f"shadowContainer: {self.shadow_container!r} is not a valid container name") from None


__all__ = ["DEFAULT_ACTIONS", "DEFAULT_PLUGINS", "NodeOrder", "SchedulerConfig"]
