"""Seccomp user-notification plumbing: structures, ioctls, fd passing, and a thread-level filter.

Decides nothing. Side effects: ioctls on seccomp notify fds (receive a notification, answer it
with CONTINUE, check that it is still pending), sendmsg/recvmsg with ``SCM_RIGHTS`` on unix
sockets, and, in :func:`install_notify_filter`, a seccomp filter on the *calling thread* (used by
the availability self-test, tests, the benchmark and the GPU check; never on the agent's own
long-lived threads).

Facts (``protocols.md`` section 5, checked against ``linux/seccomp.h`` on x86_64):
``struct seccomp_notif`` is 80 bytes (``<QIIiIQ6Q``), ``struct seccomp_notif_resp`` 24 bytes
(``<QqiI``); RECV needs a zeroed buffer; a notification whose target died or was interrupted by
a signal answers ENOENT; ``SECCOMP_USER_NOTIF_FLAG_CONTINUE`` (Linux 5.5) runs the original
syscall; the fd polls readable with a pending notification and POLLHUP once every task using
the filter has exited.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import platform
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

SECCOMP_IOCTL_NOTIF_RECV: Final = 0xC050_2100
SECCOMP_IOCTL_NOTIF_SEND: Final = 0xC018_2101
SECCOMP_IOCTL_NOTIF_ID_VALID: Final = 0x4008_2102
SECCOMP_USER_NOTIF_FLAG_CONTINUE: Final = 1

SECCOMP_SET_MODE_FILTER: Final = 1
SECCOMP_GET_ACTION_AVAIL: Final = 2
SECCOMP_GET_NOTIF_SIZES: Final = 3
SECCOMP_FILTER_FLAG_NEW_LISTENER: Final = 1 << 3
SECCOMP_RET_ALLOW: Final = 0x7FFF_0000
SECCOMP_RET_USER_NOTIF: Final = 0x7FC0_0000
PR_SET_NO_NEW_PRIVS: Final = 38

NOTIF: Final = struct.Struct("<QIIiIQ6Q")
RESP: Final = struct.Struct("<QqiI")
NOTIFY_FD_LINK: Final = "anon_inode:seccomp notify"


@dataclass(frozen=True, slots=True)
class Arch:
    """What a seccomp filter needs to know about one architecture."""

    audit_arch: int
    nr_ioctl: int
    nr_seccomp: int
    nr_ptrace: int


ARCHES: Final = {
    "x86_64": Arch(audit_arch=0xC000_003E, nr_ioctl=16, nr_seccomp=317, nr_ptrace=101),
    "aarch64": Arch(audit_arch=0xC000_00B7, nr_ioctl=29, nr_seccomp=277, nr_ptrace=117),
}


class SeccompError(OSError):
    """A seccomp operation failed; ``errno`` is set."""


@dataclass(frozen=True, slots=True)
class Notification:
    """One ``struct seccomp_notif``: a syscall waiting for our answer."""

    id: int
    pid: int
    """TID of the caller, in the PID namespace of whoever received the notification."""
    nr: int
    arch: int
    args: tuple[int, int, int, int, int, int]

    @property
    def fd(self) -> int:
        """For ``ioctl``: the caller's fd number (meaningful in the caller's fd table only)."""
        return self.args[0] & 0xFFFF_FFFF

    @property
    def request(self) -> int:
        """For ``ioctl``: the request, reduced to the 32 bits the kernel uses."""
        return self.args[1] & 0xFFFF_FFFF

    @classmethod
    def unpack(cls, buf: bytes | bytearray) -> Notification:
        nid, pid, _flags, nr, arch, _ip, *args = NOTIF.unpack(buf)
        a0, a1, a2, a3, a4, a5 = args
        return cls(id=nid, pid=pid, nr=nr, arch=arch, args=(a0, a1, a2, a3, a4, a5))


def _notify_ioctl(fd: int, request: int, buf: bytearray, name: str, gone: tuple[int, ...]) -> bool:
    """One notify-fd ioctl; False for the errnos that mean "that notification is gone"."""
    try:
        fcntl.ioctl(fd, request, buf, True)
    except OSError as exc:
        if exc.errno in gone:
            return False
        raise SeccompError(exc.errno, f"{name} on fd {fd}: {exc.strerror}") from None
    return True


def recv(fd: int) -> Notification | None:
    """Receive one pending notification; None if it vanished (target killed or interrupted).

    Call only when ``fd`` polls readable: with nothing pending RECV blocks, and after the
    last target exited it may block forever (seccomp_unotify(2) BUGS).
    """
    buf = bytearray(NOTIF.size)
    got = _notify_ioctl(fd, SECCOMP_IOCTL_NOTIF_RECV, buf, "SECCOMP_IOCTL_NOTIF_RECV", (errno.ENOENT, errno.EINTR))
    return Notification.unpack(buf) if got else None


def send_continue(fd: int, notification_id: int) -> bool:
    """Let the held syscall run. False when it is gone: the caller died, a signal interrupted it
    (it restarts and notifies again), or someone already answered it."""
    buf = bytearray(RESP.pack(notification_id, 0, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE))
    return _notify_ioctl(
        fd, SECCOMP_IOCTL_NOTIF_SEND, buf, "SECCOMP_IOCTL_NOTIF_SEND", (errno.ENOENT, errno.EINPROGRESS)
    )


def id_valid(fd: int, notification_id: int) -> bool:
    """True while the notification is received and not yet answered."""
    buf = bytearray(struct.pack("<Q", notification_id))
    return _notify_ioctl(fd, SECCOMP_IOCTL_NOTIF_ID_VALID, buf, "SECCOMP_IOCTL_NOTIF_ID_VALID", (errno.ENOENT,))


def is_notify_fd(fd: int) -> bool:
    """True when ``fd`` (in this process) is a seccomp notify fd."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == NOTIFY_FD_LINK
    except OSError:
        return False


# --- fd passing ---------------------------------------------------------------------------


def send_with_fd(sock: socket.socket, payload: bytes, fd: int | None = None) -> None:
    """One message carrying ``payload`` and, optionally, one fd (SCM_RIGHTS)."""
    if fd is None:
        sock.sendmsg([payload])
    else:
        socket.send_fds(sock, [payload], [fd])


def recv_with_fds(sock: socket.socket, bufsize: int, maxfds: int = 4) -> tuple[bytes, list[int]]:
    """One recvmsg; fds beyond ``maxfds`` are closed by the kernel (MSG_CTRUNC), never leaked."""
    data, fds, _flags, _addr = socket.recv_fds(sock, bufsize, maxfds)
    return data, list(fds)


def close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


# --- filters (self-test, tests, benchmark, GPU check) --------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


class _SockFilter(ctypes.Structure):
    _fields_ = (("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32))


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter)))


_LD_W_ABS: Final = 0x20
_JEQ_K: Final = 0x15
_AND_K: Final = 0x54
_RET_K: Final = 0x06


def native_arch() -> Arch:
    arch = ARCHES.get(platform.machine())
    if arch is None:
        raise SeccompError(errno.ENOTSUP, f"no seccomp filter support for machine {platform.machine()!r}")
    return arch


def notify_program(matches: Sequence[tuple[int, int]], arch: Arch) -> list[tuple[int, int, int, int]]:
    """A classic-BPF seccomp program: ``ioctl`` whose request satisfies any ``(mask, value)``
    (low 32 bits) goes to the listener; everything else, and other architectures, is allowed."""
    if not matches:
        raise ValueError("at least one (mask, value) match is needed")
    for mask, value in matches:
        if not 0 < mask <= 0xFFFF_FFFF or value & ~mask:
            raise ValueError(f"match ({mask:#x}, {value:#x}) must be a 32-bit mask with the value inside it")
    # Layout: 0 arch check, 2 nr check, then per match: ld, and, jeq; then ALLOW, NOTIFY.
    body: list[tuple[int, int, int, int]] = []
    n = len(matches)
    allow_at = 4 + 3 * n
    notify_at = allow_at + 1
    body.append((_LD_W_ABS, 0, 0, 4))  # seccomp_data.arch
    body.append((_JEQ_K, 0, allow_at - 2, arch.audit_arch))
    body.append((_LD_W_ABS, 0, 0, 0))  # seccomp_data.nr
    body.append((_JEQ_K, 0, allow_at - 4, arch.nr_ioctl))
    for i, (mask, value) in enumerate(matches):
        here = 4 + 3 * i
        body.append((_LD_W_ABS, 0, 0, 24))  # low 32 bits of args[1] (little endian)
        body.append((_AND_K, 0, 0, mask))
        body.append((_JEQ_K, notify_at - (here + 3), 0, value))
    body.append((_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    body.append((_RET_K, 0, 0, SECCOMP_RET_USER_NOTIF))
    return body


def install_notify_filter(matches: Sequence[tuple[int, int]]) -> int:
    """Install :func:`notify_program` on the calling thread; return the new listener fd.

    Only the calling thread (and processes it forks later) is filtered. Needs CAP_SYS_ADMIN or
    sets ``no_new_privs`` on the thread first.
    """
    arch = native_arch()
    program = notify_program(matches, arch)
    filters = (_SockFilter * len(program))(*(_SockFilter(*ins) for ins in program))
    prog = _SockFprog(len(program), filters)
    flags = SECCOMP_FILTER_FLAG_NEW_LISTENER
    fd = int(_libc.syscall(arch.nr_seccomp, SECCOMP_SET_MODE_FILTER, flags, ctypes.byref(prog)))
    if fd < 0 and ctypes.get_errno() == errno.EACCES:
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise SeccompError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
        fd = int(_libc.syscall(arch.nr_seccomp, SECCOMP_SET_MODE_FILTER, flags, ctypes.byref(prog)))
    if fd < 0:
        err = ctypes.get_errno()
        raise SeccompError(err, f"seccomp(SECCOMP_SET_MODE_FILTER, NEW_LISTENER): {os.strerror(err)}")
    return fd


def notif_sizes() -> tuple[int, int, int]:
    """``SECCOMP_GET_NOTIF_SIZES``: the kernel's (seccomp_notif, seccomp_notif_resp, seccomp_data)."""
    arch = native_arch()
    sizes = (ctypes.c_uint16 * 3)()
    if _libc.syscall(arch.nr_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, ctypes.byref(sizes)) != 0:
        err = ctypes.get_errno()
        raise SeccompError(err, f"seccomp(SECCOMP_GET_NOTIF_SIZES): {os.strerror(err)}")
    return int(sizes[0]), int(sizes[1]), int(sizes[2])


def action_available(action: int) -> bool:
    """``SECCOMP_GET_ACTION_AVAIL``: the kernel knows the filter return ``action``."""
    arch = native_arch()
    value = ctypes.c_uint32(action)
    return bool(_libc.syscall(arch.nr_seccomp, SECCOMP_GET_ACTION_AVAIL, 0, ctypes.byref(value)) == 0)


__all__ = [
    "ARCHES",
    "NOTIF",
    "RESP",
    "Arch",
    "Notification",
    "SeccompError",
    "action_available",
    "close_all",
    "id_valid",
    "install_notify_filter",
    "is_notify_fd",
    "native_arch",
    "notif_sizes",
    "notify_program",
    "recv",
    "recv_with_fds",
    "send_continue",
    "send_with_fd",
]
