"""The lending record: which owners are lent survives an agent restart (real files for the
adapter, the in-memory store for the solver's decisions)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.adapters.agent_state import LendStateFile, decode, encode
from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import DeviceID
from spotgpu.core.lending import LendState
from spotgpu.core.refs import ContainerRef
from spotgpu.ports.kube import PodEvent, PodEventType
from spotgpu.ports.node import LearnedOwner, LentOwner
from spotgpu.testing.fakes import FakeLendStore

from .helpers import OWNER, Rig, make_rig, pod

OTHER = ContainerRef("dev", "devbox-2", "main")


def lend(rig: Rig) -> None:
    rig.cycle(0)
    rig.cycle(61)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.LENT


def restart(rig: Rig, tmp_path: Path, store: FakeLendStore, **kwargs: object) -> Rig:
    """A new agent on the same fakes' state (the node and the cluster did not change)."""
    rig.agent.stop()
    again = make_rig(tmp_path, store=store, start=False, **kwargs)  # type: ignore[arg-type]
    again.podres.set(rig.allocations)
    again.allocations = list(rig.allocations)
    for info in rig.kube.list_node_pods(rig.agent.node):
        again.kube.add_pod(info)
    again.agent.start(serve_metrics=False, loops=False)
    return again


# --- the file ---------------------------------------------------------------------------------------


def test_file_round_trip_is_atomic_and_private(tmp_path: Path) -> None:
    path = tmp_path / "run" / "agent-state.json"
    store = LendStateFile(path)
    assert store.load() == []  # no file yet: nothing lent
    entry = LentOwner(OWNER, (DeviceID("GPU-0"), DeviceID("GPU-1")), "c" * 64, 1700000000.5)
    store.save([entry])
    assert store.load() == [entry]
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["agent-state.json"]  # no temporary left behind
    store.save([])
    assert store.load() == []


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"version": 2, "lent": []}',
        '{"version": 3, "lent": []}',
        '{"version": 2, "lent": [], "owners": {"dev/p/c": {"idle": [1, 2]}}}',
        '{"version": 1, "lent": [{"owner": "no-namespace", "devices": ["GPU-0"], "since": 1}]}',
        '{"version": 1, "lent": [{"owner": "dev/p/c", "devices": [], "since": 1}]}',
        '{"version": 1, "lent": [{"owner": "dev/p/c", "devices": ["GPU-0"], "since": "yesterday"}]}',
    ],
)
def test_a_malformed_record_loads_as_nothing_lent(tmp_path: Path, text: str) -> None:
    path = tmp_path / "agent-state.json"
    path.write_text(text)
    assert LendStateFile(path).load() == []


@given(
    st.lists(
        st.builds(
            LentOwner,
            st.builds(
                ContainerRef,
                st.from_regex(r"[a-z]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True),
                st.from_regex(r"[a-z]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True),
                st.from_regex(r"[a-z]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True),
            ),
            st.lists(st.from_regex(r"GPU-[a-z0-9]{1,12}", fullmatch=True).map(DeviceID), min_size=1, max_size=4).map(
                tuple
            ),
            st.none() | st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
            st.floats(min_value=0, max_value=4e9, allow_nan=False),
        ),
        max_size=5,
        unique_by=lambda e: e.owner,
    )
)
def test_encode_decode_round_trip(entries: list[LentOwner]) -> None:
    assert sorted(decode(encode(entries)), key=lambda e: e.owner.format()) == sorted(
        entries, key=lambda e: e.owner.format()
    )


@given(st.binary(max_size=300))
def test_decode_never_crashes_on_garbage(data: bytes) -> None:
    with contextlib.suppress(ValidationError):
        decode(data)


# --- the solver ---------------------------------------------------------------------------------------


def test_lending_writes_the_record_before_the_twins_turn_healthy(tmp_path: Path) -> None:
    store = FakeLendStore()
    rig = make_rig(tmp_path, store=store)
    healthy_when_saved: list[bool] = []
    real_save = store.save

    def save(lent: list[LentOwner], learned: Mapping[ContainerRef, LearnedOwner] | None = None) -> None:
        healthy_when_saved.append(rig.agent.solver.lendable(rig.d[0]) is True)
        real_save(lent, learned)

    store.save = save  # type: ignore[method-assign]
    lend(rig)
    assert store.lent == [LentOwner(OWNER, (rig.d[0], rig.d[1]), "owner-cid", rig.clock.time())]
    assert healthy_when_saved == [False]  # saved while the twins were still Unhealthy


def test_a_lent_owner_without_spot_users_is_lent_again_at_once_after_a_restart(tmp_path: Path) -> None:
    store = FakeLendStore()
    rig = make_rig(tmp_path, store=store)
    lend(rig)
    again = restart(rig, tmp_path, store)
    assert again.agent.solver.state().lend_states[OWNER] is LendState.LENT  # no new maxInactiveTime
    assert again.guard.is_armed(OWNER)
    assert again.agent.solver.lendable(again.d[0]) is True


def test_the_return_is_written_right_after_the_owner_is_released(tmp_path: Path) -> None:
    store = FakeLendStore()
    rig = make_rig(tmp_path, store=store)
    lend(rig)
    record_at_disarm: list[list[LentOwner]] = []
    real_disarm = rig.guard.disarm

    def disarm(owner: ContainerRef) -> None:
        record_at_disarm.append(list(store.lent))
        real_disarm(owner)

    rig.guard.disarm = disarm  # type: ignore[method-assign]
    rig.guard.owner_back(OWNER)
    assert [e.owner for e in record_at_disarm[0]] == [OWNER]  # no file I/O before the owner's release
    assert store.lent == []  # ... but right after it
    again = restart(rig, tmp_path, store)
    assert again.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE


def test_a_stale_lent_record_of_a_returned_owner_is_corrected_at_once(tmp_path: Path) -> None:
    """The agent died between the release and the record's update: the next start lends the
    owner again with the guard armed, and its first detection round (part of the start, before
    the device plugin registers) sees the owner's process on its GPUs and takes the loan back."""
    store = FakeLendStore()
    rig = make_rig(tmp_path, store=store)
    lend(rig)
    stale = list(store.lent)
    rig.guard.owner_back(OWNER)
    store.lent = stale  # the write after the release never happened
    rig.agent.stop()
    again = make_rig(tmp_path, store=store, start=False)
    again.backend.run(again.d[0], 4242)  # the owner is back on its GPU
    again.attributor.owner_of[4242] = "owner-cid"
    again.agent.start(serve_metrics=False, loops=False)
    assert again.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE
    assert again.guard.calls == [("arm", OWNER), ("disarm", OWNER)]
    assert store.lent == []


def test_a_replaced_owner_container_is_not_trusted(tmp_path: Path) -> None:
    store = FakeLendStore()
    rig = make_rig(tmp_path, store=store)
    lend(rig)
    rig.agent.stop()
    restarted = pod(OWNER.pod_ref, (("main", "owner-cid-2"),))  # the container was restarted meanwhile
    rig.kube.add_pod(restarted)
    again = restart(rig, tmp_path, store)
    again.agent.on_pod_event(PodEvent(PodEventType.MODIFIED, restarted))
    assert again.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE
    assert not again.guard.is_armed(OWNER)


def test_a_record_for_other_devices_is_not_trusted(tmp_path: Path) -> None:
    store = FakeLendStore([LentOwner(OWNER, (DeviceID("GPU-gone"),), "owner-cid", 1.0)])
    rig = make_rig(tmp_path, store=store)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE
    assert store.lent == []  # the stale record is replaced by what is true now


def test_the_record_is_read_before_it_is_written_and_a_failed_save_is_retried(tmp_path: Path) -> None:
    store = FakeLendStore([LentOwner(OTHER, (DeviceID("GPU-x"),), None, 1.0)])
    rig = make_rig(tmp_path, store=store)
    store.fail_saves = 1
    lend(rig)  # the save fails: lending goes on, an error is counted
    assert rig.agent.metrics.sample("spotgpu_agent_detector_errors_total", {"kind": "state_file"}) == 1
    rig.cycle(1)
    assert [e.owner for e in store.lent] == [OWNER]  # written again at the next chance


def test_record_written_by_the_real_file_adapter_brings_the_loan_back(tmp_path: Path) -> None:
    path = tmp_path / "run" / "agent-state.json"
    rig = make_rig(tmp_path, store=LendStateFile(path))
    lend(rig)
    assert json.loads(path.read_text())["lent"][0]["owner"] == OWNER.format()
    rig.agent.stop()
    again = make_rig(tmp_path, store=LendStateFile(path))
    assert again.agent.solver.state().lend_states[OWNER] is LendState.LENT


# --- what the owners taught the lending model -----------------------------------------------------


def lend_and_return(rig: Rig, idle: float) -> None:
    """Lent after maxInactiveTime, back (guard) ``idle`` seconds after its last activity."""
    lend(rig)
    rig.clock.advance(idle - 61)
    rig.guard.owner_back(OWNER)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.ACTIVE


def test_what_an_owner_taught_the_model_survives_a_restart(tmp_path: Path) -> None:
    for store in (FakeLendStore(), LendStateFile(tmp_path / "run" / "agent-state.json")):
        rig = make_rig(tmp_path, store=store)
        lend_and_return(rig, idle=300)  # a quick return: a strike too
        learned = rig.agent.solver.lending_states()[OWNER]
        assert learned.history.observed == 1 and learned.backoff.strikes == 1
        rig.agent.stop()
        again = make_rig(tmp_path, store=store)
        after = again.agent.solver.lending_states()[OWNER]
        assert after.history == learned.history
        assert after.backoff.strikes == learned.backoff.strikes
        assert abs(after.backoff.at - learned.backoff.at) < 1e-6  # same clock origin in these tests
        again.agent.stop()


def test_a_version_1_record_still_brings_its_loan_back(tmp_path: Path) -> None:
    path = tmp_path / "agent-state.json"
    rig = make_rig(tmp_path, start=False)
    owner = {"owner": OWNER.format(), "devices": [rig.d[0], rig.d[1]], "containerId": "owner-cid", "since": 1.0}
    path.write_text(json.dumps({"version": 1, "lent": [owner]}))
    again = make_rig(tmp_path, store=LendStateFile(path))
    assert again.agent.solver.state().lend_states[OWNER] is LendState.LENT
    assert again.agent.solver.lending_states()[OWNER].history.empty


def test_the_record_stays_small_however_long_the_history(tmp_path: Path) -> None:
    path = tmp_path / "agent-state.json"
    rig = make_rig(tmp_path, store=LendStateFile(path))
    sizes = []
    for _ in range(40):
        lend_and_return(rig, idle=900)
        rig.cycle(1)
        sizes.append(path.stat().st_size)
    assert rig.agent.solver.lending_states()[OWNER].history.observed == 40
    assert max(sizes) < 2500 and sizes[-1] <= sizes[5] + 20  # bounded: the same 32 numbers per owner
