"""NRI's framing and the plugin's session against a runtime speaking the same wire format.

The framing is property-tested (any payload, any write boundaries, any frame split); the
plugin (:class:`spotgpu.nri.plugin.NriPlugin` on :class:`spotgpu.nri.transport.Session`) is
driven by :class:`~tests.runtime.nri_runtime.FakeRuntime`, an independent implementation of the
runtime's side on a real unix socket. The same plugin against real containerd 2.2.7 is in
``test_nri_containerd.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.adapters.proto import nri_v1alpha1_pb2 as nri
from spotgpu.nri import wire
from spotgpu.nri.plugin import NriPlugin
from spotgpu.nri.transport import PERMISSION_DENIED, UNIMPLEMENTED, RpcError

from .nri_runtime import FakeRuntime


@given(conn=st.integers(1, 2**32 - 1), data=st.binary(max_size=20000))
def test_mux_frames_never_exceed_4096_bytes_and_reassemble(conn: int, data: bytes) -> None:
    frames = wire.mux_frames(conn, data)
    assert all(len(f) <= wire.MAX_FRAME for f in frames)
    reader = wire.MuxReader()
    got = reader.feed(b"".join(frames))
    assert all(c == conn for c, _ in got)
    assert b"".join(p for _, p in got) == data


@given(
    messages=st.lists(
        st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 3]), st.binary(max_size=3000)), max_size=6
    ),
    cuts=st.lists(st.integers(1, 700), min_size=1, max_size=20),
)
def test_ttrpc_messages_survive_any_write_boundaries(messages: list[tuple[int, int, bytes]], cuts: list[int]) -> None:
    stream = b"".join(wire.ttrpc_message(s, k, d) for s, k, d in messages)
    reader = wire.TtrpcReader()
    got: list[wire.Message] = []
    at, i = 0, 0
    while at < len(stream):
        step = cuts[i % len(cuts)]
        got += reader.feed(stream[at : at + step])
        at, i = at + step, i + 1
    assert [(m.stream_id, m.kind, m.data) for m in got] == messages


def test_framing_refuses_what_would_break_the_connection() -> None:
    with pytest.raises(wire.WireError):
        wire.mux_frames(0, b"x")  # connection 0 is reserved
    with pytest.raises(wire.WireError):
        wire.TtrpcReader().feed(wire.TTRPC_HEADER.pack(wire.MAX_MESSAGE + 1, 1, 1, 0))
    with pytest.raises(wire.WireError):
        wire.MuxReader().feed(wire.MUX_HEADER.pack(1, 1 << 30))


def test_event_mask_is_one_bit_per_event() -> None:
    assert wire.event_mask(nri.CREATE_CONTAINER) == 0x8
    assert wire.event_mask(*range(1, 15)) == 0x3FFF
    with pytest.raises(wire.WireError):
        wire.event_mask(15)


# --- the plugin against the fake runtime -----------------------------------------------------------


class Handler:
    def __init__(self) -> None:
        self.synced: list[tuple[int, int]] = []
        self.created: list[str] = []
        self.answer: nri.ContainerAdjustment | RpcError = nri.ContainerAdjustment()
        self.started: list[str] = []
        self.start_answer: RpcError | None = None
        self.runtime: tuple[str, str] | None = None

    def create_container(
        self, pod: nri.PodSandbox, container: nri.Container, timeout: float
    ) -> nri.ContainerAdjustment:
        self.created.append(container.name)
        if isinstance(self.answer, RpcError):
            raise self.answer
        return self.answer

    def start_container(self, pod: nri.PodSandbox, container: nri.Container, timeout: float) -> None:
        self.started.append(container.name)
        if self.start_answer is not None:
            raise self.start_answer

    def synchronize(self, pods: Sequence[nri.PodSandbox], containers: Sequence[nri.Container]) -> None:
        self.synced.append((len(pods), len(containers)))

    def configure(self, runtime_name: str, runtime_version: str) -> None:
        self.runtime = (runtime_name, runtime_version)


@pytest.fixture
def session(tmp_path: Path) -> Iterator[tuple[FakeRuntime, NriPlugin, Handler]]:
    runtime = FakeRuntime(tmp_path / "nri.sock")
    handler = Handler()
    plugin = NriPlugin(runtime.path, handler, name="spotgpu", index="07").start()
    try:
        runtime.accept()
        yield runtime, plugin, handler
    finally:
        plugin.stop()
        runtime.close()


def configure_and_sync(runtime: FakeRuntime, parts: int = 1) -> None:
    answer = runtime.call(
        "Configure", nri.ConfigureRequest(runtime_name="fake", request_timeout=2000).SerializeToString()
    )
    assert nri.ConfigureResponse.FromString(answer.payload).events == 0x28  # CreateContainer, StartContainer
    for part in range(parts):
        request = nri.SynchronizeRequest(pods=[nri.PodSandbox(id=f"p{part}")], containers=[nri.Container(id="c")])
        request.more = part < parts - 1
        reply = nri.SynchronizeResponse.FromString(runtime.call("Synchronize", request.SerializeToString()).payload)
        assert reply.more == request.more and not reply.update


def wait(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)


def test_registration_configure_synchronize_in_parts(session: tuple[FakeRuntime, NriPlugin, Handler]) -> None:
    runtime, plugin, handler = session
    wait(lambda: runtime.registered)
    assert [(r.plugin_name, r.plugin_idx) for r in runtime.registered] == [("spotgpu", "07")]
    configure_and_sync(runtime, parts=3)
    assert plugin.wait_synchronized(5)
    assert handler.synced == [(3, 3)]  # the handler sees every part at once
    assert handler.runtime == ("fake", "")


def test_create_container_answers_and_errors_are_statuses(session: tuple[FakeRuntime, NriPlugin, Handler]) -> None:
    runtime, _, handler = session
    configure_and_sync(runtime)
    handler.answer = nri.ContainerAdjustment(env=[nri.KeyValue(key="A", value="1")])
    request = nri.CreateContainerRequest(pod=nri.PodSandbox(name="p"), container=nri.Container(name="c"))
    answer = runtime.call("CreateContainer", request.SerializeToString())
    assert not answer.HasField("status")
    assert [(kv.key, kv.value) for kv in nri.CreateContainerResponse.FromString(answer.payload).adjust.env] == [
        ("A", "1")
    ]
    handler.answer = RpcError(PERMISSION_DENIED, "spotgpu-runtime: device sync refused (twin-not-allocated)")
    refused = runtime.call("CreateContainer", request.SerializeToString())
    assert refused.status.code == PERMISSION_DENIED and "twin-not-allocated" in refused.status.message
    assert runtime.call("Frobnicate", b"").status.code == UNIMPLEMENTED


def test_start_container_events_reach_the_handler_and_its_refusal_is_a_status(
    session: tuple[FakeRuntime, NriPlugin, Handler],
) -> None:
    runtime, _, handler = session
    configure_and_sync(runtime)
    event = nri.StateChangeEvent(
        event=nri.START_CONTAINER, pod=nri.PodSandbox(name="p"), container=nri.Container(name="c")
    )
    answer = runtime.call("StateChange", event.SerializeToString())
    assert not answer.HasField("status") and handler.started == ["c"]
    handler.start_answer = RpcError(PERMISSION_DENIED, "spotgpu-runtime: start refused: 'GPU-0' is not lent out now")
    refused = runtime.call("StateChange", event.SerializeToString())
    assert refused.status.code == PERMISSION_DENIED and "not lent out now" in refused.status.message
    other = nri.StateChangeEvent(event=nri.POST_START_CONTAINER, container=nri.Container(name="c"))
    assert not runtime.call("StateChange", other.SerializeToString()).HasField("status")
    assert handler.started == ["c", "c"]  # only START_CONTAINER asks the handler


def test_a_large_answer_goes_out_in_frames_of_at_most_4096_bytes(
    session: tuple[FakeRuntime, NriPlugin, Handler],
) -> None:
    runtime, _, handler = session
    configure_and_sync(runtime)
    handler.answer = nri.ContainerAdjustment(env=[nri.KeyValue(key=f"V{i}", value="x" * 200) for i in range(150)])
    before = len(runtime.frames)
    answer = runtime.call("CreateContainer", nri.CreateContainerRequest().SerializeToString(), frame=300)
    adjust = nri.CreateContainerResponse.FromString(answer.payload).adjust
    assert len(adjust.env) == 150
    sent = runtime.frames[before:]
    assert len(sent) > 7 and max(size for _, size in sent) <= 4096


def test_frames_for_unknown_connections_are_dropped(session: tuple[FakeRuntime, NriPlugin, Handler]) -> None:
    runtime, _, _ = session
    runtime.send_raw(wire.MUX_HEADER.pack(9, 5) + b"junk!")
    configure_and_sync(runtime)  # the session still works


def test_the_plugin_reconnects_and_registers_again(tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path / "nri.sock", refuse_register="plugin index must be 2 digits")
    handler = Handler()
    plugin = NriPlugin(runtime.path, handler, index="50", max_backoff=0.1).start()
    try:
        runtime.accept()
        wait(lambda: runtime.registered)
        assert plugin.last_error is None or "2 digits" in (plugin.last_error or "")
        runtime.close()  # a refused registration, then the runtime goes away and comes back
        runtime = FakeRuntime(tmp_path / "nri.sock")
        runtime.accept(timeout=10)
        configure_and_sync(runtime)
        assert plugin.wait_synchronized(5)
        wait(lambda: plugin.sessions >= 1)  # counted once RegisterPlugin returned, which may come after the sync
        assert plugin.sessions >= 1
    finally:
        plugin.stop()
        runtime.close()


def test_stop_ends_the_session_promptly(session: tuple[FakeRuntime, NriPlugin, Handler]) -> None:
    _, plugin, _ = session
    began = time.monotonic()
    stopper = threading.Thread(target=plugin.stop)
    stopper.start()
    stopper.join(5)
    assert not stopper.is_alive() and time.monotonic() - began < 3
