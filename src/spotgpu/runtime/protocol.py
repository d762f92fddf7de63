"""The wire format between the per-call wrapper and the agent's runtime service.

Pure byte handling; no side effects. Imported by the per-call wrapper, so built-ins only and
host ``python3`` >= 3.8 syntax (see :mod:`spotgpu.runtime.argv`).

One request per connection on a unix stream socket. Each message is a sequence of netstrings
(``<decimal length>:<bytes>,``), chosen because both ends can frame and check them with a few
slices and no JSON parser: the wrapper never needs to import ``json`` (about 9 ms of imports).

* Request: ``MAGIC``, ``b"modify"``, container ID, bundle path, the bundle's ``config.json``
  bytes. The wrapper then shuts down its sending side.
* Response: ``MAGIC``, a status, a body, and the connection is closed:

  - ``unchanged``: the spec needs nothing from us; body empty. The wrapper execs the lower runtime.
  - ``modified``: body is the new ``config.json``; the wrapper writes it atomically, then execs.
  - ``refused``: a permanent refusal (bad annotation, a sync the kubelet did not grant); body
    is the message. The wrapper fails ``create`` with it.
  - ``retry``: a temporary failure (kubelet socket down, ...); body is the message. The
    wrapper fails ``create`` too; the kubelet retries container creation with backoff.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # no ``typing`` import at run time (see the module docstring)
    from collections.abc import Callable

MAGIC = b"spotgpu-runtime/1"
MODIFY = b"modify"

UNCHANGED = b"unchanged"
MODIFIED = b"modified"
REFUSED = b"refused"
RETRY = b"retry"
STATUSES = frozenset((UNCHANGED, MODIFIED, REFUSED, RETRY))

MAX_SPEC_BYTES = 4 * 1024 * 1024
"""Largest ``config.json`` either side accepts (an OCI spec is typically 5-50 KiB)."""
MAX_MESSAGE_BYTES = MAX_SPEC_BYTES + 64 * 1024
"""Largest whole request or response."""
_MAX_LENGTH_DIGITS = 9


class ProtocolError(ValueError):
    """A message is not well-formed netstrings, has the wrong shape, or is too large."""


def encode(*fields: bytes) -> bytes:
    """The netstrings of ``fields``, concatenated."""
    return b"".join(str(len(f)).encode("ascii") + b":" + f + b"," for f in fields)


def decode(data: bytes, count: int) -> list[bytes]:
    """Exactly ``count`` netstrings from ``data`` (nothing may follow); raise :class:`ProtocolError`."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    fields: list[bytes] = []
    pos = 0
    while len(fields) < count:
        colon = data.find(b":", pos, pos + _MAX_LENGTH_DIGITS + 1)
        digits = data[pos:colon]
        if colon < 0 or not digits or not digits.isdigit() or (len(digits) > 1 and digits[:1] == b"0"):
            raise ProtocolError(f"field {len(fields)}: no valid length at byte {pos}")
        length = int(digits)
        start, end = colon + 1, colon + 1 + length
        if data[end : end + 1] != b",":
            raise ProtocolError(f"field {len(fields)}: {length} bytes announced, message truncated or unterminated")
        fields.append(data[start:end])
        pos = end + 1
    if pos != len(data):
        raise ProtocolError(f"{len(data) - pos} unexpected bytes after {count} fields")
    return fields


def read_message(recv: Callable[[int], bytes]) -> bytes:
    """Everything ``recv`` yields until end of stream; :class:`ProtocolError` past :data:`MAX_MESSAGE_BYTES`.

    ``recv`` is a socket's ``recv``; its ``OSError`` (timeouts included) propagates.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = recv(262144)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"message exceeds {MAX_MESSAGE_BYTES} bytes")
        chunks.append(chunk)


def request(container_id: str, bundle: str, spec: bytes) -> bytes:
    return encode(MAGIC, MODIFY, _bytes(container_id), _bytes(bundle), spec)


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def parse_request(data: bytes) -> tuple[str, str, bytes]:
    """``(container_id, bundle, spec)``; raise :class:`ProtocolError` for anything else."""
    magic, method, container_id, bundle, spec = decode(data, 5)
    if magic != MAGIC:
        raise ProtocolError(f"unknown protocol {magic[:40]!r}; expected {MAGIC!r}")
    if method != MODIFY:
        raise ProtocolError(f"unknown method {method[:40]!r}")
    if len(spec) > MAX_SPEC_BYTES:
        raise ProtocolError(f"spec of {len(spec)} bytes exceeds {MAX_SPEC_BYTES}")
    return (
        container_id.decode("utf-8", "surrogateescape"),
        bundle.decode("utf-8", "surrogateescape"),
        spec,
    )


def response(status: bytes, body: bytes = b"") -> bytes:
    if status not in STATUSES:
        raise ProtocolError(f"unknown status {status!r}")
    return encode(MAGIC, status, body)


def parse_response(data: bytes) -> tuple[bytes, bytes]:
    """``(status, body)``; raise :class:`ProtocolError` for anything else."""
    magic, status, body = decode(data, 3)
    if magic != MAGIC:
        raise ProtocolError(f"unknown protocol {magic[:40]!r}; expected {MAGIC!r}")
    if status not in STATUSES:
        raise ProtocolError(f"unknown status {status[:40]!r}")
    return status, body


__all__ = [
    "MAGIC",
    "MAX_MESSAGE_BYTES",
    "MAX_SPEC_BYTES",
    "MODIFIED",
    "REFUSED",
    "RETRY",
    "STATUSES",
    "UNCHANGED",
    "ProtocolError",
    "decode",
    "encode",
    "parse_request",
    "parse_response",
    "read_message",
    "request",
    "response",
]
