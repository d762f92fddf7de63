"""What runc sends to a seccomp listener, and which owner container a notify fd belongs to.

Parsing is pure (:func:`parse_process_state`, :func:`resolve_owner`); :func:`read_connection`
reads one listener connection from a socket (its only side effect).

runc connects to ``listenerPath`` once per process it starts under the filter (``create`` and
every ``exec``) and sends one message: the OCI *container process state* JSON with exactly one
fd attached (``SCM_RIGHTS``). runc 1.1 never closes the connection afterwards, so the reader
stops as soon as the JSON parses, never waiting for EOF. A connection that closes without
sending anything is a readiness probe (:func:`spotgpu.guard.rule.listener_ready`).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from spotgpu.core import keys
from spotgpu.core.errors import TemporaryError, ValidationError
from spotgpu.core.refs import ContainerRef, RefError
from spotgpu.guard import seccomp
from spotgpu.guard.rule import GuardRuleError, parse_listener_metadata

SECCOMP_FD_NAME: Final = "seccompFd"
MAX_STATE_BYTES: Final = 1 << 20
"""A process state larger than this is refused (Kubernetes annotations are capped at 256 KiB)."""


class ListenerStateError(ValidationError):
    """A listener connection sent something that is not a usable container process state."""


@dataclass(frozen=True, slots=True)
class ProcessState:
    """One listener connection's content: which process of which container the fd filters."""

    container_id: str
    pid: int
    """The process runc started under the filter (the container's init, or the exec'd process)."""
    init_pid: int
    status: str
    """``creating`` for the container's init, ``running`` (or later states) for ``runc exec``."""
    fd_index: int
    """Index of the notify fd among the fds of the message."""
    metadata: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_exec(self) -> bool:
        return self.status != "creating" or self.pid != self.init_pid


def _int(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ListenerStateError(f"{where}: expected a positive integer, got {value!r}")
    return value


def parse_process_state(payload: bytes | str, nfds: int) -> ProcessState:
    """Parse runc's container process state; ``nfds`` is how many fds came with it."""
    if isinstance(payload, bytes):
        try:
            payload = payload.decode()
        except UnicodeDecodeError as exc:
            raise ListenerStateError(f"process state is not UTF-8: {exc}") from None
    try:
        data = json.loads(payload)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ListenerStateError(f"process state is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ListenerStateError(f"process state: expected an object, got {type(data).__name__}")
    fds = data.get("fds")
    if not isinstance(fds, list) or not all(isinstance(f, str) for f in fds):
        raise ListenerStateError(f"fds: expected a list of names, got {fds!r}")
    if fds.count(SECCOMP_FD_NAME) != 1:
        raise ListenerStateError(f"fds: expected exactly one {SECCOMP_FD_NAME!r}, got {fds!r}")
    if len(fds) != nfds:
        raise ListenerStateError(f"fds names {len(fds)} fds but the message carried {nfds}")
    state = data.get("state")
    if not isinstance(state, dict):
        raise ListenerStateError(f"state: expected an object, got {state!r}")
    container_id = state.get("id")
    if not isinstance(container_id, str) or not container_id:
        raise ListenerStateError(f"state.id: expected a container ID, got {container_id!r}")
    status = state.get("status")
    if not isinstance(status, str) or not status:
        raise ListenerStateError(f"state.status: expected a string, got {status!r}")
    metadata = data.get("metadata", "")
    if metadata is None:
        metadata = ""
    if not isinstance(metadata, str):
        raise ListenerStateError(f"metadata: expected a string, got {metadata!r}")
    annotations = state.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
    ):
        raise ListenerStateError("state.annotations: expected an object of strings")
    return ProcessState(
        container_id=container_id,
        pid=_int(data.get("pid"), "pid"),
        init_pid=_int(state.get("pid"), "state.pid"),
        status=status,
        fd_index=fds.index(SECCOMP_FD_NAME),
        metadata=metadata,
        annotations=dict(annotations),
    )


def _owner_from_annotations(annotations: Mapping[str, str]) -> ContainerRef | None:
    pairs = (
        (keys.CRI_SANDBOX_NAMESPACE, keys.CRI_SANDBOX_NAME, keys.CRI_CONTAINER_NAME),
        (keys.LABEL_POD_NAMESPACE, keys.LABEL_POD_NAME, keys.LABEL_CONTAINER_NAME),
    )
    for ns_key, pod_key, container_key in pairs:
        ns, pod, name = annotations.get(ns_key), annotations.get(pod_key), annotations.get(container_key)
        if ns and pod and name:
            try:
                return ContainerRef(ns, pod, name)
            except RefError:
                return None
    return None


@dataclass(frozen=True, slots=True)
class OwnerResolution:
    owner: ContainerRef | None
    warning: str = ""


def resolve_owner(state: ProcessState) -> OwnerResolution:
    """The owner container a notify fd belongs to.

    The listener metadata written by :func:`spotgpu.guard.rule.apply_guard_rule` is
    authoritative; the CRI annotations (containerd, or CRI-O's pod labels) are the fallback
    for specs that carry none. A disagreement between the two is reported as a warning.
    """
    try:
        from_metadata = parse_listener_metadata(state.metadata)
    except GuardRuleError as exc:
        from_metadata, bad = None, str(exc)
    else:
        bad = ""
    from_annotations = _owner_from_annotations(state.annotations)
    if from_metadata is not None:
        if from_annotations is not None and from_annotations != from_metadata:
            return OwnerResolution(
                from_metadata,
                f"container {state.container_id}: listener metadata names {from_metadata} but its CRI "
                f"annotations name {from_annotations}; trusting the metadata",
            )
        return OwnerResolution(from_metadata)
    return OwnerResolution(from_annotations, bad)


@dataclass(frozen=True, slots=True)
class NotifyFdInfo:
    """A notify fd as the holder and the guard describe it to each other."""

    key: str
    """Unique for the fd's lifetime, across holder and agent restarts."""
    container_id: str
    pid: int
    init_pid: int
    exec: bool
    owner: ContainerRef | None

    def to_wire(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "container_id": self.container_id,
            "pid": self.pid,
            "init_pid": self.init_pid,
            "exec": self.exec,
            "owner": self.owner.format() if self.owner else None,
        }

    @classmethod
    def from_wire(cls, data: object) -> NotifyFdInfo:
        if not isinstance(data, dict):
            raise ListenerStateError(f"fd info: expected an object, got {data!r}")
        key, cid, owner = data.get("key"), data.get("container_id"), data.get("owner")
        if not isinstance(key, str) or not key or not isinstance(cid, str):
            raise ListenerStateError(f"fd info: bad key or container_id in {data!r}")
        if not isinstance(data.get("exec"), bool):
            raise ListenerStateError(f"fd info: exec must be a boolean in {data!r}")
        try:
            ref = ContainerRef.parse(owner) if owner is not None else None
        except RefError as exc:
            raise ListenerStateError(f"fd info: {exc}") from None
        return cls(
            key=key,
            container_id=cid,
            pid=_int(data.get("pid"), "fd info pid"),
            init_pid=_int(data.get("init_pid"), "fd info init_pid"),
            exec=bool(data["exec"]),
            owner=ref,
        )


@dataclass(frozen=True, slots=True)
class Connection:
    """One listener connection read to its end: the notify fd (ours to close) and the state."""

    fd: int
    state: ProcessState


def read_connection(conn: socket.socket, timeout: float = 2.0) -> Connection | None:
    """Read runc's message from an accepted listener connection.

    Returns None for a probe (EOF before any byte). Raises :class:`ListenerStateError` for
    garbage (every received fd is closed) and :class:`TemporaryError` on timeout. Stops as
    soon as the JSON is complete (runc 1.1 keeps the connection open).
    """
    deadline = time.monotonic() + timeout
    buf = bytearray()
    fds: list[int] = []
    decoder = json.JSONDecoder()
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TemporaryError(f"listener connection sent {len(buf)} bytes and no complete state in {timeout}s")
            conn.settimeout(remaining)
            try:
                data, got = seccomp.recv_with_fds(conn, 65536, maxfds=4)
            except TimeoutError:
                continue
            fds.extend(got)
            if not data:
                if not buf and not fds:
                    return None
                raise ListenerStateError(f"listener connection closed after {len(buf)} bytes without a complete state")
            buf += data
            if len(buf) > MAX_STATE_BYTES:
                raise ListenerStateError(f"process state larger than {MAX_STATE_BYTES} bytes")
            try:
                decoder.raw_decode(buf.decode())
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            state = parse_process_state(bytes(buf), len(fds))
            fd = fds[state.fd_index]
            if not seccomp.is_notify_fd(fd):
                raise ListenerStateError(
                    f"container {state.container_id}: the fd runc passed is not a seccomp notify fd"
                )
            seccomp.close_all([f for f in fds if f != fd])
            fds = []
            return Connection(fd, state)
    finally:
        seccomp.close_all(fds)


__all__ = [
    "MAX_STATE_BYTES",
    "SECCOMP_FD_NAME",
    "Connection",
    "ListenerStateError",
    "NotifyFdInfo",
    "OwnerResolution",
    "ProcessState",
    "parse_process_state",
    "read_connection",
    "resolve_owner",
]
