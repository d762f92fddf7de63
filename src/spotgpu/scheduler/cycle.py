"""Entry points: one scheduling cycle, and victim selection on its own.

Pure functions of their arguments: no I/O, no clock (``now`` is an argument), no state kept
between calls. One interpreter-level effect: while a call runs, Python's cyclic garbage
collector is paused (and resumed afterwards if it was on). A cycle allocates ~100k short-lived
objects next to a snapshot of ~200k, and the collector would otherwise traverse the snapshot
again and again (about a quarter of a large cycle's time); the cycle's own objects are freed by
reference counting when it ends (:meth:`~spotgpu.scheduler.state.ClusterState.dispose`).

Both check the snapshot completely before deciding anything and either return a complete result
or raise: :class:`~spotgpu.scheduler.model.SnapshotError` for bad input (naming
the object), :class:`~spotgpu.core.registry.RegistryError` for an unknown action or plugin name,
:class:`~spotgpu.scheduler.model.SchedulerBug` if an internal invariant breaks.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator

from spotgpu.core.refs import PodRef
from spotgpu.scheduler import actions as _actions  # registers the built-in actions
from spotgpu.scheduler import plugins as _plugins  # registers the built-in plugins
from spotgpu.scheduler.config import SchedulerConfig
from spotgpu.scheduler.decisions import CycleResult, Preemption
from spotgpu.scheduler.model import SchedulerBug, Snapshot, SnapshotError
from spotgpu.scheduler.session import Session
from spotgpu.scheduler.state import ClusterState
from spotgpu.scheduler.victims import preempt_gang

_ = (_actions, _plugins)


def _check_now(now: float) -> float:
    if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
        raise SnapshotError(f"now must be a finite number of seconds since the epoch, got {now!r}")
    return float(now)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a block (resumed afterwards if it was on)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def open_session(snapshot: Snapshot, config: SchedulerConfig | None = None, now: float = 0.0) -> Session:
    """Check and index ``snapshot`` and build the configured plugins and actions (no decisions yet).

    For callers that drive a session themselves (benchmarks, what-if tools); call
    ``session.state.dispose()`` when done with it to free it promptly.
    """
    state = ClusterState.build(snapshot, _check_now(now))
    return Session.open(state, config or SchedulerConfig())


def check_config(config: SchedulerConfig) -> None:
    """Build every configured action and plugin once, as a cycle would (for start-up).

    Raises :class:`~spotgpu.core.registry.RegistryError` for an unknown name or a plugin that
    implements no extension point, so a bad configuration stops the process at start instead of
    failing every cycle."""
    session = open_session(Snapshot.of((), ()), config)
    session.state.dispose()


def run_cycle(snapshot: Snapshot, config: SchedulerConfig | None = None, now: float = 0.0) -> CycleResult:
    """Run one scheduling cycle on ``snapshot`` at time ``now`` (epoch seconds) and return its decisions."""
    with collector_paused():
        session = open_session(snapshot, config, now)
        try:
            for action in session.actions:
                action.execute(session)
            return session.close()
        except Exception as exc:
            raise SchedulerBug(f"scheduling cycle failed, no decisions returned: {type(exc).__name__}: {exc}") from exc
        finally:
            session.state.dispose()


def select_victims(
    snapshot: Snapshot, group: PodRef, config: SchedulerConfig | None = None, now: float = 0.0
) -> Preemption:
    """Victim selection alone for the pending reserved gang ``group`` of ``snapshot`` (what-if).

    Returns which spot gangs would be evicted and which GPUs nominated if the gang preempted now,
    without running a cycle. Raises :class:`SnapshotError` if ``group`` is not a reserved PodGroup
    of the snapshot.
    """
    with collector_paused():
        return _select_victims(open_session(snapshot, config, now), group)


def _select_victims(session: Session, group: PodRef) -> Preemption:
    try:
        job = session.state.jobs.get(group)
        if job is None:
            raise SnapshotError(f"PodGroup {group} is not in the snapshot")
        if job.spot:
            raise SnapshotError(f"PodGroup {group} is a spot gang; only reserved gangs preempt")
        if job.ready >= job.group.min_member:
            return Preemption(group, False, reason="the gang already has min_member pods placed")
        try:
            outcome = preempt_gang(session, job)
            if not outcome.possible:
                return Preemption(group, False, reason=outcome.reason)
            outcome.statement.commit()
            return Preemption(
                group,
                True,
                victims=tuple(v.ref for v in outcome.victims),
                evictions=tuple(session.evictions),
                nominations=tuple(session.nominations[k] for k in sorted(session.nominations)),
                waiting_on=tuple(sorted({t.ref for t in outcome.waiting})),
            )
        except Exception as exc:
            raise SchedulerBug(f"victim selection failed: {type(exc).__name__}: {exc}") from exc
    finally:
        session.state.dispose()


__all__ = ["check_config", "collector_paused", "open_session", "run_cycle", "select_victims"]
