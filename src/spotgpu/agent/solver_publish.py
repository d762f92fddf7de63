"""The solver's publishing side: twin health to the device plugins, the node annotations (state
and idle forecast) and the GPU-second counters.

No decisions: :class:`~spotgpu.agent.publisher.Publisher` computes what to publish from a
:class:`~spotgpu.agent.publisher.NodeView`; this mixin builds that view from the solver's state
under its lock. :class:`SolverPublishing` is a base of :class:`spotgpu.agent.solver.Solver`
(the attributes below are the solver's).
"""

from __future__ import annotations

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.agent.lookups import SolverLookups
from spotgpu.agent.model import device_index
from spotgpu.agent.publisher import NodeView
from spotgpu.core import lending
from spotgpu.core.clock import Clock
from spotgpu.core.ids import DeviceID
from spotgpu.core.lending import IdleForecast, LendRules, LendState
from spotgpu.core.refs import ContainerRef


class SolverPublishing(SolverLookups):
    """Publishing and accounting over the solver's state (see module docstring)."""

    clock: Clock
    metrics: AgentMetrics
    _shadow: frozenset[ContainerRef]
    _rules: LendRules
    _last_tick: float | None

    def _view(self, *, use: bool) -> NodeView:
        return NodeView(
            self._devices,
            self.mapping.snapshot(),
            {o: s.state for o, s in self._owners.items()},
            self._shadow,
            self.allocator.pool_twins,
            self.allocator.kinds,
            self.allocator.use_locked() if use else None,
            self.sources_locked() if use else None,
        )

    def publish_locked(self) -> None:
        """Recompute and publish twin health (caller holds the lock)."""
        self.publisher.publish(self._view(use=True))

    def idle_forecasts(self) -> dict[DeviceID, IdleForecast]:
        """Per real device of a lent owner, its owner's predicted idle remainder now."""
        now = self.clock.monotonic()
        with self.lock:
            return lending.node_forecasts(self._owners.values(), now, self._rules)

    def annotate(self) -> None:
        """Patch the node annotations when the per-device state or the forecast changed (best effort)."""
        forecasts = self.idle_forecasts()
        with self.lock:
            view = self._view(use=False)
            values = self.publisher.annotations(view, forecasts, replicas=self.allocator.shared_replicas)
            if not self.publisher.changed(values):
                return
        self.publisher.annotate(values)

    def account(self) -> None:
        """Add lent and spot-used GPU-seconds since the last call."""
        now = self.clock.monotonic()
        with self.lock:
            last, self._last_tick = self._last_tick, now
            if last is None:
                return
            dt = max(0.0, now - last)
            lent = sum(len(s.devices) for s in self._owners.values() if s.state is LendState.LENT)
            used = sum(1 for _, (_, users) in device_index(self.mapping.snapshot()).items() if users)
        self.metrics.lent_gpu_seconds.inc(dt * lent)
        self.metrics.spot_gpu_seconds.inc(dt * used)


__all__ = ["SolverPublishing"]
