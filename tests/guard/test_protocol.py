"""The holder <-> guard control protocol: encoding (property-tested) and real SEQPACKET
transport with fd passing."""

from __future__ import annotations

import contextlib
import os
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core.refs import ContainerRef
from spotgpu.guard import protocol
from spotgpu.guard.listener import NotifyFdInfo
from spotgpu.guard.protocol import Op, ProtocolError

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64) | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=10,
)


@given(
    st.sampled_from(list(Op)),
    st.dictionaries(st.text(max_size=10).filter(lambda k: k != "op"), json_values, max_size=5),
)
def test_encode_decode_round_trip(op: Op, body: dict[str, object]) -> None:
    message = protocol.decode(protocol.encode(op, **body))
    assert message.op is op and message.body == body


@given(st.binary(max_size=300))
def test_garbage_is_a_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        protocol.decode(data)


def test_typed_fields() -> None:
    message = protocol.decode(protocol.encode(Op.HOLD, key="k", id=2**63 + 5, flag=True, have=["a"]))
    assert message.str_field("key") == "k" and message.int_field("id") == 2**63 + 5
    assert message.bool_field("flag") and message.keys_field("have") == ["a"]
    for name, getter in (("id", message.str_field), ("key", message.int_field), ("key", message.bool_field)):
        with pytest.raises(ProtocolError, match=name):
            getter(name)
    with pytest.raises(ProtocolError, match="unknown control op"):
        protocol.decode(b'{"op": "nope"}')


def test_seqpacket_transport_with_an_fd() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    info = NotifyFdInfo("k", "cid", 5, 5, False, ContainerRef("ns", "p", "c"))
    r, w = os.pipe()
    try:
        protocol.send(a, protocol.fd_message(info), r)
        protocol.send(a, protocol.encode(Op.PING))
        got = protocol.receive(b)
        assert got is not None
        message, fd = got
        assert message.op is Op.FD and message.fd_info() == info and fd is not None
        os.write(w, b"x")
        assert os.read(fd, 1) == b"x"  # the same pipe, passed by SCM_RIGHTS
        os.close(fd)
        got = protocol.receive(b)
        assert got is not None and got[0].op is Op.PING and got[1] is None
        # An fd message without its fd, or a ping with one, is refused (and the fd closed).
        protocol.send(a, protocol.fd_message(info))
        with pytest.raises(ProtocolError, match="missing fd"):
            protocol.receive(b)
        protocol.send(a, protocol.encode(Op.PING), r)
        with pytest.raises(ProtocolError, match="unexpected fd"):
            protocol.receive(b)
        a.close()
        assert protocol.receive(b) is None
    finally:
        os.close(r)
        os.close(w)
        b.close()
