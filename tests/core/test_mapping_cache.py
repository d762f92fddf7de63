"""MappingCache: operations, all-or-nothing errors, snapshot/restore, and a stateful property
test against a plain model (a device has at most one owner; UnUse of an unknown user is an
error; GetOwnerUsers agrees with the Use/UnUse history)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from spotgpu.core.ids import DeviceID
from spotgpu.core.mapping_cache import (
    IDLE_SPACE,
    DeviceAlreadyOwned,
    MappingCache,
    MappingCacheError,
    MappingSnapshot,
    NotAUser,
    OwnerExists,
    UnknownDevice,
    UnknownOwner,
)
from spotgpu.core.refs import ContainerRef, PodRef

OWNER = ContainerRef("team", "dev-0", "main")
OTHER = ContainerRef("team", "dev-1", "main")
SPOT_A = PodRef("spot", "job-a-0")
SPOT_B = PodRef("spot", "job-b-0")


def make() -> MappingCache:
    cache = MappingCache()
    cache.create(IDLE_SPACE, ["GPU-4", "GPU-5"])
    cache.create(OWNER, ["GPU-0", "GPU-1"])
    return cache


def test_seed_operations() -> None:
    cache = make()
    assert cache.get_device_owner("GPU-0") == OWNER
    assert cache.get_device_owner("GPU-4") is IDLE_SPACE
    assert cache.get_device_owner("GPU-9") is None
    assert cache.use(OWNER, SPOT_A, "GPU-0") is True
    assert cache.use(OWNER, SPOT_A, "GPU-0") is False
    cache.use(OWNER, SPOT_B, "GPU-0")
    cache.use(OWNER, SPOT_A, "GPU-1")
    assert cache.get_owner_users(OWNER) == (SPOT_A, SPOT_B)
    assert cache.get_device_users("GPU-0") == (SPOT_A, SPOT_B)
    cache.unuse(OWNER, SPOT_B, "GPU-0")
    assert cache.get_owner_users(OWNER) == (SPOT_A,)
    removed = cache.delete(OWNER)
    assert removed.to_json() == {"team/dev-0/main": {"GPU-0": ["spot/job-a-0"], "GPU-1": ["spot/job-a-0"]}}
    assert cache.get_device_owner("GPU-0") is None
    assert cache.owners() == (IDLE_SPACE,)


def test_idle_space_grows_and_devices_move_out_through_release() -> None:
    cache = make()
    cache.create(IDLE_SPACE, ["GPU-6"])
    assert cache.devices_of(IDLE_SPACE) == ("GPU-4", "GPU-5", "GPU-6")
    with pytest.raises(DeviceAlreadyOwned, match="device 'GPU-4' is already owned by IdleSpace"):
        cache.create(OTHER, ["GPU-4"])
    cache.release(IDLE_SPACE, ["GPU-4"])
    cache.create(OTHER, ["GPU-4"])
    assert cache.get_device_owner("GPU-4") == OTHER
    assert cache.remove_user(SPOT_A) == ()


def test_remove_user_everywhere() -> None:
    cache = make()
    cache.use(OWNER, SPOT_A, "GPU-0")
    cache.use(IDLE_SPACE, SPOT_A, "GPU-4")
    assert cache.remove_user(SPOT_A) == ("GPU-0", "GPU-4")
    assert cache.get_owner_users(OWNER) == ()


@pytest.mark.parametrize(
    ("operation", "error", "fragment"),
    [
        (lambda c: c.create(OWNER, ["GPU-7"]), OwnerExists, "owner team/dev-0/main already exists"),
        (lambda c: c.create(OTHER, ["GPU-7", "GPU-0"]), DeviceAlreadyOwned, "'GPU-0' is already owned by team/dev-0"),
        (lambda c: c.create(OTHER, ["GPU-7", "GPU-7"]), MappingCacheError, "has duplicates"),
        (lambda c: c.create(OTHER, ["bad id"]), ValueError, "character ' '"),
        (lambda c: c.create(ContainerRef(None, "p", "c"), ["GPU-7"]), MappingCacheError, "must name its namespace"),
        (lambda c: c.use(OTHER, SPOT_A, "GPU-0"), UnknownOwner, "owner team/dev-1/main is not in the mapping cache"),
        (lambda c: c.use(OWNER, SPOT_A, "GPU-4"), UnknownDevice, "not owned by team/dev-0/main (owned by IdleSpace)"),
        (lambda c: c.use(OWNER, PodRef(None, "x"), "GPU-0"), MappingCacheError, "must name its namespace"),
        (lambda c: c.unuse(OWNER, SPOT_B, "GPU-0"), NotAUser, "spot/job-b-0 does not use device 'GPU-0'"),
        (lambda c: c.delete(OTHER), UnknownOwner, "not in the mapping cache"),
        (lambda c: c.release(OWNER, ["GPU-1", "GPU-0"]), MappingCacheError, "still has users ['spot/job-a-0']"),
        (lambda c: c.release(OWNER, ["GPU-4"]), UnknownDevice, "'GPU-4' is not owned by team/dev-0/main"),
        (lambda c: c.get_owner_users(OTHER), UnknownOwner, "not in the mapping cache"),
        (lambda c: c.get_device_users("GPU-9"), UnknownDevice, "has no owner"),
    ],
)
def test_errors_change_nothing(operation, error, fragment) -> None:
    cache = make()
    cache.use(OWNER, SPOT_A, "GPU-0")
    before = cache.snapshot()
    with pytest.raises(error) as info:
        operation(cache)
    assert fragment in str(info.value)
    assert cache.snapshot() == before


def test_snapshot_restore_and_json() -> None:
    cache = make()
    cache.use(OWNER, SPOT_A, "GPU-1")
    snap = cache.snapshot()
    data = snap.to_json()
    assert list(data) == ["IdleSpace", "team/dev-0/main"]
    assert MappingSnapshot.from_json(data) == snap
    other = MappingCache()
    other.restore(snap)
    assert other.snapshot() == snap
    assert other.equals(data)
    assert other.get_owner_users(OWNER) == (SPOT_A,)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ([], "must be an object"),
        ({"team/dev-0/main": []}, "devices must be an object"),
        ({"team/dev-0/main": {"GPU-0": "x"}}, "users must be a list"),
        ({"_/dev-0/main": {}}, "must name its namespace"),
        ({"bad": {}}, "owner 'bad'"),
        ({"team/dev-0/main": {"GPU 0": []}}, "character ' '"),
        ({"a/b/c": {"GPU-0": []}, "a/b/d": {"GPU-0": []}}, "owned by both"),
    ],
)
def test_bad_snapshots_are_rejected_and_restore_is_atomic(data: object, fragment: str) -> None:
    cache = make()
    before = cache.snapshot()
    with pytest.raises(MappingCacheError) as info:
        cache.restore(MappingSnapshot.from_json(data))
    assert fragment in str(info.value)
    assert cache.snapshot() == before


def test_concurrent_use_is_consistent() -> None:
    cache = MappingCache()
    devices = [f"GPU-{i}" for i in range(8)]
    cache.create(OWNER, devices)
    users = [PodRef("spot", f"p{i}") for i in range(50)]

    def work(user: PodRef) -> None:
        for device in devices:
            cache.use(OWNER, user, device)
        for device in devices[::2]:
            cache.unuse(OWNER, user, device)

    threads = [threading.Thread(target=work, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.get_owner_users(OWNER) == tuple(sorted(users))
    assert all(len(cache.get_device_users(d)) == (0 if i % 2 == 0 else 50) for i, d in enumerate(devices))


OWNERS = [IDLE_SPACE, OWNER, OTHER, ContainerRef("b", "p", "c")]
USERS = [PodRef("spot", f"u{i}") for i in range(4)]
DEVICES = [f"GPU-{i}" for i in range(6)]


class CacheMachine(RuleBasedStateMachine):
    """Random operation sequences against a dict-of-sets model."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = MappingCache()
        self.owner_of: dict[str, object] = {}
        self.users: dict[str, set[PodRef]] = {}
        self.owners: set[object] = set()

    @rule(owner=st.sampled_from(OWNERS), devices=st.lists(st.sampled_from(DEVICES), max_size=3))
    def create(self, owner: object, devices: list[str]) -> None:
        ok = (
            (owner is IDLE_SPACE or owner not in self.owners)
            and len(set(devices)) == len(devices)
            and not any(d in self.owner_of for d in devices)
        )
        try:
            self.cache.create(owner, devices)
        except MappingCacheError:
            assert not ok
            return
        assert ok
        self.owners.add(owner)
        for d in devices:
            self.owner_of[d] = owner
            self.users[d] = set()

    @rule(owner=st.sampled_from(OWNERS), user=st.sampled_from(USERS), device=st.sampled_from(DEVICES))
    def use(self, owner: object, user: PodRef, device: str) -> None:
        ok = self.owner_of.get(device) == owner and owner in self.owners
        try:
            added = self.cache.use(owner, user, device)
        except MappingCacheError:
            assert not ok
            return
        assert ok
        assert added == (user not in self.users[device])
        self.users[device].add(user)

    @rule(owner=st.sampled_from(OWNERS), user=st.sampled_from(USERS), device=st.sampled_from(DEVICES))
    def unuse(self, owner: object, user: PodRef, device: str) -> None:
        ok = self.owner_of.get(device) == owner and user in self.users.get(device, set())
        try:
            self.cache.unuse(owner, user, device)
        except MappingCacheError:
            assert not ok
            return
        assert ok
        self.users[device].discard(user)

    @precondition(lambda self: bool(self.owners))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from(sorted(self.owners, key=str)))
        self.cache.delete(owner)
        self.owners.discard(owner)
        for d in [d for d, o in self.owner_of.items() if o == owner]:
            del self.owner_of[d]
            del self.users[d]

    @invariant()
    def agrees_with_model(self) -> None:
        for device in DEVICES:
            assert self.cache.get_device_owner(device) == self.owner_of.get(device)
        for owner in self.owners:
            expected = set().union(*(self.users[d] for d, o in self.owner_of.items() if o == owner))
            assert set(self.cache.get_owner_users(owner)) == expected
        seen: list[DeviceID] = [d.device for e in self.cache.snapshot().owners for d in e.devices]
        assert len(seen) == len(set(seen)), "a device has two owners"


TestCacheMachine = CacheMachine.TestCase
