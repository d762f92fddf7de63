"""A gRPC server on one unix socket, the base of the kubelet-side doubles.

Side effects: a gRPC server and its threads; stopped by ``stop()`` (or the context manager).
"""

from __future__ import annotations

import os
import time
from concurrent import futures
from pathlib import Path
from types import TracebackType
from typing import Self

import grpc


class Server:
    """A gRPC server on one unix socket, as a context manager (subclasses add their servicers)."""

    def __init__(self, socket: Path, workers: int = 8) -> None:
        self.socket = socket
        self._workers = workers
        self._server: grpc.Server | None = None

    def _add_servicers(self, server: grpc.Server) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._workers))
        self._add_servicers(server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self, grace: float | None = 0) -> None:
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def socket_exists(path: Path) -> bool:
    try:
        return path.is_socket()
    except OSError:
        return False


def wait_for_socket(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if socket_exists(path):
            return
        time.sleep(0.01)
    raise TimeoutError(f"socket {path} did not appear within {timeout}s (exists: {os.path.exists(path)})")


__all__ = ["Server", "socket_exists", "wait_for_socket"]
