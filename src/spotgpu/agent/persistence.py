"""The persistence executor: the lending record as the solver reads it at recovery and writes it
when it changed.

Decides nothing. Side effects: the :class:`~spotgpu.ports.node.LendStore` (a file, see
:mod:`spotgpu.adapters.agent_state`), a metric and a log line when a save fails.

The record holds the lent owners (with wall-clock ``since``) and every current owner's learned
state (idle history and backoff). The state machine keeps its times on the solver's monotonic
clock; the backoff's time is converted to wall-clock seconds here, on the way out and in, so a
record survives an agent restart whatever the new process's monotonic origin. Comparisons
("did the record change?") happen on the monotonic values, before any conversion, so an
unchanged state never causes a write.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.core.clock import Clock
from spotgpu.core.errors import SpotgpuError
from spotgpu.core.idle_forecast import Backoff
from spotgpu.core.ids import DeviceID
from spotgpu.core.mapping_cache import Owner
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.ports.node import LearnedOwner, LendStore, LentOwner

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Record:
    """What the record says (``learned`` with backoff times on the solver's monotonic clock)."""

    lent: Mapping[ContainerRef, LentOwner] = field(default_factory=dict)
    learned: Mapping[ContainerRef, LearnedOwner] = field(default_factory=dict)


def _shift(learned: Mapping[ContainerRef, LearnedOwner], offset: float) -> dict[ContainerRef, LearnedOwner]:
    return {
        o: v if v.backoff.strikes <= 0 else replace(v, backoff=Backoff(v.backoff.strikes, v.backoff.at + offset))
        for o, v in learned.items()
    }


def lent_evidence(
    owner: ContainerRef,
    devices: tuple[DeviceID, ...],
    index: Mapping[DeviceID, tuple[Owner, tuple[PodRef, ...]]],
    recorded: LentOwner | None,
    container_id: str | None,
) -> str | None:
    """Why ``owner`` was lent before an agent restart, or None when it was not (recovery only).

    Spot users on its GPUs prove it; so does the lending record, when it names the same devices
    and the same container (``container_id`` now; a restarted owner container may be in use:
    not trusted).
    """
    if any(index[d][1] for d in devices):
        return "had spot users"
    if recorded is None or set(recorded.devices) != set(devices):
        return None
    if recorded.container_id is not None and container_id is not None and recorded.container_id != container_id:
        log.info("recovery: owner %s was lent, but its container was replaced; judged afresh", owner)
        return None
    return "was recorded as lent"


class RecordKeeper:
    """Loads the record once (:meth:`load`) and saves it when it changed (:meth:`save`)."""

    def __init__(self, store: LendStore | None, *, metrics: AgentMetrics, clock: Clock) -> None:
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self._lock = threading.Lock()
        self._saved: Record | None = None
        """The record as loaded and as last saved (None until loaded: never overwrite it before)."""

    @property
    def loaded(self) -> bool:
        with self._lock:
            return self._saved is not None

    def load(self) -> Record:
        """The record (empty without a store); from now on :meth:`save` may write."""
        if self.store is None:
            record = Record()
        else:
            offset = self.clock.monotonic() - self.clock.time()
            lent = {e.owner: e for e in self.store.load()}
            record = Record(lent, _shift(self.store.load_learned(), offset))
        with self._lock:
            self._saved = record
        return record

    def save(self, record: Record) -> None:
        """Write ``record`` when it differs from the last one written (best effort: a failure is
        logged and counted, and the next call writes again; the worst case after a restart is an
        owner waiting ``maxInactiveTime`` again)."""
        if self.store is None:
            return
        with self._lock:
            if self._saved is None or record == self._saved:
                return
            self._saved = record
        offset = self.clock.time() - self.clock.monotonic()
        try:
            self.store.save(list(record.lent.values()), _shift(record.learned, offset))
        except SpotgpuError as exc:
            with self._lock:
                self._saved = Record()  # unknown on disk: write again next time
            self.metrics.detector_errors.labels(kind="state_file").inc()
            log.warning("saving the lending record failed: %s", exc)


__all__ = ["Record", "RecordKeeper", "lent_evidence"]
