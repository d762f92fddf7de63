"""MappingCache: which owner holds which real device, and which spot users share it.

In-memory state only; no I/O. The agent keeps one per node (seed 7.1). Shape::

    owner (ns/pod/container, or IDLE_SPACE) -> device id -> {spot user pod, ...}

``IDLE_SPACE`` is the pseudo-owner of devices no reserved container holds (unallocated GPUs).

Guarantees:

* a device has at most one owner (IDLE_SPACE counts as an owner);
* every operation checks everything first and then applies, under one lock: it either applies
  fully or raises a :class:`MappingCacheError` and changes nothing;
* :meth:`MappingCache.snapshot` returns an immutable, self-consistent copy and
  :meth:`MappingCache.restore` replaces the whole state with one atomically, after validating
  it (used for recovery, where the state is rebuilt from what the node and cluster say).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import DeviceID, validate_device_id
from spotgpu.core.refs import ContainerRef, PodRef


@dataclass(frozen=True, slots=True, order=True)
class _IdleSpace:
    """The pseudo-owner of unallocated devices."""

    def format(self) -> str:
        return "IdleSpace"

    def __str__(self) -> str:
        return "IdleSpace"


IDLE_SPACE: Final = _IdleSpace()
Owner = ContainerRef | _IdleSpace


class MappingCacheError(ValidationError):
    """An operation would break the cache's invariants; nothing was changed."""


class UnknownOwner(MappingCacheError):
    pass


class UnknownDevice(MappingCacheError):
    pass


class DeviceAlreadyOwned(MappingCacheError):
    pass


class OwnerExists(MappingCacheError):
    pass


class NotAUser(MappingCacheError):
    """UnUse of a user that does not use that device."""


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    device: DeviceID
    users: tuple[PodRef, ...]
    """Spot pods sharing the device, sorted."""


@dataclass(frozen=True, slots=True)
class OwnerEntry:
    owner: Owner
    devices: tuple[DeviceEntry, ...]
    """Sorted by device ID."""


@dataclass(frozen=True, slots=True)
class MappingSnapshot:
    """An immutable copy of a cache's state; owners sorted (IDLE_SPACE first)."""

    owners: tuple[OwnerEntry, ...]

    def to_json(self) -> dict[str, dict[str, list[str]]]:
        """``{"<owner>": {"<device>": ["ns/pod", ...]}}``."""
        return {e.owner.format(): {d.device: [u.format() for u in d.users] for d in e.devices} for e in self.owners}

    @classmethod
    def from_json(cls, data: object) -> MappingSnapshot:
        """Inverse of :meth:`to_json`; raises :class:`MappingCacheError` naming the bad entry."""
        if not isinstance(data, dict):
            raise MappingCacheError(f"mapping snapshot must be an object, got {type(data).__name__}")
        owners: list[OwnerEntry] = []
        for raw_owner, devices in data.items():
            try:
                owner: Owner = IDLE_SPACE if raw_owner == IDLE_SPACE.format() else ContainerRef.parse(raw_owner)
                if isinstance(owner, ContainerRef) and owner.is_relative:
                    raise MappingCacheError(f"owner {raw_owner!r} must name its namespace")
                if not isinstance(devices, dict):
                    raise MappingCacheError(f"owner {raw_owner!r}: devices must be an object")
                entries = []
                for raw_dev, users in devices.items():
                    if not isinstance(users, list):
                        raise MappingCacheError(f"owner {raw_owner!r}, device {raw_dev!r}: users must be a list")
                    entries.append(
                        DeviceEntry(validate_device_id(raw_dev), tuple(sorted(PodRef.parse(u) for u in users)))
                    )
            except ValidationError as exc:
                if isinstance(exc, MappingCacheError):
                    raise
                raise MappingCacheError(f"mapping snapshot, owner {raw_owner!r}: {exc}") from None
            owners.append(OwnerEntry(owner, tuple(sorted(entries, key=lambda e: e.device))))
        return cls(tuple(sorted(owners, key=_owner_sort_key)))


def _owner_sort_key(entry: OwnerEntry) -> tuple[int, str]:
    return (0, "") if entry.owner is IDLE_SPACE else (1, entry.owner.format())


class MappingCache:
    """Thread-safe owner -> device -> users map. See the module docstring for guarantees."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owners: dict[Owner, dict[DeviceID, set[PodRef]]] = {}
        self._device_owner: dict[DeviceID, Owner] = {}

    # -- queries ---------------------------------------------------------------------------
    def get_device_owner(self, device: str) -> Owner | None:
        with self._lock:
            return self._device_owner.get(DeviceID(device))

    def get_owner_users(self, owner: Owner) -> tuple[PodRef, ...]:
        """Every spot user of any of the owner's devices, sorted, each once."""
        with self._lock:
            devices = self._owners.get(owner)
            if devices is None:
                raise UnknownOwner(f"owner {owner} is not in the mapping cache")
            return tuple(sorted(set().union(*devices.values()))) if devices else ()

    def get_device_users(self, device: str) -> tuple[PodRef, ...]:
        with self._lock:
            owner = self._device_owner.get(DeviceID(device))
            if owner is None:
                raise UnknownDevice(f"device {device!r} has no owner in the mapping cache")
            return tuple(sorted(self._owners[owner][DeviceID(device)]))

    def devices_of(self, owner: Owner) -> tuple[DeviceID, ...]:
        with self._lock:
            devices = self._owners.get(owner)
            if devices is None:
                raise UnknownOwner(f"owner {owner} is not in the mapping cache")
            return tuple(sorted(devices))

    def owners(self) -> tuple[Owner, ...]:
        with self._lock:
            return tuple(e.owner for e in self.snapshot().owners)

    def has_owner(self, owner: Owner) -> bool:
        with self._lock:
            return owner in self._owners

    # -- mutations -------------------------------------------------------------------------
    def create(self, owner: Owner, devices: Iterable[str]) -> None:
        """Register ``owner`` with ``devices`` (no users yet).

        For IDLE_SPACE, adds the devices to it (it may already exist). For a container owner,
        the owner must be new. Devices must be valid IDs not owned by anyone, IDLE_SPACE
        included: move a device out of IDLE_SPACE with :meth:`release` first.
        """
        ids = [validate_device_id(d) for d in devices]
        if isinstance(owner, ContainerRef) and owner.is_relative:
            raise MappingCacheError(f"owner {owner} must name its namespace")
        if len(set(ids)) != len(ids):
            raise MappingCacheError(f"create {owner}: device list {ids} has duplicates")
        with self._lock:
            if owner is not IDLE_SPACE and owner in self._owners:
                raise OwnerExists(f"owner {owner} already exists with devices {sorted(self._owners[owner])}")
            for device in ids:
                holder = self._device_owner.get(device)
                if holder is not None:
                    raise DeviceAlreadyOwned(f"create {owner}: device {device!r} is already owned by {holder}")
            table = self._owners.setdefault(owner, {})
            for device in ids:
                table[device] = set()
                self._device_owner[device] = owner

    def use(self, owner: Owner, user: PodRef, device: str) -> bool:
        """Record that spot pod ``user`` shares ``owner``'s ``device``. Returns False if already recorded."""
        if user.is_relative:
            raise MappingCacheError(f"user {user} must name its namespace")
        with self._lock:
            users = self._users_of(owner, device)
            if user in users:
                return False
            users.add(user)
            return True

    def unuse(self, owner: Owner, user: PodRef, device: str) -> None:
        """Remove ``user`` from ``owner``'s ``device``; :class:`NotAUser` if it was not using it."""
        with self._lock:
            users = self._users_of(owner, device)
            if user not in users:
                raise NotAUser(f"{user} does not use device {device!r} of owner {owner}")
            users.remove(user)

    def remove_user(self, user: PodRef) -> tuple[DeviceID, ...]:
        """Remove ``user`` from every device it uses (a spot pod went away); returns those devices."""
        with self._lock:
            touched = [(users, dev) for table in self._owners.values() for dev, users in table.items() if user in users]
            for users, _ in touched:
                users.remove(user)
            return tuple(sorted(dev for _, dev in touched))

    def delete(self, owner: Owner) -> MappingSnapshot:
        """Forget ``owner``, its devices and their users; returns what was removed."""
        with self._lock:
            table = self._owners.get(owner)
            if table is None:
                raise UnknownOwner(f"owner {owner} is not in the mapping cache")
            removed = self._entry(owner, table)
            del self._owners[owner]
            for device in table:
                del self._device_owner[device]
            return MappingSnapshot((removed,))

    def release(self, owner: Owner, devices: Iterable[str]) -> None:
        """Take devices away from ``owner`` (they must have no users); the owner stays if devices remain."""
        ids = [validate_device_id(d) for d in devices]
        with self._lock:
            table = self._owners.get(owner)
            if table is None:
                raise UnknownOwner(f"owner {owner} is not in the mapping cache")
            for device in ids:
                if device not in table:
                    raise UnknownDevice(f"device {device!r} is not owned by {owner}")
                if table[device]:
                    raise MappingCacheError(
                        f"device {device!r} of {owner} still has users {sorted(u.format() for u in table[device])}"
                    )
            for device in ids:
                del table[device]
                del self._device_owner[device]

    # -- snapshot / restore ----------------------------------------------------------------
    def snapshot(self) -> MappingSnapshot:
        with self._lock:
            entries = [self._entry(o, t) for o, t in self._owners.items()]
        return MappingSnapshot(tuple(sorted(entries, key=_owner_sort_key)))

    def restore(self, snap: MappingSnapshot) -> None:
        """Replace the whole state with ``snap`` after validating it; on error nothing changes."""
        owners: dict[Owner, dict[DeviceID, set[PodRef]]] = {}
        device_owner: dict[DeviceID, Owner] = {}
        for entry in snap.owners:
            if entry.owner in owners:
                raise OwnerExists(f"snapshot lists owner {entry.owner} twice")
            table: dict[DeviceID, set[PodRef]] = {}
            for dev in entry.devices:
                device = validate_device_id(dev.device)
                holder = device_owner.get(device)
                if holder is not None:
                    raise DeviceAlreadyOwned(f"snapshot: device {device!r} owned by both {holder} and {entry.owner}")
                if any(u.is_relative for u in dev.users):
                    raise MappingCacheError(f"snapshot: users of {device!r} must name their namespace")
                table[device] = set(dev.users)
                device_owner[device] = entry.owner
            owners[entry.owner] = table
        with self._lock:
            self._owners = owners
            self._device_owner = device_owner

    def equals(self, other: Mapping[str, Mapping[str, list[str]]]) -> bool:
        """Compare with a :meth:`MappingSnapshot.to_json` form (tests and recovery checks)."""
        return self.snapshot().to_json() == {o: {d: sorted(u) for d, u in t.items()} for o, t in other.items()}

    # -- internals -------------------------------------------------------------------------
    def _users_of(self, owner: Owner, device: str) -> set[PodRef]:
        table = self._owners.get(owner)
        if table is None:
            raise UnknownOwner(f"owner {owner} is not in the mapping cache")
        users = table.get(DeviceID(device))
        if users is None:
            holder = self._device_owner.get(DeviceID(device))
            where = f"owned by {holder}" if holder is not None else "unknown"
            raise UnknownDevice(f"device {device!r} is not owned by {owner} ({where})")
        return users

    @staticmethod
    def _entry(owner: Owner, table: dict[DeviceID, set[PodRef]]) -> OwnerEntry:
        return OwnerEntry(owner, tuple(DeviceEntry(d, tuple(sorted(u))) for d, u in sorted(table.items())))


__all__ = [
    "IDLE_SPACE",
    "DeviceAlreadyOwned",
    "DeviceEntry",
    "MappingCache",
    "MappingCacheError",
    "MappingSnapshot",
    "NotAUser",
    "Owner",
    "OwnerEntry",
    "OwnerExists",
    "UnknownDevice",
    "UnknownOwner",
]
