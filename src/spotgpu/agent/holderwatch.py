"""The holder watch: between returns, no process keeps a GPU it was neither allocated nor lent.

Decides nothing itself (the scopes come from :func:`spotgpu.agent.model.watch_scopes`, the
judgement from :mod:`spotgpu.core.holders`); side effects through the release check's port
(:class:`~spotgpu.ports.node.ReleaseCheck`: scans of the pod cgroups, SIGKILL of condemned
processes), metrics and log lines. Runs on its own thread of the agent (``agent-holder-watch``)
every ``agent.eviction.releaseCheck.watchInterval`` seconds, and steps aside while a return is
in flight (the return's own check runs then).

Why: the release check before a return kills every holder it can see, but a file descriptor
can be in flight (sent with SCM_RIGHTS, queued on a stranger's socket, received later), and a
spot pod can hand its GPU to a CPU pod while the GPU is lent. The watch looks at the GPUs of
every owner that is lent now or was lent within ``watchWindow`` seconds; whoever holds one of
them and is neither in the owner's pod nor, while the GPU is lent, a spot pod (a spot pod that
just started is not in pod-resources yet; one holding another GPU's fd is caught by the return's
own check), nor exempt, is killed. Only pods the agent knows are judged (a pod created since its
last view waits for the next round). GPUs never lent are left alone: what an owner does with its
own GPU is its business.
"""

from __future__ import annotations

import logging
import threading

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.agent.evictor import ReturnsInFlight
from spotgpu.agent.solver import Solver
from spotgpu.core.clock import Clock
from spotgpu.core.holders import Verdict
from spotgpu.core.lending import LendState
from spotgpu.core.refs import ContainerRef
from spotgpu.ports.node import ReleaseCheck

log = logging.getLogger(__name__)


class HolderWatch:
    """One watch (see module docstring); :meth:`tick` is one round, :meth:`run` the loop."""

    def __init__(
        self,
        solver: Solver,
        check: ReleaseCheck,
        *,
        metrics: AgentMetrics,
        clock: Clock,
        interval: float,
        window: float,
        deadline: float = 5.0,
    ) -> None:
        self.solver = solver
        self.check = check
        self.metrics = metrics
        self.clock = clock
        self.interval = interval
        self.window = window
        self.deadline = deadline
        self.returns: ReturnsInFlight = solver.returns
        self._lent_at: dict[ContainerRef, float] = {}
        """Each owner's last time seen lent (monotonic seconds); written by the watch's thread
        and, through :meth:`note_loan`, the eviction's (single dict operations, atomic)."""

    def note_loan(self, owner: ContainerRef) -> None:
        """``owner`` was lent until now (its eviction just ran): watch its GPUs for the window,
        however short the loan was (a loan between two rounds is seen by no round)."""
        self._lent_at[owner] = self.clock.monotonic()

    def watched(self) -> list[ContainerRef]:
        """Owners lent now or within the window (their last loan noted now)."""
        now = self.clock.monotonic()
        for owner, state in self.solver.state().lend_states.items():
            if state in (LendState.LENT, LendState.EVICTING):
                self._lent_at[owner] = now
        for owner in [o for o, at in self._lent_at.items() if now - at > self.window]:
            del self._lent_at[owner]
        return sorted(self._lent_at, key=lambda o: o.format())

    def tick(self) -> dict[Verdict, int]:
        """One round over the watched owners' GPUs; the processes killed, per verdict."""
        killed: dict[Verdict, int] = {}
        lent = [o for o, s in self.solver.state().lend_states.items() if s is LendState.LENT]
        for owner, devices, scope in self.solver.watch_scopes(self.watched(), lent):
            if self.returns.active:
                break  # a return is in flight: its own check covers these GPUs now
            report = self.check.clear(devices, scope, self.clock.monotonic() + self.deadline)
            log.debug("holder watch: owner %s: %d process(es) looked at", owner, report.looked_at)
            for verdict, count in report.killed.items():
                killed[verdict] = killed.get(verdict, 0) + count
                self.metrics.release_holders_killed.labels(verdict=verdict.value).inc(count)
                log.error(
                    "holder watch: killed %d process(es) holding GPU(s) %s of owner %s (%s)",
                    count,
                    list(devices),
                    owner,
                    verdict.value,
                )
            if report.remaining:
                self.metrics.release_unclean.labels(why="watch-holder-alive").inc()
                log.error("holder watch: %d condemned process(es) still alive: %s", len(report.remaining), owner)
        return killed

    def run(self, stop: threading.Event) -> None:
        log.info("holder watch: every %.1f s, GPUs lent within the last %.0f s", self.interval, self.window)
        while not stop.wait(self.interval):
            try:
                self.tick()
            except Exception:
                self.metrics.detector_errors.labels(kind="holder_watch").inc()
                log.exception("holder watch round failed")


__all__ = ["HolderWatch"]
