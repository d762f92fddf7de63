"""The node end-to-end run's processes and pipes: child processes, the owner's GPU client over
FIFOs, and the pod-resources double that follows the API.

Side effects: child processes and their log files, two FIFOs, a reader thread, a gRPC server.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spotgpu.testing.kubeapi import KubeApiServer
from spotgpu.testing.podresources import PodResources, PodResourcesDouble


class ChildProcess:
    """A child process with its output in a log file; killed by :meth:`kill` or :meth:`stop`."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            out.write(f"--- start {self.starts} of {self.name}: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def kill(self) -> None:
        """SIGKILL and reap (a crash, as the faults want it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class OwnerClient:
    """The owner container's GPU client (:mod:`spotgpu.e2e.client`), driven over two FIFOs."""

    def __init__(self, io_dir: Path) -> None:
        self.io_dir = io_dir
        io_dir.mkdir(parents=True, exist_ok=True)
        for name in ("cmd", "out"):
            path = io_dir / name
            path.unlink(missing_ok=True)
            os.mkfifo(path, 0o600)
        # O_RDWR on a FIFO never blocks and keeps it open from both ends: the container's opens
        # succeed at once, and the client never sees EOF while this object lives.
        self._cmd = os.open(io_dir / "cmd", os.O_RDWR | os.O_CLOEXEC)
        self._out = os.open(io_dir / "out", os.O_RDWR | os.O_CLOEXEC)
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._reader = threading.Thread(target=self._read, name="owner-client", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        poller = select.poll()
        poller.register(self._out, select.POLLIN)
        pending = b""
        while not self._closing.is_set():
            if not poller.poll(200):
                continue
            try:
                chunk = os.read(self._out, 65536)
            except OSError:
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                with contextlib.suppress(ValueError):
                    self._replies.put(json.loads(line))

    def command(self, text: str, timeout: float) -> dict[str, Any]:
        """Send one command and wait for its reply."""
        with self._lock:
            os.write(self._cmd, text.encode() + b"\n")
            try:
                return self._replies.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"the owner's GPU client did not answer {text!r} within {timeout:.1f}s") from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._cmd, b"exit\n")
        self._closing.set()
        self._reader.join(timeout=2)
        for fd in (self._cmd, self._out):
            with contextlib.suppress(OSError):
                os.close(fd)


class ApiBackedPodResources(PodResourcesDouble):
    """The pod-resources double, answering only for pods the API double still has: a deleted
    pod leaves the kubelet's active pods (and so ``List``/``Get``) at once. ``delay`` makes every
    answer that much slower (a kubelet under load, for the faults)."""

    def __init__(self, socket_path: Path, api: KubeApiServer) -> None:
        super().__init__(socket_path)
        self.api = api
        self.delay = 0.0

    def pods(self) -> list[PodResources]:
        if self.delay > 0:
            time.sleep(self.delay)
        alive = {(p["metadata"].get("namespace", ""), p["metadata"]["name"]) for p in self.api.objects("", "pods")}
        return [p for p in super().pods() if (p.namespace, p.name) in alive]


__all__ = ["ApiBackedPodResources", "ChildProcess", "OwnerClient"]
