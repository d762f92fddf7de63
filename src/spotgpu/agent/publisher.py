"""The publisher: twin health, and where it goes (device plugin lists, metrics, node annotations).

Decisions come from :func:`~spotgpu.agent.model.twin_health`, :func:`~spotgpu.agent.steer.pool_health`,
:func:`~spotgpu.agent.model.node_state_annotation` and :func:`~spotgpu.core.lending.idle_forecast`
(pure); this module applies them. Side effects: the device plugins' twin lists (a callable per
served resource), the health and owner-count metrics, and one merge-patch of the node's
annotations (:data:`~spotgpu.core.keys.NODE_SPOT_GPU_STATE` and
:data:`~spotgpu.core.keys.NODE_IDLE_FORECAST` together) when either value changed.

Not thread-safe: the solver calls :meth:`Publisher.publish` under its lock, and
:meth:`Publisher.annotate` (the API call) outside it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.agent.model import Sources, node_state_annotation, twin_health
from spotgpu.agent.steer import DeviceUse, TwinKind, pool_health
from spotgpu.core import keys
from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import DeviceID, NodeName, ResourceName, to_spot_id
from spotgpu.core.lending import IdleForecast, LendState
from spotgpu.core.mapping_cache import MappingSnapshot
from spotgpu.core.refs import ContainerRef
from spotgpu.core.types import Health
from spotgpu.ports.kube import KubePort
from spotgpu.ports.node import GpuDevice

log = logging.getLogger(__name__)

PublishFn = Callable[[ResourceName, Sequence[tuple[DeviceID, Health, int | None]]], None]
"""Receives a resource and ``(twin ID, health, NUMA node)`` for every twin of it (that resource's
device plugin list); called once per served resource."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the node looks like to the publisher at one moment (the solver's state)."""

    devices: tuple[GpuDevice, ...]
    snapshot: MappingSnapshot
    lend_states: Mapping[ContainerRef, LendState]
    shadow: frozenset[ContainerRef]
    pool_twins: Mapping[ResourceName, Mapping[DeviceID, DeviceID]]
    kinds: Mapping[ResourceName, TwinKind]
    use: Mapping[DeviceID, DeviceUse] | None = None
    """Twins in use per GPU (needed by :meth:`Publisher.publish` only)."""
    sources: Sources | None = None
    """Who Allocate would name per GPU (needed by :meth:`Publisher.publish` only: a twin is
    Healthy exactly when Allocate would give it)."""


def forecast_annotation(forecasts: Mapping[DeviceID, IdleForecast]) -> str:
    """JSON for :data:`~spotgpu.core.keys.NODE_IDLE_FORECAST`: ``{"spot-<real id>": {"expected",
    "p20"}}`` per lent real device (devices whose twin ID would be too long are left out)."""
    out: dict[str, dict[str, int]] = {}
    for real, f in forecasts.items():
        try:
            twin = to_spot_id(real)
        except ValidationError:
            continue
        out[twin] = {"expected": f.expected, "p20": f.p20}
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


class Publisher:
    """Publishes twin health and the node annotations (see module docstring)."""

    def __init__(self, node: NodeName, *, kube: KubePort, publish: PublishFn, metrics: AgentMetrics) -> None:
        self.node = node
        self.kube = kube
        self._publish_fn = publish
        self.metrics = metrics
        self.health: dict[DeviceID, Health] = {}
        """Per real device, as last published (Healthy: lendable)."""
        self.twin_health: dict[ResourceName, dict[DeviceID, Health]] = {}
        """Per served resource, every twin's health as last published."""
        self._last_annotations: dict[str, str] | None = None
        self._forecast: tuple[dict[DeviceID, IdleForecast], str] = ({}, forecast_annotation({}))
        """The last forecasts and their JSON (they change a few times per loan)."""

    def publish(self, view: NodeView) -> None:
        """Recompute twin health from ``view`` and hand it to the device plugins and the metrics."""
        assert view.use is not None and view.sources is not None
        self.health = twin_health(view.devices, view.snapshot, view.lend_states, view.shadow)
        self.twin_health = pool_health(
            view.pool_twins,
            view.kinds,
            self.health,
            view.use,
            owners=view.sources.owners,
            pending=view.sources.pending,
        )
        numa = {d.id: d.numa_node for d in view.devices}
        for resource, twins in view.pool_twins.items():
            health = self.twin_health[resource]
            self._publish_fn(resource, [(twin, health[twin], numa[real]) for twin, real in twins.items()])
        self.metrics.set_health({real: h is Health.HEALTHY for real, h in self.health.items()})
        counts = {s.value: 0 for s in LendState}
        for state in view.lend_states.values():
            counts[state.value] += 1
        self.metrics.set_owner_counts(counts)

    def annotations(
        self, view: NodeView, forecasts: Mapping[DeviceID, IdleForecast], *, replicas: int
    ) -> dict[str, str]:
        """The node annotations ``view`` implies (with the health last published)."""
        state = node_state_annotation(
            view.devices, view.snapshot, view.lend_states, self.health, view.shadow, replicas=replicas
        )
        if forecasts != self._forecast[0]:
            self._forecast = (dict(forecasts), forecast_annotation(forecasts))
        return {keys.NODE_SPOT_GPU_STATE: state, keys.NODE_IDLE_FORECAST: self._forecast[1]}

    def changed(self, values: Mapping[str, str]) -> bool:
        return dict(values) != self._last_annotations

    def annotate(self, values: Mapping[str, str]) -> None:
        """Patch the node's annotations to ``values`` when they changed (best effort)."""
        if not self.changed(values):
            return
        try:
            self.kube.patch_node_annotations(self.node, dict(values))
        except Exception as exc:
            log.warning("patching node %s annotation failed (retried next cycle): %s", self.node, exc)
            return
        self._last_annotations = dict(values)


__all__ = ["NodeView", "PublishFn", "Publisher", "forecast_annotation"]
