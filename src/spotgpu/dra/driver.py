"""Prepare and Unprepare: the claim decision carried out (CDI specs, the checkpoint).

Side effects: API reads of ResourceClaims (through :class:`~spotgpu.dra.ports.DraApi`), the
vendor device plugin's ``Allocate`` (the callable given), CDI spec files
(:class:`~spotgpu.dra.cdi.CdiDir`), the checkpoint file, and an exclusive ``flock`` on
``lock_file`` (so that two instances during a rolling update never interleave).

* :meth:`DraDriver.prepare` answers every claim it is given: the claims are fetched first
  (outside the lock), then, serialized, each is decided afresh
  (:func:`~spotgpu.dra.decide.decide_prepare`: a claim prepared before is checked again, so a
  repeated call is idempotent while nothing changed and refused once the GPU is taken back);
  a refusal removes any spec an earlier Prepare of that claim wrote and names the reason.
* :meth:`DraDriver.unprepare` needs no API (the claim may be gone): it removes what Prepare
  wrote; a claim it does not know is success (an error would keep the pod Terminating).
* :meth:`DraDriver.revoke` is the return path's step: the CDI specs of every claim holding one
  of the given GPUs are removed at once, so a spot container (re)created from then on fails
  with ``unresolvable CDI devices`` (the lend rule, as spotgpu-runtime and NRI enforce it).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from spotgpu.core.errors import SpotgpuError
from spotgpu.core.ids import DeviceID, ResourceName
from spotgpu.dra.cdi import CdiDir
from spotgpu.dra.cdispec import CdiDevice, claim_spec, qualified, spec_file_name
from spotgpu.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from spotgpu.dra.claim import ClaimKey, ClaimUID
from spotgpu.dra.decide import NodeView, PrepareGrant, PrepareRefused, decide_prepare
from spotgpu.dra.ports import DraApi
from spotgpu.ports.lookup import Allocation

log = logging.getLogger(__name__)

AllocateFn = Callable[[ResourceName, Sequence[DeviceID]], Allocation]


@dataclass(frozen=True, slots=True)
class ClaimAnswer:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class DraDriver:
    def __init__(
        self,
        api: DraApi,
        view: Callable[[], NodeView],
        allocate: AllocateFn,
        cdi: CdiDir,
        checkpoint: Checkpoint,
        *,
        lock_file: Path | None = None,
    ) -> None:
        self._api = api
        self._view = view
        self._allocate = allocate
        self._cdi = cdi
        self._checkpoint = checkpoint
        self._lock_file = lock_file
        self._lock = threading.Lock()
        """Serializes Prepare, Unprepare and revoke."""
        self._state = threading.Lock()
        """Guards ``_prepared`` for readers outside the serialization (:meth:`prepared`)."""
        self._prepared = checkpoint.load()

    @contextlib.contextmanager
    def _serial(self) -> Iterator[None]:
        with self._lock:
            if self._lock_file is None:
                yield
                return
            self._lock_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def prepared(self) -> dict[ClaimUID, PreparedClaim]:
        """The prepared claims now (never waits for a Prepare: the node view asks it during one)."""
        with self._state:
            return dict(self._prepared)

    def _record(self, uid: ClaimUID, claim: PreparedClaim | None) -> None:
        """Change one entry and save the checkpoint (caller serialized)."""
        with self._state:
            if claim is None:
                self._prepared.pop(uid, None)
            else:
                self._prepared[uid] = claim
            snapshot = dict(self._prepared)
        self._checkpoint.save(snapshot)

    def prepare(self, keys: Sequence[ClaimKey]) -> dict[ClaimUID, ClaimAnswer]:
        answers: dict[ClaimUID, ClaimAnswer] = {}
        fetched = {}
        for key in keys:
            try:
                fetched[key.uid] = self._api.get_claim(key.namespace, key.name)
            except SpotgpuError as exc:
                answers[key.uid] = ClaimAnswer(error=f"cannot read ResourceClaim {key.namespace}/{key.name}: {exc}")
        with self._serial():
            view = self._view()
            for key in keys:
                if key.uid in answers:
                    continue
                try:
                    answers[key.uid] = self._prepare_one(decide_prepare(key, fetched[key.uid], view), view)
                except PrepareRefused as exc:
                    log.warning("DRA prepare of %s/%s (%s) refused: %s", key.namespace, key.name, key.uid, exc)
                    self._withdraw(key.uid)
                    answers[key.uid] = ClaimAnswer(error=str(exc))
                except (SpotgpuError, OSError, ValueError) as exc:
                    log.warning("DRA prepare of %s/%s (%s) failed: %s", key.namespace, key.name, key.uid, exc)
                    answers[key.uid] = ClaimAnswer(error=f"prepare failed: {exc}")
        return answers

    def _prepare_one(self, grant: PrepareGrant, view: NodeView) -> ClaimAnswer:
        uid = grant.key.uid
        own: list[CdiDevice] = []
        devices: list[PreparedDevice] = []
        for g in grant.devices:
            vendor = self._cdi.vendor_device(g.real)
            if vendor is not None:
                ids: tuple[str, ...] = (vendor,)
            else:
                allocation = self._allocate(view.gpu_resource, [g.real])
                own.append(CdiDevice(g.device, g.real, allocation))
                ids = (qualified(view.driver, uid, g.device), *allocation.cdi_devices)
            devices.append(PreparedDevice(g.request, g.pool, g.device, g.real, ids))
        spec_file = None
        if own:
            spec_file = spec_file_name(view.driver, uid)
            self._cdi.write(spec_file, claim_spec(view.driver, uid, own))
        prepared = PreparedClaim(grant.key, tuple(devices), spec_file)
        if self._prepared.get(uid) != prepared:
            self._record(uid, prepared)
        return ClaimAnswer(prepared.devices)

    def _withdraw(self, uid: ClaimUID) -> None:
        """A claim now refused keeps no spec (its entry stays, so Unprepare still finds it)."""
        old = self._prepared.get(uid)
        if old is not None and old.spec_file is not None:
            self._cdi.remove(old.spec_file)
            self._record(uid, replace(old, spec_file=None))

    def unprepare(self, keys: Sequence[ClaimKey]) -> dict[ClaimUID, ClaimAnswer]:
        answers: dict[ClaimUID, ClaimAnswer] = {}
        with self._serial():
            for key in keys:
                old = self._prepared.get(key.uid)
                try:
                    if old is not None and old.spec_file is not None:
                        self._cdi.remove(old.spec_file)
                    if old is not None:
                        self._record(key.uid, None)
                    answers[key.uid] = ClaimAnswer()
                except OSError as exc:
                    answers[key.uid] = ClaimAnswer(error=f"unprepare failed: {exc}")
        return answers

    def drop_specs(self, reals: Collection[DeviceID]) -> None:
        """Unlink the CDI specs of the claims holding one of ``reals`` now, without waiting for a
        Prepare in progress (the return path calls this under the agent's lock; :meth:`revoke`
        then records it)."""
        for c in self.prepared().values():
            if c.spec_file is not None and any(d.real in reals for d in c.devices):
                self._cdi.remove(c.spec_file)

    def revoke(self, reals: Collection[DeviceID]) -> list[ClaimKey]:
        """Remove the CDI specs of every prepared claim holding one of ``reals``; their keys."""
        with self._serial():
            hit = [c for c in self._prepared.values() if any(d.real in reals for d in c.devices)]
            for c in hit:
                self._withdraw(c.key.uid)
        return [c.key for c in hit]


__all__ = ["AllocateFn", "ClaimAnswer", "DraDriver"]
