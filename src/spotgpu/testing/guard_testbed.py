"""A test bed for the return guard on a machine without a GPU: runc owner containers running
the stand-in GPU client, and the fd holder as a child process. Used by the guard's tests and by
``spotgpu bench guard``.

Side effects: child processes (``runc run``/``exec``, ``spotgpu guard-holder``), OCI bundles and
logs under the directory the caller gives; ``close()``/``kill()`` end what was started here.
Needs root, runc and a root filesystem containing ``/bin/guardprobe`` (see
:func:`spotgpu.testing.standin.build_probe` and :func:`spotgpu.testing.containerd.make_rootfs`).
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from spotgpu.core.refs import ContainerRef
from spotgpu.guard.rule import apply_guard_rule
from spotgpu.testing import standin
from spotgpu.testing.containerd import make_bundle


class Lines:
    """Reads a pipe's JSON lines on a thread; :meth:`next` waits with a timeout."""

    def __init__(self, stream: Any, name: str) -> None:
        self.name = name
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self.raw: list[str] = []
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: Any) -> None:
        for line in stream:
            text = line.decode(errors="replace") if isinstance(line, bytes) else line
            self.raw.append(text)
            with contextlib.suppress(ValueError):
                self.queue.put(json.loads(text))

    def next(self, timeout: float) -> dict[str, Any]:
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.name}: no output within {timeout}s; got so far: {self.raw[-5:]}") from None

    def wait_for(self, event: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            item = self.next(max(0.01, deadline - time.monotonic()))
            if item.get("event") == event:
                return item


class HolderProcess:
    """``spotgpu guard-holder`` as a child process. :meth:`start` returns once it serves (its
    readiness file exists), which after a handover means it has taken over from its predecessor."""

    def __init__(
        self,
        listener: Path,
        control: Path,
        *,
        guard_timeout: float = 1.0,
        handover_timeout: float = 30.0,
        inherit: bool = True,
        log: Path,
    ) -> None:
        self.listener, self.control, self.log_path = listener, control, log
        self.guard_timeout = guard_timeout
        self.handover_timeout = handover_timeout
        self.inherit = inherit
        self.ready_file = log.with_suffix(".ready")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> HolderProcess:
        with contextlib.suppress(FileNotFoundError):
            self.ready_file.unlink()
        args = [
            sys.executable,
            "-m",
            "spotgpu",
            "--log-level",
            "DEBUG",
            "guard-holder",
            "--listener",
            str(self.listener),
            "--control",
            str(self.control),
            "--guard-timeout",
            str(self.guard_timeout),
            "--handover-timeout",
            str(self.handover_timeout),
            "--ready-file",
            str(self.ready_file),
        ]
        if not self.inherit:
            args.append("--no-inherit")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"guard-holder did not come up: {self.log()}")
            time.sleep(0.02)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path.exists() else ""

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def signal(self, signum: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def terminate(self, timeout: float = 10.0) -> int:
        self.signal(signal.SIGTERM)
        return self.wait(timeout)


def standin_devices(spec: dict[str, Any]) -> None:
    """Expose /dev/null's device numbers as /dev/nvidiactl, /dev/nvidia0 and /dev/nvidia-uvm."""
    linux = spec.setdefault("linux", {})
    devices = linux.setdefault("devices", [])
    for path in standin.STANDIN_DEVICES:
        devices.append({"path": path, "type": "c", "major": 1, "minor": 3, "fileMode": 0o666, "uid": 0, "gid": 0})


class OwnerContainer:
    """A runc container running ``guardprobe serve`` as its init; commands over its stdin."""

    def __init__(
        self,
        base: Path,
        rootfs: Path,
        name: str,
        *,
        listener: Path | None,
        owner: ContainerRef | None,
        seccomp: dict[str, Any] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:
        self.base = base
        self.id = name
        self.root = base / "runc"
        self.bundle = base / f"bundle-{name}"
        config = make_bundle(self.bundle, rootfs, ["/bin/guardprobe", "serve"], annotations=annotations)
        spec = json.loads(config.read_text())
        standin_devices(spec)
        if seccomp is not None:
            spec["linux"]["seccomp"] = seccomp
        if listener is not None and owner is not None:
            apply_guard_rule(spec, listener_path=str(listener), owner=owner)
        config.write_text(json.dumps(spec, indent=1))
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.out: Lines | None = None
        self._stderr = base / f"runc-{name}.log"

    def start(self, timeout: float = 20.0) -> OwnerContainer:
        with self._stderr.open("ab") as err:
            self.proc = subprocess.Popen(
                ["runc", "--root", str(self.root), "run", "--bundle", str(self.bundle), self.id],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        assert self.proc.stdout is not None
        self.out = Lines(self.proc.stdout, f"container {self.id}")
        try:
            self.command("ping", timeout)
        except TimeoutError:
            raise RuntimeError(f"container {self.id} did not start: {self.stderr()}") from None
        return self

    def stderr(self) -> str:
        return self._stderr.read_text(errors="replace")[-3000:] if self._stderr.exists() else ""

    def send(self, text: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def read(self, timeout: float) -> dict[str, Any]:
        assert self.out is not None
        return self.out.next(timeout)

    def command(self, text: str, timeout: float = 10.0) -> dict[str, Any]:
        self.send(text)
        return self.read(timeout)

    def call(self, request: int, device: str = standin.CTL, timeout: float = 10.0) -> dict[str, Any]:
        return self.command(f"call {device} {request:#x}", timeout)

    def exec(self, *args: str) -> subprocess.Popen[bytes]:
        """``runc exec`` a new process into the container (a new seccomp listener connection)."""
        return subprocess.Popen(
            ["runc", "--root", str(self.root), "exec", self.id, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def init_pid(self) -> int:
        state = subprocess.run(
            ["runc", "--root", str(self.root), "state", self.id], capture_output=True, text=True, check=True
        )
        return int(json.loads(state.stdout)["pid"])

    def close(self) -> None:
        subprocess.run(["runc", "--root", str(self.root), "kill", self.id, "KILL"], capture_output=True, check=False)
        if self.proc is not None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        subprocess.run(
            ["runc", "--root", str(self.root), "delete", "--force", self.id], capture_output=True, check=False
        )


_ALLOWED_TEXT = """
accept accept4 access arch_prctl bind brk capget capset chdir clock_getres clock_gettime
clock_nanosleep close close_range connect dup dup2 dup3 epoll_create1 epoll_ctl epoll_pwait
epoll_wait eventfd2 execve execveat exit exit_group faccessat faccessat2 fadvise64 fchdir fchmod
fchown fcntl fdatasync flock fork fstat fstatfs fsync ftruncate futex getcwd getdents64 getegid
geteuid getgid getgroups getpgid getpgrp getpid getppid getpriority getrandom getresgid getresuid
getrlimit getrusage getsid getsockname getsockopt gettid gettimeofday getuid getxattr ioctl kill
lgetxattr listen lseek lstat madvise membarrier mincore mmap mprotect mremap munmap nanosleep
newfstatat open openat openat2 pipe pipe2 poll ppoll prctl pread64 preadv prlimit64 pselect6
pwrite64 read readlink readlinkat readv recvfrom recvmsg rename renameat rseq rt_sigaction
rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend rt_sigtimedwait
sched_getaffinity sched_yield select sendmsg sendto set_robust_list set_tid_address setgid setgroups
setitimer setpgid setresgid setresuid setsid setsockopt setuid shutdown sigaltstack socket
socketpair stat statfs statx sysinfo tgkill time tkill umask uname unlink unlinkat vfork wait4
waitid write writev
"""
RUNTIME_DEFAULT_ALLOWED = tuple(_ALLOWED_TEXT.split())
"""Deliberately without ``mkdir``/``mkdirat``: a test proves the profile still denies them."""


def runtime_default_like() -> dict[str, Any]:
    """A RuntimeDefault-like profile (the shape of containerd's and Docker's default: deny by
    default, a long unconditional allow list that includes ``ioctl``, a few conditional entries),
    written for the guard's tests and benchmark."""
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [
            {"names": list(RUNTIME_DEFAULT_ALLOWED), "action": "SCMP_ACT_ALLOW"},
            {
                "names": ["personality"],
                "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}],
            },
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": 2114060288, "op": "SCMP_CMP_MASKED_EQ", "valueTwo": 0}],
            },
        ],
    }


__all__ = ["HolderProcess", "Lines", "OwnerContainer", "runtime_default_like", "standin_devices"]
