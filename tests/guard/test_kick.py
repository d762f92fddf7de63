"""Restarting a call stranded in a notification whose receiver died (root: ptrace): the thread
is found through /proc, interrupted, and its ioctl re-notifies with a new cookie."""

from __future__ import annotations

import errno
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotgpu.guard import kick, seccomp
from spotgpu.guard.rule import GUARD_MATCH

CHILD = """
import fcntl, os, socket, sys
from spotgpu.guard import seccomp
s = socket.socket(fileno=int(sys.argv[1]))
fd = seccomp.install_notify_filter([(0xC000FFFF, 0xC00046D2)])
seccomp.send_with_fd(s, b"fd", fd)
os.close(fd)
s.recv(1)
null = os.open("/dev/null", os.O_RDWR)
try:
    fcntl.ioctl(null, 0xC04846D2, bytearray(72), True)
except OSError as exc:
    print(exc.errno, flush=True)
"""


def test_parse_syscall_line() -> None:
    assert kick.parse_syscall_line("16 0x3 0xc04846d2 0x7ffd 0x0 0x0 0x0 0x7ffc 0x7f00\n") == (
        16,
        (3, 0xC04846D2, 0x7FFD, 0, 0, 0),
    )
    assert kick.parse_syscall_line("running\n") is None
    assert kick.parse_syscall_line("-1 0x7ffc 0x7f00\n") is None
    assert kick.parse_syscall_line("") is None


@pytest.mark.root
def test_a_stranded_call_is_restarted_and_notifies_again() -> None:
    parent, child_end = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(child_end.fileno())],
        pass_fds=[child_end.fileno()],
        stdout=subprocess.PIPE,
    )
    child_end.close()
    try:
        _, fds = seccomp.recv_with_fds(parent, 16)
        listener = fds[0]
        parent.send(b"g")
        assert select.select([listener], [], [], 10)[0]
        first = seccomp.recv(listener)
        assert first is not None  # received and never answered: stranded
        time.sleep(0.05)
        own_ns = os.readlink(f"/proc/{proc.pid}/ns/pid")
        assert kick.find_blocked(GUARD_MATCH, pid_namespaces={"pid:[1]"}) == []
        found = kick.find_blocked(GUARD_MATCH, pid_namespaces={own_ns})
        assert [c.tid for c in found] == [first.pid]
        report = kick.kick_blocked(GUARD_MATCH, pid_namespaces={own_ns})
        assert report.restarted == [first.pid] and not report.failed
        assert not seccomp.id_valid(listener, first.id)
        assert select.select([listener], [], [], 5)[0]
        again = seccomp.recv(listener)
        assert again is not None and again.id != first.id and again.request == 0xC04846D2
        assert seccomp.send_continue(listener, again.id)
        out, _ = proc.communicate(timeout=10)
        assert out.decode().strip() == str(errno.ENOTTY)
        os.close(listener)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        parent.close()


def _fake_thread(proc: Path, pid: int, tid: int, wchan: str, syscall: str, state: str) -> None:
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True)
    (task / "wchan").write_text(wchan)
    (task / "syscall").write_text(syscall)
    (task / "stat").write_text(f"{tid} (python3 (x)) {state} 1 1 1 0 -1\n")


def test_which_threads_count_as_stranded(tmp_path: Path) -> None:
    """A /proc-shaped tree: only threads waiting in the notification for a matched request."""
    nr = seccomp.native_arch().nr_ioctl
    matched = f"{nr} 0x3 0xc04846d2 0x0 0x0 0x0 0x0 0x7ffc 0x7f00\n"
    _fake_thread(tmp_path, 10, 10, "seccomp_do_user_notification.isra.0", matched, "S")
    _fake_thread(tmp_path, 10, 11, "futex_wait_queue", matched, "S")  # elsewhere
    _fake_thread(tmp_path, 12, 12, "seccomp_do_user_notification", f"{nr} 0x3 0xc020462a 0 0 0 0 0 0\n", "S")
    _fake_thread(tmp_path, 13, 13, "0", matched, "S")  # wchan hidden, sleeping in the matched ioctl
    _fake_thread(tmp_path, 14, 14, "0", matched, "R")  # hidden and running: not waiting
    found = kick.find_blocked(GUARD_MATCH, tmp_path)
    assert sorted((c.pid, c.tid) for c in found) == [(10, 10), (13, 13)]
