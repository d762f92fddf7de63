"""A stand-in for the return guard's seccomp listener, for tests.

Side effects: a unix socket server and its thread. Like the guard's fd holder it accepts runc's
connection, reads the container process state JSON and its notify fd (SCM_RIGHTS), records the
state and closes the fd (the test never makes the held call); a connection that sends nothing
is a readiness probe, as :func:`spotgpu.guard.rule.listener_ready` makes.
"""

from __future__ import annotations

import array
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any


class RecordingListener:
    """Records every ContainerProcessState runc sends to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.states: list[dict[str, Any]] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(str(path))
        self.sock.listen()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    data, ancdata, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(4 * 4))
                except OSError:
                    continue
                for level, kind, payload in ancdata:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        for fd in array.array("i", payload[: len(payload) - len(payload) % 4]):
                            os.close(fd)
                if data:
                    self.states.append(json.loads(data))

    def wait_for(self, owner: str, timeout: float = 5.0) -> dict[str, Any] | None:
        """The first state whose metadata names ``owner`` (None when none came in time)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((s for s in self.states if owner in str(s.get("metadata", ""))), None)
            if found is not None:
                return found
            time.sleep(0.02)
        return None

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)


__all__ = ["RecordingListener"]
