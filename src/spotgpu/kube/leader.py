"""Leader election with a ``coordination.k8s.io/v1`` Lease, so two replicas never both act.

The decision (:func:`decide`) is pure: given the Lease as last read, who we are and when we
last saw the Lease change (on *our* monotonic clock), it says acquire, renew or wait. The
:class:`LeaderElector` does the I/O on a background thread: reads the Lease, writes it with
optimistic concurrency (a ``PUT`` carrying the ``resourceVersion`` it read: a racing replica
gets ``409 Conflict`` and loses), and keeps :meth:`LeaderElector.is_leader` current.

Safety (the same argument as client-go's): a candidate takes over only after the Lease has
not changed for ``lease_duration`` as measured on its own clock since it last saw a change,
never by comparing the holder's ``renewTime`` with its own clock (clocks differ between
machines). A leader that cannot renew stops acting ``renew_deadline`` after its last
successful renewal, and ``renew_deadline < lease_duration``, so the old leader has stopped
before a new one can start. :meth:`LeaderElector.is_leader` checks that deadline on every call,
so even a stalled election thread cannot leave a stale "leader" acting.

On shutdown the leader releases the Lease (empty holder), so a standby takes over at once.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from spotgpu.core.clock import Clock, SystemClock
from spotgpu.core.errors import ValidationError
from spotgpu.kube.client import AlreadyExists, Conflict, Connection, KubeApiError, NotFound, api_errors

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The parts of a Lease that election reads."""

    holder: str
    duration: float
    transitions: int
    resource_version: str


class Action(StrEnum):
    ACQUIRE = "acquire"
    """Take the Lease (it is free or expired)."""
    RENEW = "renew"
    """We hold it: write a fresh renewTime."""
    WAIT = "wait"
    """Someone else holds a live Lease."""


@dataclass(frozen=True, slots=True)
class ElectionConfig:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValidationError(
                "leader election needs 0 < retryPeriod < renewDeadline < leaseDuration, got "
                f"{self.retry_period} / {self.renew_deadline} / {self.lease_duration}"
            )


def decide(record: LeaseRecord | None, identity: str, now: float, observed_at: float) -> Action:
    """What to do with the Lease; ``observed_at`` is our monotonic time when ``record`` last changed."""
    if record is None or not record.holder:
        return Action.ACQUIRE
    if record.holder == identity:
        return Action.RENEW
    if now - observed_at > record.duration:
        return Action.ACQUIRE
    return Action.WAIT


class LeaderElector:
    """Runs the election for one Lease; ``is_leader()`` gates every action of the component."""

    def __init__(
        self,
        connection: Connection,
        *,
        name: str,
        namespace: str,
        identity: str,
        config: ElectionConfig | None = None,
        clock: Clock | None = None,
        on_started: Callable[[], None] | None = None,
        on_stopped: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.config = config or ElectionConfig()
        self.transitions_seen = 0
        self._client = connection.client
        self._clock = clock or SystemClock()
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._lock = threading.Lock()
        self._renewed_at: float | None = None
        self._observed: LeaseRecord | None = None
        self._observed_key: tuple[str, int, str] | None = None
        self._observed_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._leading = False

    # ----------------------------------------------------------------- state

    def is_leader(self) -> bool:
        """True only while our last successful renewal is younger than ``renew_deadline``."""
        with self._lock:
            return self._renewed_at is not None and (
                self._clock.monotonic() - self._renewed_at < self.config.renew_deadline
            )

    @property
    def holder(self) -> str | None:
        with self._lock:
            return self._observed.holder if self._observed else None

    # ----------------------------------------------------------------- loop

    def start(self) -> LeaderElector:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"leader-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.retry_period + 10)
        if release:
            self.release()
        self._set_leading(False)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.try_once()
            self._stop.wait(self.config.retry_period)

    def try_once(self) -> bool:
        """One round: read, decide, write. Returns whether we lead afterwards. Never raises."""
        try:
            lease = self._read()
            now = self._clock.monotonic()
            action = decide(self._observed, self.identity, now, self._observed_at)
            if action is Action.WAIT:
                with self._lock:
                    self._renewed_at = None
            else:
                self._write(lease, action)
                with self._lock:
                    self._renewed_at = now
        except (Conflict, AlreadyExists) as exc:
            log.info("lease %s/%s: lost a race (%s)", self.namespace, self.name, exc)
        except KubeApiError as exc:
            log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
        leading = self.is_leader()
        self._set_leading(leading)
        return leading

    def _read(self) -> Lease | None:
        try:
            with api_errors(f"get lease {self.namespace}/{self.name}"):
                lease = self._client.get(Lease, self.name, namespace=self.namespace)
        except NotFound:
            self._observe(None)
            return None
        spec = lease.spec or LeaseSpec()
        self._observe(
            LeaseRecord(
                holder=spec.holderIdentity or "",
                duration=float(spec.leaseDurationSeconds or self.config.lease_duration),
                transitions=int(spec.leaseTransitions or 0),
                resource_version=str(lease.metadata.resourceVersion if lease.metadata else ""),
            )
        )
        return lease

    def _observe(self, record: LeaseRecord | None) -> None:
        key = (record.holder, record.transitions, record.resource_version) if record else None
        with self._lock:
            if key != self._observed_key:
                self._observed_key = key
                self._observed_at = self._clock.monotonic()
            self._observed = record

    def _write(self, lease: Lease | None, action: Action) -> None:
        now = dt.datetime.fromtimestamp(self._clock.time(), dt.UTC)
        duration = int(self.config.lease_duration)
        if lease is None:
            new = Lease(
                metadata=ObjectMeta(name=self.name, namespace=self.namespace),
                spec=LeaseSpec(
                    holderIdentity=self.identity,
                    leaseDurationSeconds=duration,
                    acquireTime=now,
                    renewTime=now,
                    leaseTransitions=0,
                ),
            )
            with api_errors(f"create lease {self.namespace}/{self.name}"):
                self._client.create(new)
            log.info("lease %s/%s: created, %s leads", self.namespace, self.name, self.identity)
            return
        spec = lease.spec or LeaseSpec()
        if action is Action.ACQUIRE:
            previous = spec.holderIdentity
            spec.holderIdentity = self.identity
            spec.acquireTime = now
            spec.leaseTransitions = int(spec.leaseTransitions or 0) + (1 if previous else 0)
            self.transitions_seen += 1
            log.info("lease %s/%s: %s takes over from %r", self.namespace, self.name, self.identity, previous)
        spec.renewTime = now
        spec.leaseDurationSeconds = duration
        lease.spec = spec
        with api_errors(f"update lease {self.namespace}/{self.name}"):
            self._client.replace(lease)  # carries the resourceVersion we read: 409 if anyone wrote since

    def release(self) -> None:
        """Give the Lease up if we hold it (empty holder), so a standby need not wait for expiry."""
        try:
            lease = self._read()
            if lease is None or lease.spec is None or lease.spec.holderIdentity != self.identity:
                return
            lease.spec.holderIdentity = ""
            lease.spec.leaseDurationSeconds = 1
            with api_errors(f"release lease {self.namespace}/{self.name}"):
                self._client.replace(lease)
            log.info("lease %s/%s: released by %s", self.namespace, self.name, self.identity)
        except KubeApiError as exc:
            log.warning("lease %s/%s: release failed: %s", self.namespace, self.name, exc)
        finally:
            with self._lock:
                self._renewed_at = None

    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        callback = self._on_started if leading else self._on_stopped
        log.info(
            "%s %s leading (lease %s/%s)", self.identity, "started" if leading else "stopped", self.namespace, self.name
        )
        if callback is not None:
            callback()


__all__ = ["Action", "ElectionConfig", "LeaderElector", "LeaseRecord", "decide"]
