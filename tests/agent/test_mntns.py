"""The mount-namespace hold of a return (spotgpu.adapters.mntns) on real namespaces (root): a
held namespace outlives its last process (so that process's exit does not tear it down) and
goes at the release; our own namespace, exited processes and duplicates are not held; the
/proc fallback refuses a PID whose pinned process has exited; nothing is held for long."""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotgpu.adapters import mntns
from spotgpu.adapters.mntns import MountNamespaceHold, open_mount_namespace

from .helpers import mount_namespace_fds

pytestmark = pytest.mark.root


def wait_gone(fds: set[int], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while fds & mount_namespace_fds():
        assert time.monotonic() < deadline, f"fds {fds & mount_namespace_fds()} never closed"
        time.sleep(0.01)


class Victim:
    """A process alone in a new mount namespace with a tmpfs mounted at ``mnt`` holding a file."""

    def __init__(self, mnt: Path) -> None:
        mnt.mkdir(exist_ok=True)
        script = f"mount -t tmpfs spotgpu-test {mnt} && echo kept > {mnt}/file && echo ready && exec sleep 1000"
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid
        self.fd = os.pidfd_open(self.pid)

    def kill(self) -> None:
        signal.pidfd_send_signal(self.fd, signal.SIGKILL)
        assert select.select([self.fd], [], [], 10)[0], "the victim never exited"
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.fd)


@pytest.fixture
def victim(tmp_path: Path) -> Iterator[Victim]:
    v = Victim(tmp_path / "mnt")
    try:
        yield v
    finally:
        v.close()


def read_in(ns_fd: int, path: Path) -> str:
    """``cat path`` inside the namespace behind our fd ``ns_fd`` (nsenter through /proc/<us>/fd)."""
    done = subprocess.run(
        ["nsenter", f"--mount=/proc/{os.getpid()}/fd/{ns_fd}", "cat", str(path)],
        capture_output=True,
        text=True,
        pass_fds=(ns_fd,),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_held_namespace_outlives_its_last_process_and_goes_at_the_release(victim: Victim, tmp_path: Path) -> None:
    hold = MountNamespaceHold()
    assert hold.hold([(victim.fd, victim.pid)]) == 1
    (ns_fd,) = hold.held()
    assert os.readlink(f"/proc/self/fd/{ns_fd}") == os.readlink(f"/proc/{victim.pid}/ns/mnt")
    victim.kill()
    # the exit dropped a reference only: the namespace, its tmpfs and the file are all still there
    assert read_in(ns_fd, tmp_path / "mnt" / "file") == "kept"
    hold.release()
    wait_gone({ns_fd})
    assert len(hold) == 0 and hold.held_total == 1


def test_our_own_namespace_exited_processes_and_duplicates_are_not_held(victim: Victim) -> None:
    before = mount_namespace_fds()
    hold = MountNamespaceHold()
    plain = subprocess.Popen(["sleep", "1000"])  # shares our mount namespace
    plain_fd = os.pidfd_open(plain.pid)
    try:
        assert hold.hold([(plain_fd, plain.pid)]) == 0
        second = os.pidfd_open(victim.pid)
        assert hold.hold([(victim.fd, victim.pid), (second, victim.pid)]) == 1  # one namespace, once
        os.close(second)
        plain.kill()
        plain.wait(10)
        assert hold.hold([(plain_fd, plain.pid), (-1, 0)]) == 0
    finally:
        os.close(plain_fd)
        hold.release(wait=True)
    assert mount_namespace_fds() == before, "a namespace fd leaked"


def test_without_the_ioctl_a_pid_whose_pinned_process_exited_is_not_held(
    victim: Victim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernels before 6.11 have no PIDFD_GET_MNT_NAMESPACE: the namespace is opened through
    /proc/<pid>/ns/mnt, which names whatever process has the PID *now*. Here the pinned process
    has exited and its PID is (as far as /proc says) another process's, the victim's: the open
    succeeds, and only the pidfd check stops us from holding a stranger's namespace."""

    def no_ioctl(fd: int, request: int, *args: object) -> int:
        raise OSError(errno.ENOTTY, "Inappropriate ioctl for device")

    monkeypatch.setattr(mntns.fcntl, "ioctl", no_ioctl)
    live = open_mount_namespace(victim.fd, victim.pid)
    assert live is not None
    assert os.readlink(f"/proc/self/fd/{live}") == os.readlink(f"/proc/{victim.pid}/ns/mnt")
    os.close(live)

    dead = subprocess.Popen(["true"])
    dead_fd = os.pidfd_open(dead.pid)
    dead.wait(10)
    fake_proc = tmp_path / "proc"
    (fake_proc / str(dead.pid) / "ns").mkdir(parents=True)
    (fake_proc / str(dead.pid) / "ns" / "mnt").symlink_to(f"/proc/{victim.pid}/ns/mnt")  # "reused"
    before = mount_namespace_fds()
    try:
        assert open_mount_namespace(dead_fd, dead.pid, proc_root=fake_proc) is None
        assert MountNamespaceHold(proc_root=fake_proc).hold([(dead_fd, dead.pid)]) == 0
    finally:
        os.close(dead_fd)
    assert mount_namespace_fds() == before


def test_namespaces_are_dropped_after_the_longest_hold_without_a_release(
    victim: Victim, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mntns, "MAX_HOLD_S", 0.05)
    hold = MountNamespaceHold()
    assert hold.hold([(victim.fd, victim.pid)]) == 1
    fds = set(hold.held())
    wait_gone(fds)
    assert len(hold) == 0
