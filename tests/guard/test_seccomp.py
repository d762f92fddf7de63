"""Seccomp user-notification plumbing against the real kernel: a filter on a helper thread,
receive, continue, id validity, POLLHUP, and the ENOSYS hazard the fd holder exists for."""

from __future__ import annotations

import errno
import fcntl
import os
import select
import threading
from collections.abc import Callable

import pytest

from spotgpu.guard import seccomp
from spotgpu.guard.rule import GUARD_MATCH

MATCH = [(GUARD_MATCH.mask, GUARD_MATCH.value)]


class FilteredThread:
    """A thread with the guard's filter that runs the callables it is given, one by one."""

    def __init__(self) -> None:
        self.jobs: list[Callable[[], object]] = []
        self.results: list[object] = []
        self._go = threading.Semaphore(0)
        self._ready = threading.Event()
        self.fd = -1
        self.tid = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self._ready.wait(5)

    def _run(self) -> None:
        self.fd = seccomp.install_notify_filter(MATCH)
        self.tid = threading.get_native_id()
        self._ready.set()
        while True:
            self._go.acquire()
            job = self.jobs.pop(0)
            if job is None:
                return
            try:
                self.results.append(job())
            except OSError as exc:
                self.results.append(exc.errno)

    def submit(self, job: Callable[[], object] | None) -> None:
        self.jobs.append(job)  # type: ignore[arg-type]
        self._go.release()

    def finish(self) -> None:
        self.submit(None)
        self.thread.join(5)


def ioctl_on_null(request: int) -> Callable[[], object]:
    def job() -> object:
        fd = os.open("/dev/null", os.O_RDONLY)
        try:
            return fcntl.ioctl(fd, request, bytearray(72), True)
        finally:
            os.close(fd)

    return job


def readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def test_receive_continue_and_id_validity() -> None:
    target = FilteredThread()
    try:
        target.submit(ioctl_on_null(0xC048_46D2))
        assert readable(target.fd, 5)
        notification = seccomp.recv(target.fd)
        assert notification is not None
        assert notification.nr == seccomp.native_arch().nr_ioctl and notification.request == 0xC048_46D2
        assert notification.pid == target.tid
        assert seccomp.id_valid(target.fd, notification.id)
        assert seccomp.send_continue(target.fd, notification.id)
        assert not seccomp.id_valid(target.fd, notification.id)
        assert not seccomp.send_continue(target.fd, notification.id)  # answered already
        target.submit(ioctl_on_null(0xC020_462A))  # RM_CONTROL: never notified
        target.submit(lambda: "done")
        deadline = 50
        while len(target.results) < 3 and deadline:
            assert not readable(target.fd, 0.1)
            deadline -= 1
        assert target.results == [errno.ENOTTY, errno.ENOTTY, "done"]
    finally:
        target.finish()
        os.close(target.fd)


def test_pollhup_once_every_filtered_task_is_gone() -> None:
    target = FilteredThread()
    poller = select.poll()
    poller.register(target.fd, select.POLLIN)
    assert poller.poll(0) == []
    target.finish()
    events = dict(poller.poll(5000))
    assert events[target.fd] & select.POLLHUP
    os.close(target.fd)


def test_closing_the_last_listener_copy_turns_caught_calls_into_enosys() -> None:
    """Why the holder exists: without any copy of the fd, the filter answers ENOSYS."""
    target = FilteredThread()
    os.close(target.fd)
    target.submit(ioctl_on_null(0xC048_46D2))
    target.submit(ioctl_on_null(0xC020_462A))
    target.finish()
    assert target.results == [errno.ENOSYS, errno.ENOTTY]


def test_program_validation() -> None:
    arch = seccomp.native_arch()
    assert len(seccomp.notify_program(MATCH, arch)) == 9
    with pytest.raises(ValueError, match="at least one"):
        seccomp.notify_program([], arch)
    with pytest.raises(ValueError, match="32-bit mask"):
        seccomp.notify_program([(0x1_0000_0000, 0)], arch)
    assert seccomp.notif_sizes()[0] >= seccomp.NOTIF.size
    assert seccomp.action_available(seccomp.SECCOMP_RET_USER_NOTIF)
