"""The agent's wiring: spotgpu-runtime's service hosted in the agent, the guard's metrics in the
agent's registry, the state dump, the runtime fallback's owner record, start order, and the
eviction's safety nets. Real unix sockets, HTTP and files; ports are in-memory fakes."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.agent.service import Agent
from spotgpu.cli.agent import guard_factory
from spotgpu.core.config import AgentConfig, GuardConfig
from spotgpu.core.configfile import ConfigError
from spotgpu.core.ids import DeviceID
from spotgpu.core.lending import LendState
from spotgpu.core.mapping_cache import MappingSnapshot
from spotgpu.core.refs import PodRef
from spotgpu.runtime import protocol
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.ownerstate import read_owner_state
from spotgpu.runtime.service import RuntimeService
from spotgpu.testing.fakes import FakeGuard

from .helpers import OWNER, Rig, cri_labels, make_rig, pod, spot_alloc


def lend(rig: Rig) -> None:
    rig.cycle(0)
    rig.cycle(61)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.LENT


def hosted(agent: Agent) -> RuntimeService:
    return RuntimeService.for_agent(
        agent.config, RuntimeConfig(), owner_of=agent.owner_of, lendable=agent.lendable, own_plugin_sockets=("x.sock",)
    )


def ask(path: Path, spec: dict[str, object]) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))
        s.sendall(protocol.request("cid", "/bundle", json.dumps(spec).encode()))
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return protocol.parse_response(data)[0]


def test_the_runtime_service_lives_in_the_agent_and_answers_from_its_state(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, runtime_service=hosted)
    service = rig.agent.runtime_service
    assert service is not None and rig.agent.config.runtime_socket.is_socket()
    lookup = service.engine.lookup
    assert lookup.device_owner(rig.d[0]) == OWNER
    assert lookup.device_lendable(rig.d[0]) is False  # the owner is active
    lend(rig)
    assert lookup.device_lendable(rig.d[0]) is True
    assert ask(rig.agent.config.runtime_socket, {"ociVersion": "1.0.2"}) == protocol.UNCHANGED
    exposition = rig.agent.metrics.exposition().decode()
    assert 'spotgpu_agent_runtime_answers_total{answer="unchanged",reason=""} 1.0' in exposition
    rig.agent.stop()
    assert not rig.agent.config.runtime_socket.exists()


def test_the_guard_reports_into_the_agents_registry(tmp_path: Path) -> None:
    metrics = AgentMetrics()
    config = AgentConfig(guard=GuardConfig(listener_path=tmp_path / "l.sock", holder_path=tmp_path / "h.sock"))
    make = guard_factory(config, metrics.registry)
    assert make is not None
    make(lambda owner: None)  # GuardService, not started
    assert b"spotgpu_guard_available" in metrics.exposition()


class LateGuard(FakeGuard):
    """Like GuardService: ``available`` is known only once it started."""

    def __init__(self) -> None:
        super().__init__(available=False)
        self.started = False

    def start(self) -> None:
        self.started, self._available = True, True


def test_the_guard_starts_before_recovery_so_a_lent_owner_is_re_armed(tmp_path: Path) -> None:
    guard = LateGuard()
    rig = make_rig(tmp_path, guard=guard, start=False)
    rig.kube.add_pod(pod(PodRef("spot", "job"), (("worker", "cid-1"),)))
    rig.tasks.add("cid-1", cri_labels(PodRef("spot", "job"), "worker"))
    rig.podres.set([*rig.allocations, spot_alloc(PodRef("spot", "job"), "worker", [rig.d[0]])])
    rig.agent.start(serve_metrics=False, loops=False)
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.LENT
    assert guard.is_armed(OWNER)


def test_state_dump_and_metrics_over_http(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, start=False)
    rig.agent.start(serve_metrics=True, loops=False)
    try:
        lend(rig)
        rig.add_spot("job", [rig.d[0]], "cid-1")
        rig.cycle(1)
        rig.guard.owner_back(OWNER)
        base = f"http://127.0.0.1:{rig.agent.metrics_port}"
        with urllib.request.urlopen(f"http://127.0.0.1:{rig.agent.debug_port}/debug/state", timeout=5) as answer:
            state = json.loads(answer.read())
        assert state["recovered"] is True
        assert state["owners"] == {OWNER.format(): "active"}
        assert MappingSnapshot.from_json(state["mapping"]) == rig.agent.solver.mapping.snapshot()
        assert state["twins"][f"spot-{rig.d[0]}"] == "Unhealthy"
        (eviction,) = state["evictions"]
        assert eviction["victims"] == ["spot/job"] and eviction["reason"] == "OwnerBack"
        assert 0 <= eviction["tasks_stopped_ms"] <= eviction["released_ms"] <= eviction["complete_ms"]
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as answer:
            assert b"spotgpu_agent_evictions_total" in answer.read()
        for path in ("/nothing", "/debug/state"):  # the dump is never on the metrics port
            with pytest.raises(urllib.error.HTTPError) as exc:
                urllib.request.urlopen(f"{base}{path}", timeout=5)
            assert exc.value.code == 404
    finally:
        rig.agent.stop()


def test_the_local_fallbacks_owner_record_follows_the_owners_not_the_users(tmp_path: Path) -> None:
    record = tmp_path / "run" / "owners.json"
    rig = make_rig(tmp_path, owner_record=record)
    owners = read_owner_state(record)
    assert {e.owner for e in owners.owners if e.owner == OWNER} == {OWNER}
    assert all(not d.users for e in owners.owners for d in e.devices)
    written = record.stat().st_mtime_ns
    rig.add_spot("job", [rig.d[2]], "cid-1")  # a new user changes nothing the runtime needs
    rig.cycle(1)
    assert record.stat().st_mtime_ns == written
    rig.podres.set([])  # the owner's pod went away
    rig.cycle(1)
    assert all(e.owner != OWNER for e in read_owner_state(record).owners)


def test_a_failed_first_read_keeps_recovery_for_the_next_refresh(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, start=False)
    spot = PodRef("spot", "job")
    rig.kube.add_pod(pod(spot, (("worker", "cid-1"),)))
    rig.tasks.add("cid-1", cri_labels(spot, "worker"))
    rig.podres.set([*rig.allocations, spot_alloc(spot, "worker", [rig.d[0]])])
    rig.podres.fail_next = 1
    rig.agent.start(serve_metrics=False, loops=False)
    rig.cycle(1)  # the first successful read is still a recovery: the loan is kept, nothing evicted
    assert rig.agent.solver.state().lend_states[OWNER] is LendState.LENT
    assert rig.tasks.stop_calls == []


def test_a_spot_container_newer_than_the_last_refresh_is_evicted_too(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    lend(rig)
    rig.add_spot("early", [rig.d[0]], "cid-early")
    rig.cycle(1)
    rig.add_spot("late", [rig.d[1]], "cid-late")  # pod-resources has it; the agent has not refreshed
    outcome = rig.agent.solver.owner_back(OWNER)
    assert outcome is not None
    assert {v.pod.name for v in outcome.plan.victims} == {"early", "late"}
    assert set(rig.tasks.stop_calls[-1]) == {"cid-early", "cid-late"}


def test_a_victim_without_a_known_container_id_is_found_by_its_labels(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    lend(rig)
    ref = PodRef("spot", "fresh")
    rig.add_pod(pod(ref, (("worker", None),)))  # the API has not reported the container ID yet
    rig.tasks.add("cid-fresh", cri_labels(ref, "worker"))
    rig.allocations.append(spot_alloc(ref, "worker", [rig.d[0]]))
    rig.podres.set(rig.allocations)
    rig.cycle(1)
    rig.guard.owner_back(OWNER)
    assert "cid-fresh" not in rig.tasks.running()


def test_unverified_stops_are_swept_off_the_gpus_and_retried(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    lend(rig)
    rig.add_spot("stuck", [rig.d[0]], "cid-stuck")
    rig.cycle(1)
    rig.tasks.unstoppable.add("cid-stuck")
    swept: list[tuple[tuple[DeviceID, ...], list[PodRef]]] = []

    def sweep(devices: tuple[DeviceID, ...], pods: Sequence[PodRef]) -> tuple[int, int]:
        swept.append((devices, list(pods)))
        return 1, 0

    rig.agent.solver.sweep = sweep
    outcome = rig.agent.solver.owner_back(OWNER)
    assert outcome is not None and outcome.failed_tasks == ("cid-stuck",)
    assert swept == [((rig.d[0], rig.d[1]), [PodRef("spot", "stuck")])]
    assert rig.guard.calls[-1] == ("disarm", OWNER)  # released: the sweep cleared the GPUs
    rig.tasks.unstoppable.clear()
    calls = len(rig.tasks.stop_calls)
    rig.cycle(1)  # the refresh stops it again, through containerd this time
    assert ("cid-stuck",) in rig.tasks.stop_calls[calls:]
    assert "cid-stuck" not in rig.tasks.running()


def test_agent_check_validates_the_runtime_section_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from spotgpu.cli import main

    config = tmp_path / "config.yaml"
    config.write_text("agent:\n  nodeName: n1\nruntime:\n  crossNamespaceSources: [spotgpu-system]\n")
    assert main(["agent", "--config", str(config), "--check"]) == 0
    config.write_text("agent:\n  nodeName: n1\nruntime:\n  lowerRuntimme: runc\n")
    assert main(["agent", "--config", str(config), "--check"]) == 2
    assert "runtime.lowerRuntimme" in capsys.readouterr().err


def _non_loopback_ip() -> str | None:
    """An address of this machine other than loopback (the route a pod on another host would use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))  # no packet is sent: this only picks the outgoing address
        except OSError:
            return None
        ip = str(probe.getsockname()[0])
    return None if ip.startswith("127.") else ip


def test_the_state_dump_listens_on_loopback_only() -> None:
    """``/debug/state`` names every owner and spot pod of the node: it has its own listener, bound
    to 127.0.0.1, never the metrics port (which a Service exposes to every pod)."""
    metrics = AgentMetrics()
    try:
        port = metrics.serve_debug("127.0.0.1:0", lambda: {"owners": {"team-a/train/main": "lent"}})
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/state", timeout=5) as answer:
            assert json.loads(answer.read()) == {"owners": {"team-a/train/main": "lent"}}
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert exc.value.code == 404
        outside = _non_loopback_ip()
        if outside is not None:
            with pytest.raises(OSError), socket.create_connection((outside, port), timeout=2):
                pass
        for address in ("0.0.0.0:0", "192.0.2.2:0", "localhost:0", "[::]:0"):
            with pytest.raises(ConfigError, match="loopback"):
                metrics.serve_debug(address, dict)
    finally:
        metrics.close()


@pytest.mark.parametrize(
    ("fields", "refused"),
    [
        ({"debug_address": "0.0.0.0:9479"}, "must be a loopback address"),
        ({"debug_address": "10.0.0.1:9479"}, "must be a loopback address"),
        ({"debug_address": "127.0.0.1"}, "is not <ip>:<port>"),
        ({"debug_address": "127.0.0.1:9477"}, "metricsAddress's"),
        ({"debug_address": "127.0.0.1:9479"}, None),
        ({"debug_address": "[::1]:9479"}, None),
        ({"debug_address": ""}, None),
    ],
)
def test_the_debug_address_is_loopback_or_none(fields: dict[str, str], refused: str | None) -> None:
    if refused is None:
        AgentConfig(**fields)  # type: ignore[arg-type]
    else:
        with pytest.raises(ConfigError, match=refused):
            AgentConfig(**fields)  # type: ignore[arg-type]


def test_without_a_debug_address_no_dump_is_served(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, start=False, debug_address="")
    rig.agent.start(serve_metrics=True, loops=False)
    try:
        assert rig.agent.debug_port is None and rig.agent.metrics_port is not None
    finally:
        rig.agent.stop()
