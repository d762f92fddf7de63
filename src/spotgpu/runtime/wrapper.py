"""The per-call wrapper: hands ``create`` specs to the agent's runtime service, then execs runc.

Decides only the plumbing (whether to ask the agent at all, and what to do when it cannot be
asked); every decision about the spec is the agent's (:mod:`spotgpu.runtime.engine`).
Side effects: reads the bundle's ``config.json``; one unix-socket round trip to the agent;
rewrites ``config.json`` atomically (temporary file and rename) when the agent modified it;
appends runc-style error lines to the ``--log`` file; finally replaces this process with the
lower runtime (``execv``), with the same arguments and environment.

Runs on the host, started by the shell fast path (:mod:`spotgpu.runtime.shim`) only for a
``create`` whose spec mentions our annotations or looks like a GPU owner's. So it is built for
start-up time and for whatever ``python3`` the host has (>= 3.8, started with ``-I -S``): it
imports only ``posix``, ``sys``, ``time`` and ``_socket`` plus our two byte-level helpers, never
``json`` or gRPC (measured in docs/runtime.md: the Python floor is ~8 ms, ``json`` alone +9 ms,
``grpc`` +60 ms).

Failure policy:

* A spec that asks for a device sync or annotation env, carries an annotation only we may write,
  or (with a lower runtime that turns env into devices, ``env_markers``) sets a device-selecting
  env (``needs_agent``) fails ``create`` when the agent cannot answer (or uses the local
  fallback when one is configured): running it without its devices or env, with a forged
  annotation, or with a device selector nobody checked would be wrong, and a failed create is
  retried by the kubelet.
* The markers are looked for in the *whole* file, not only in the part that fits a request:
  a spec larger than ``protocol.MAX_SPEC_BYTES`` that needs the agent is refused, never run
  unchanged (it cannot be sent, and a sync hidden past the window would silently start the
  container without its devices).
* A spec that is only a possible guard owner never fails because of us: if the agent cannot
  answer, the container is created unchanged (unguarded) and a warning is logged.
* The spec file is written only after the agent answered ``modified``; on every error it is
  left byte-identical and the lower runtime is not run.
"""

from __future__ import annotations

import posix  # ``os`` without its Python layer: ``import os`` alone costs 1.1 ms here (docs/runtime.md)
import sys
import time

from spotgpu.runtime import protocol
from spotgpu.runtime.argv import RuncArgs, parse

SYNC_MARKERS = (b"platform.k8s.io/container-devices-from", b"platform.k8s.io/container-env")
"""Substrings of a spec that asks for a device sync or annotation env (keys.DEVICES_FROM_PREFIX,
keys.CONTAINER_ENV_PREFIX; a test keeps them equal). Go's JSON encoder never escapes ``/``."""
WRITTEN_MARKERS = (
    b"platform.k8s.io/synced-devices",
    b"spotgpu.io/guarded",
    b"spotgpu.io/guard-skipped",
    b"cdi.k8s.io/spotgpu-synced",
)
"""The annotations only spotgpu-runtime may write (keys.RUNTIME_WRITTEN; a test keeps them equal):
a spec carrying one must reach the agent, which removes them, or not run at all."""
_CHUNK = 1 << 20

EXIT_REFUSED = 1
EXIT_NO_LOWER = 127


class _AgentUnavailable(Exception):
    """The agent's socket could not be reached at all (absent, refused, permission)."""


class _AgentFailed(Exception):
    """The agent was reached but the exchange failed (timeout, broken or malformed answer)."""


def _json_string(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def log_line(level: str, message: str, log_format: str | None, now: float | None = None) -> str:
    """One log line as runc writes it (logrus): JSON when ``log_format == "json"``, else text.

    containerd's shim reads the last ``"level":"error"`` line of the JSON log after a failed
    ``create`` and reports its ``msg`` ("OCI runtime create failed: <msg>").
    """
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    if log_format == "json":
        return f'{{"level":{_json_string(level)},"msg":{_json_string(message)},"time":{_json_string(stamp)}}}\n'
    return f"time={_json_string(stamp)} level={level} msg={_json_string(message)}\n"


def report(args: RuncArgs, level: str, message: str) -> None:
    """Tell the caller: stderr always, and runc's ``--log`` file when there is one. Never raises."""
    text = "spotgpu-runtime: " + message
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    if args.log_path:
        try:
            fd = posix.open(args.log_path, posix.O_WRONLY | posix.O_APPEND | posix.O_CREAT | posix.O_CLOEXEC, 0o644)
            try:
                posix.write(fd, log_line(level, text, args.log_format).encode("utf-8", "replace"))
            finally:
                posix.close(fd)
        except OSError:
            pass


def _exists(path: str) -> bool:
    try:
        posix.stat(path)
    except OSError:
        return False
    return True


def _unlink(path: str) -> None:
    try:
        posix.unlink(path)
    except OSError:
        return


def write_atomically(path: str, data: bytes) -> None:
    """Replace ``path`` by ``data`` through a temporary file in the same directory and a rename.

    Keeps the file's permission bits and ownership. On any error the temporary file is removed
    and ``path`` is unchanged.
    """
    # Not spotgpu.util.fileio.write_atomic on purpose: this module runs on the host's python3
    # from the few files the installer copies (shim.WRAPPER_FILES), on every owner's create,
    # with ``posix`` instead of ``os`` (1.1 ms of imports); and it keeps config.json's mode and
    # owner. No fsync either: the bundle is gone after a reboot, and runc reads it right away.
    st = posix.stat(path)
    prefix = path[: path.rfind("/") + 1]  # the directory with its slash, or "" (same filesystem)
    tmp = f"{prefix}.{path[len(prefix) :]}.spotgpu-{posix.getpid()}"
    _unlink(tmp)  # a leftover of an earlier, killed run with the same PID
    mode = st.st_mode & 0o7777
    fd = posix.open(tmp, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_CLOEXEC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                written = posix.write(fd, view)
                view = view[written:]
            posix.fchmod(fd, mode)
            if posix.geteuid() == 0:
                posix.fchown(fd, st.st_uid, st.st_gid)
        finally:
            posix.close(fd)
        posix.rename(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def ask_agent(socket_path: str, container_id: str, bundle: str, spec: bytes, timeout: float) -> tuple[bytes, bytes]:
    """One request to the agent's runtime service; ``(status, body)``."""
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
        except OSError as exc:
            raise _AgentUnavailable(f"cannot connect to {socket_path}: {exc.strerror or exc}") from None
        try:
            sock.sendall(protocol.request(container_id, bundle, spec))
            sock.shutdown(_socket.SHUT_WR)
            answer = protocol.read_message(sock.recv)
        except OSError as exc:
            raise _AgentFailed(f"talking to {socket_path}: {exc.strerror or exc}") from None
        except protocol.ProtocolError as exc:
            raise _AgentFailed(f"answer from {socket_path}: {exc}") from None
        try:
            return protocol.parse_response(answer)
        except protocol.ProtocolError as exc:
            raise _AgentFailed(f"malformed answer from {socket_path}: {exc}") from None
    finally:
        sock.close()


def exec_lower(lower: str, argv: list[str], args: RuncArgs) -> int:
    """Replace this process with the lower runtime; returns only if that fails."""
    try:
        if "/" in lower:
            posix.execv(lower, [lower, *argv])
        import os  # PATH search; the installer always writes an absolute path

        os.execvp(lower, [lower, *argv])
    except OSError as exc:
        report(args, "error", f"cannot run the lower runtime {lower!r}: {exc.strerror or exc}")
    return EXIT_NO_LOWER


def _local(fallback: tuple[tuple[str, ...], str], container_id: str, bundle: str, spec: bytes) -> tuple[bytes, bytes]:
    """The in-process engine (gRPC to the kubelet, owners from the agent's state file)."""
    paths, config = fallback
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)
    from spotgpu.runtime.local import modify_locally

    return modify_locally(config, container_id, bundle, spec)


def _read_spec(path: str, markers: tuple[bytes, ...]) -> tuple[bytes, set[bytes]] | None:
    """The first ``MAX_SPEC_BYTES + 1`` bytes of ``path`` and which ``markers`` the whole file holds
    (a marker split across two reads is found: each read keeps the previous one's tail); None
    when it cannot be read."""
    try:
        with open(path, "rb") as f:
            head = f.read(protocol.MAX_SPEC_BYTES + 1)
            found = {m for m in markers if m in head}
            if len(head) <= protocol.MAX_SPEC_BYTES:
                return head, found
            keep = max((len(m) for m in markers), default=1) - 1
            tail = head[len(head) - keep :] if keep else b""
            while len(found) < len(markers):
                chunk = f.read(_CHUNK)
                if not chunk:
                    break
                window = tail + chunk
                found.update(m for m in markers if m in window)
                tail = window[len(window) - keep :] if keep else b""
    except OSError:
        return None
    return head, found


def decide(
    argv: list[str],
    *,
    agent_socket: str,
    timeout: float = 10.0,
    listener: str | None = None,
    owner_markers: tuple[str, ...] = (),
    fallback: tuple[tuple[str, ...], str] | None = None,
    env_markers: tuple[str, ...] = (),
) -> tuple[RuncArgs, int | None]:
    """Everything but the final exec: ``(args, exit code)``, where ``None`` means "exec the lower runtime".

    ``env_markers``: substrings of a device-selecting env entry (``"NVIDIA_VISIBLE_DEVICES=``),
    given when the lower runtime turns such env into devices; such a spec needs the agent."""
    args = parse(argv)
    if not args.is_create:
        return args, None
    strict = (*SYNC_MARKERS, *WRITTEN_MARKERS, *(m.encode("utf-8") for m in env_markers))
    owner = tuple(m.encode("utf-8") for m in owner_markers)
    read = _read_spec(args.config_path, (*strict, *owner))
    if read is None:
        return args, None  # the lower runtime reports a missing or unreadable bundle itself
    spec, found = read
    needs_agent = any(m in found for m in strict)
    owner_candidate = bool(listener and _exists(listener) and any(m in found for m in owner))
    if not needs_agent and not owner_candidate:
        return args, None
    container_id = args.container_id or args.bundle.rstrip("/").rpartition("/")[2] or args.bundle
    if len(spec) > protocol.MAX_SPEC_BYTES:
        text = f"config.json exceeds {protocol.MAX_SPEC_BYTES} bytes; a spec that cannot be read whole is refused"
        status, body = protocol.REFUSED, text.encode()
    else:
        local = fallback if needs_agent else None  # a possible owner never runs the chain locally
        status, body = _answer(agent_socket, container_id, args.bundle, spec, timeout, fallback=local)
    if status == protocol.UNCHANGED:
        return args, None
    if status == protocol.MODIFIED:
        try:
            write_atomically(args.config_path, body)
        except OSError as exc:
            status, body = protocol.RETRY, f"cannot write {args.config_path}: {exc.strerror or exc}".encode()
        else:
            return args, None
    message = body.decode("utf-8", "replace")
    if not needs_agent:
        # A possible guard owner: never fail the owner's container because of us.
        report(args, "warning", f"container {container_id} created unguarded: {message}")
        return args, None
    report(args, "error", f"container {container_id}: {message}")
    return args, EXIT_REFUSED


def _answer(
    agent_socket: str,
    container_id: str,
    bundle: str,
    spec: bytes,
    timeout: float,
    *,
    fallback: tuple[tuple[str, ...], str] | None,
) -> tuple[bytes, bytes]:
    """The agent's ``(status, body)``; ``fallback`` (the local chain) when it cannot be reached."""
    try:
        return ask_agent(agent_socket, container_id, bundle, spec, timeout)
    except _AgentUnavailable as exc:
        if fallback is None:
            return protocol.RETRY, f"spotgpu agent unreachable: {exc}".encode()
        try:
            return _local(fallback, container_id, bundle, spec)
        except Exception as local_exc:  # report whatever broke, never a traceback
            return protocol.RETRY, f"agent unreachable ({exc}); local fallback failed: {local_exc}".encode()
    except _AgentFailed as exc:
        return protocol.RETRY, f"spotgpu agent failed: {exc}".encode()


def main(
    argv: list[str] | None = None,
    *,
    lower: str = "runc",
    agent_socket: str = "/run/spotgpu/agent.sock",
    timeout: float = 10.0,
    listener: str | None = None,
    owner_markers: tuple[str, ...] = (),
    fallback: tuple[tuple[str, ...], str] | None = None,
    env_markers: tuple[str, ...] = (),
) -> int:
    """Run as the runtime: modify the spec when needed, then exec ``lower``; returns only on failure."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    args, code = decide(
        args_list,
        agent_socket=agent_socket,
        timeout=timeout,
        listener=listener,
        owner_markers=owner_markers,
        fallback=fallback,
        env_markers=env_markers,
    )
    if code is not None:
        return code
    return exec_lower(lower, args_list, args)


__all__ = [
    "EXIT_NO_LOWER",
    "EXIT_REFUSED",
    "SYNC_MARKERS",
    "WRITTEN_MARKERS",
    "decide",
    "log_line",
    "main",
    "report",
    "write_atomically",
]
