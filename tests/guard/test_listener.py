"""Parsing runc's seccomp-listener message and finding the owner (pure), and reading it from a
real unix socket the way runc 1.1 sends it (one sendmsg with the fd, connection left open)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core import keys
from spotgpu.core.errors import TemporaryError
from spotgpu.core.refs import ContainerRef
from spotgpu.guard import seccomp
from spotgpu.guard.listener import (
    ListenerStateError,
    NotifyFdInfo,
    parse_process_state,
    read_connection,
    resolve_owner,
)
from spotgpu.guard.rule import format_listener_metadata

OWNER = ContainerRef("team-a", "dev-0", "main")

# As runc 1.1.5 sent it here (container create), plus CRI annotations and our metadata.
RUNC_CREATE: dict[str, Any] = {
    "ociVersion": "1.0.2-dev",
    "fds": ["seccompFd"],
    "pid": 12853,
    "metadata": format_listener_metadata(OWNER),
    "state": {
        "ociVersion": "1.0.2-dev",
        "id": "4f1c0ffee",
        "status": "creating",
        "pid": 12853,
        "bundle": "/run/containerd/io.containerd.runtime.v2.task/k8s.io/4f1c0ffee",
        "annotations": {
            keys.CRI_SANDBOX_NAMESPACE: "team-a",
            keys.CRI_SANDBOX_NAME: "dev-0",
            keys.CRI_CONTAINER_NAME: "main",
        },
    },
}


def payload(**changes: Any) -> bytes:
    data = json.loads(json.dumps(RUNC_CREATE))
    for key, value in changes.items():
        if key.startswith("state_"):
            data["state"][key[6:]] = value
        else:
            data[key] = value
    return json.dumps(data).encode()


def test_create_and_exec_states() -> None:
    state = parse_process_state(payload(), 1)
    assert (state.container_id, state.pid, state.init_pid, state.fd_index) == ("4f1c0ffee", 12853, 12853, 0)
    assert not state.is_exec
    execd = parse_process_state(payload(pid=13000, state_status="running"), 1)
    assert execd.is_exec and execd.init_pid == 12853
    assert resolve_owner(state).owner == OWNER


@pytest.mark.parametrize(
    ("change", "nfds", "message"),
    [
        ({"fds": []}, 0, "exactly one"),
        ({"fds": ["seccompFd", "seccompFd"]}, 2, "exactly one"),
        ({}, 2, "carried 2"),
        ({"pid": 0}, 1, "pid"),
        ({"pid": "1"}, 1, "pid"),
        ({"state": None}, 1, "state"),
        ({"state_id": ""}, 1, "state.id"),
        ({"metadata": 5}, 1, "metadata"),
        ({"state_annotations": {"a": 1}}, 1, "annotations"),
    ],
)
def test_bad_states_are_refused_with_the_field(change: dict[str, Any], nfds: int, message: str) -> None:
    with pytest.raises(ListenerStateError, match=message):
        parse_process_state(payload(**change), nfds)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)
    )
)
def test_any_json_is_either_a_state_or_a_clear_error(value: object) -> None:
    with contextlib.suppress(ListenerStateError):
        parse_process_state(json.dumps(value), 1)


@given(st.binary(max_size=200))
def test_any_bytes_are_either_a_state_or_a_clear_error(data: bytes) -> None:
    with contextlib.suppress(ListenerStateError):
        parse_process_state(data, 1)


def test_owner_resolution_prefers_metadata_and_reports_disagreement() -> None:
    only_annotations = parse_process_state(payload(metadata=""), 1)
    assert resolve_owner(only_annotations).owner == OWNER
    disagree = parse_process_state(
        payload(
            state_annotations={
                keys.CRI_SANDBOX_NAMESPACE: "x",
                keys.CRI_SANDBOX_NAME: "y",
                keys.CRI_CONTAINER_NAME: "z",
            }
        ),
        1,
    )
    resolution = resolve_owner(disagree)
    assert resolution.owner == OWNER and "trusting the metadata" in resolution.warning
    crio = parse_process_state(
        payload(
            metadata=None,
            state_annotations={
                keys.LABEL_POD_NAMESPACE: "team-a",
                keys.LABEL_POD_NAME: "dev-0",
                keys.LABEL_CONTAINER_NAME: "main",
            },
        ),
        1,
    )
    assert resolve_owner(crio).owner == OWNER
    nothing = parse_process_state(payload(metadata="", state_annotations={}), 1)
    assert resolve_owner(nothing).owner is None


def test_fd_info_round_trip_and_errors() -> None:
    info = NotifyFdInfo("k1", "cid", 10, 9, True, OWNER)
    assert NotifyFdInfo.from_wire(info.to_wire()) == info
    assert NotifyFdInfo.from_wire({**info.to_wire(), "owner": None}).owner is None
    for bad in ({**info.to_wire(), "exec": "yes"}, {**info.to_wire(), "owner": "x"}, {**info.to_wire(), "pid": -1}, []):
        with pytest.raises(ListenerStateError):
            NotifyFdInfo.from_wire(bad)


def _notify_fd() -> tuple[int, threading.Thread]:
    """A real seccomp notify fd: a helper thread installs a filter and exits at once."""
    box: dict[str, int] = {}
    thread = threading.Thread(target=lambda: box.setdefault("fd", seccomp.install_notify_filter([(0xFFFF, 0x1)])))
    thread.start()
    thread.join()
    return box["fd"], thread


def test_read_connection_stops_when_the_json_is_complete_without_eof() -> None:
    notify_fd, _ = _notify_fd()
    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    big = payload(state_annotations={**RUNC_CREATE["state"]["annotations"], "big": "x" * 200_000})
    try:
        seccomp.send_with_fd(client, big[:1000], notify_fd)  # the fd comes with the first chunk
        client.sendall(big[1000:])  # and the connection stays open, as with runc 1.1
        conn = read_connection(server, timeout=5)
        assert conn is not None
        assert conn.state.container_id == "4f1c0ffee" and seccomp.is_notify_fd(conn.fd)
        os.close(conn.fd)
    finally:
        os.close(notify_fd)
        client.close()
        server.close()


def test_read_connection_probe_garbage_and_timeout() -> None:
    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    client.close()
    assert read_connection(server) is None  # a readiness probe
    server.close()

    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    null = os.open("/dev/null", os.O_RDONLY)
    seccomp.send_with_fd(client, payload(), null)  # not a notify fd
    with pytest.raises(ListenerStateError, match="not a seccomp notify fd"):
        read_connection(server)
    os.close(null)
    client.close()
    server.close()

    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    client.sendall(b'{"fds": [')
    with pytest.raises(TemporaryError, match="no complete state"):
        read_connection(server, timeout=0.2)
    client.close()
    server.close()
