"""The guard executor: the solver's arm / disarm calls and its questions about coverage.

Decides nothing (whether to lend an uncovered owner is :mod:`spotgpu.core.lending`'s rule).
Side effects: calls on the :class:`~spotgpu.ports.kube.GuardPort`, a metric and a log line per
failure. A node without a guard (none configured, or unavailable) arms nothing and covers
nobody.
"""

from __future__ import annotations

import logging

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.core import keys
from spotgpu.core.refs import ContainerRef
from spotgpu.ports.guard import GuardPort
from spotgpu.ports.kube import PodInfo

log = logging.getLogger(__name__)


class GuardExecutor:
    def __init__(self, guard: GuardPort | None, *, metrics: AgentMetrics) -> None:
        self.guard = guard
        self.metrics = metrics

    @property
    def present(self) -> bool:
        return self.guard is not None and self.guard.available

    def covers(self, owner: ContainerRef) -> bool:
        """The guard holds a notify fd of ``owner``: it can catch its return."""
        return self.guard is not None and self.guard.available and self.guard.covers(owner)

    def arm(self, owner: ContainerRef) -> bool:
        """Arm the guard for ``owner``; False when that failed (then nothing may be lent)."""
        if self.guard is None or not self.guard.available:
            return True
        try:
            self.guard.arm(owner)
        except Exception as exc:
            log.error("arming the guard for %s failed; not lending: %s", owner, exc)
            self.metrics.detector_errors.labels(kind="guard_arm").inc()
            return False
        log.info("guard armed for %s", owner)
        return True

    def disarm(self, owner: ContainerRef) -> None:
        if self.guard is None or not self.guard.available:
            return
        try:
            self.guard.disarm(owner)
        except Exception as exc:  # the guard fails open by itself after its timeout
            log.error("disarming the guard for %s failed: %s", owner, exc)
            self.metrics.detector_errors.labels(kind="guard_disarm").inc()
            return
        log.info("guard disarmed for %s", owner)

    def why_uncovered(self, pod: PodInfo | None) -> str:
        """Why the guard does not cover the owner of ``pod``, for people (a node event)."""
        if not self.present:
            return "is not available on this node"
        if pod is not None and pod.annotations.get(keys.GUARD) == keys.GUARD_OPT_OUT:
            return f"is opted out ({keys.GUARD}: {keys.GUARD_OPT_OUT})"
        return f"holds no notify fd of it (rule not injected, see {keys.GUARD_SKIPPED} in its spec, or the fd was lost)"


__all__ = ["GuardExecutor"]
