"""The notify-fd table the holder and the guard share: both indexes stay in step, a duplicate or
foreign fd is closed at once (never leaked), and every fd it drops is closed. Real fds (pipes
stand in for notify fds where the kind does not matter; ``verify`` is checked against one)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from spotgpu.core.refs import ContainerRef
from spotgpu.guard.fdtable import NotifyFds
from spotgpu.guard.listener import NotifyFdInfo

OWNER = ContainerRef("team-a", "dev-0", "main")


def _info(key: str, owner: ContainerRef | None = None) -> NotifyFdInfo:
    return NotifyFdInfo(key, f"cid-{key}", 10, 10, False, owner)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def watch(self, fd: int) -> None:
        self.events.append(("watch", fd))

    def unwatch(self, fd: int) -> None:
        assert _is_open(fd), "unwatch must come before the close"
        self.events.append(("unwatch", fd))


@pytest.fixture
def pipe() -> Iterator[Callable[[], int]]:
    """Makes pipes and hands out their read ends; closes whatever the table left open."""
    made: list[tuple[int, int]] = []  # (fd, inode): a number the table closed may be reused since

    def make() -> int:
        r, w = os.pipe()
        made.extend((fd, os.fstat(fd).st_ino) for fd in (r, w))
        return r

    yield make
    for fd, inode in made:
        if _is_open(fd) and os.fstat(fd).st_ino == inode:
            os.close(fd)


def test_adopt_indexes_by_key_and_fd_and_closes_a_duplicate(pipe: Callable[[], int]) -> None:
    rec = Recorder()
    table = NotifyFds(rec.watch, rec.unwatch)
    a, dup = pipe(), pipe()
    held = table.adopt(a, _info("k1", OWNER), 42)
    assert held is not None and held.entry.start_time == 42 and held.key == "k1"
    assert table.adopt(dup, _info("k1")) is None
    assert not _is_open(dup) and _is_open(a)  # the second copy is closed, the first kept
    assert table.get("k1") is held and table.by_fd(a) is held and table.by_fd(dup) is None
    assert "k1" in table and len(table) == 1 and list(table.keys()) == ["k1"]
    assert table.owned_by(OWNER) and not table.owned_by(ContainerRef("team-b", "x", "y"))
    assert rec.events == [("watch", a)]


def test_pop_keeps_the_fd_open_until_discard_and_drop_closes(pipe: Callable[[], int]) -> None:
    rec = Recorder()
    table = NotifyFds(rec.watch, rec.unwatch)
    a, b = pipe(), pipe()
    table.adopt(a, _info("a"))
    table.adopt(b, _info("b"))
    held = table.pop("a")
    assert _is_open(a) and "a" not in table and table.by_fd(a) is None
    table.discard(held)
    assert not _is_open(a)
    table.drop("b")
    assert not _is_open(b) and len(table) == 0
    assert rec.events == [("watch", a), ("watch", b), ("unwatch", a), ("unwatch", b)]


def test_close_drops_every_fd_even_while_iterating(pipe: Callable[[], int]) -> None:
    rec = Recorder()
    table = NotifyFds(rec.watch, rec.unwatch)
    fds = [pipe() for _ in range(5)]
    for i, fd in enumerate(fds):
        table.adopt(fd, _info(f"k{i}"))
    for held in table:  # iterating a snapshot: dropping meanwhile is safe
        if held.key == "k2":
            table.drop("k3")
    table.close()
    assert len(table) == 0 and not any(_is_open(fd) for fd in fds)


def test_verify_refuses_and_closes_what_is_not_a_notify_fd(pipe: Callable[[], int]) -> None:
    table = NotifyFds(lambda fd: None, lambda fd: None)
    fd = pipe()
    assert table.adopt(fd, _info("k"), verify=True) is None
    assert not _is_open(fd) and len(table) == 0
