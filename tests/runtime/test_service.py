"""The runtime service's socket, the host adapter, configuration, the owner record and the installer.

Real unix sockets, real files, the host's ``/dev/null``; the engine behind the service runs on
the fakes of :mod:`fakes`.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core.config import AgentConfig, GuardConfig
from spotgpu.core.configfile import ConfigError
from spotgpu.core.errors import PermanentError, TemporaryError
from spotgpu.core.ids import DeviceID
from spotgpu.core.mapping_cache import IDLE_SPACE, MappingCache
from spotgpu.runtime import protocol
from spotgpu.runtime.config import RuntimeConfig, load_runtime_config
from spotgpu.runtime.main import main as runtime_main
from spotgpu.runtime.node import LinuxHost
from spotgpu.runtime.ownerstate import OwnerStateFile, write_owner_state
from spotgpu.runtime.service import RuntimeService
from spotgpu.runtime.shim import WRAPPER_FILES, install_shim

from .fakes import OWNER, engine, spot_spec


def exchange(path: Path, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_service_socket_is_root_only_and_answers_concurrently(tmp_path: Path) -> None:
    path = tmp_path / "run" / "agent.sock"
    request = protocol.request(
        "c", "/b", json.dumps(spot_spec({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}})).encode()
    )
    with RuntimeService(path, engine()):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        answers: list[bytes] = []
        threads = [threading.Thread(target=lambda: answers.append(exchange(path, request))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(answers) == 8 and all(protocol.parse_response(a)[0] == protocol.MODIFIED for a in answers)
        assert protocol.parse_response(exchange(path, b"junk"))[0] == protocol.REFUSED
        assert exchange(path, b"") == b""  # a readiness probe
    assert not path.exists()


def test_service_replaces_a_stale_socket_but_not_a_live_one(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()
    with RuntimeService(path, engine()), pytest.raises(TemporaryError, match="already serves"):
        RuntimeService(path, engine()).start()
    path.write_text("not a socket")
    with pytest.raises(TemporaryError, match="not a socket"):
        RuntimeService(path, engine()).start()


@given(st.binary(max_size=300))
def test_protocol_decoding_never_crashes(data: bytes) -> None:
    try:
        protocol.parse_request(data)
    except protocol.ProtocolError as exc:
        assert str(exc)


@given(st.lists(st.binary(max_size=50), min_size=1, max_size=5))
def test_netstrings_round_trip(fields: list[bytes]) -> None:
    assert protocol.decode(protocol.encode(*fields), len(fields)) == fields


# --- host adapter -----------------------------------------------------------------------------------


def test_host_device_nodes_and_numa(tmp_path: Path) -> None:
    host = LinuxHost(sys_root=tmp_path / "sys")
    (null,) = host.device_nodes("/dev/null", "/dev/nvidia0")
    assert (null.container_path, null.type, null.major, null.minor) == ("/dev/nvidia0", "c", 1, 3)
    tree = tmp_path / "dri"
    (tree / "by-path").mkdir(parents=True)
    (tree / "card0").symlink_to("/dev/null")
    (tree / "by-path" / "x").symlink_to("/dev/zero")
    (tree / "readme").write_text("not a device")
    nodes = host.device_nodes(str(tree), "/dev/dri")
    assert [(n.container_path, n.minor) for n in nodes] == [("/dev/dri/card0", 3), ("/dev/dri/by-path/x", 5)]
    with pytest.raises(PermanentError, match="No such file"):
        host.device_nodes(str(tmp_path / "absent"), "/dev/x")
    with pytest.raises(PermanentError, match="neither a device"):
        host.device_nodes(str(tree / "readme"), "/dev/x")
    node = tmp_path / "sys" / "devices" / "system" / "node" / "node1"
    node.mkdir(parents=True)
    (node / "cpulist").write_text("8-15,24-31\n")
    assert host.numa_cpus(1) == "8-15,24-31" and host.numa_cpus(0) is None


# --- configuration -------------------------------------------------------------------------------------


def test_runtime_config_loads_from_its_section(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "agent:\n  detectInterval: 5s\nruntime:\n  lowerRuntime: nvidia-container-runtime\n"
        "  crossNamespaceSources: [spotgpu-system]\n  devicePluginSockets: {nvidia.com/gpu: nvidia-gpu.sock}\n"
        "  agentTimeout: 3s\n  fallback: local\n"
    )
    config = load_runtime_config(path)
    assert config.lower_runtime == "nvidia-container-runtime" and config.agent_timeout == 3.0
    assert config.cross_namespace_sources == ("spotgpu-system",) and config.fallback == "local"
    assert config.device_plugin_sockets == {"nvidia.com/gpu": "nvidia-gpu.sock"}


@pytest.mark.parametrize(
    ("yaml", "text"),
    [
        ("runtime:\n  lowerRuntim: runc\n", "did you mean 'lowerRuntime'"),
        ("runtime:\n  modifiers: [devices, gpu-magic]\n", "unknown modifier 'gpu-magic'"),
        ("runtime:\n  crossNamespaceSources: [Bad_NS]\n", "crossNamespaceSources"),
        ("runtime:\n  gpuResources: [platform/spot-gpu]\n", "must not contain the spot resource"),
        ("runtime:\n  devicePluginSockets: {nvidia.com/gpu: ../x.sock}\n", "must be a file name"),
        ("runtime:\n  fallback: remote\n", "is not one of"),
        ("runtime:\n  deniedEnv: ['A=B']\n", "not an environment variable name"),
        ("runtime:\n  agentSocket: relative.sock\n", "absolute path"),
    ],
)
def test_runtime_config_errors_name_the_key(tmp_path: Path, yaml: str, text: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml)
    with pytest.raises(ConfigError, match=text):
        load_runtime_config(path)


def test_with_agent_copies_the_shared_node_paths() -> None:
    agent = AgentConfig(
        runtime_socket=Path("/run/x/agent.sock"), guard=GuardConfig(listener_path=Path("/run/x/g.sock"))
    )
    config = RuntimeConfig().with_agent(agent)
    assert config.agent_socket == Path("/run/x/agent.sock") and config.guard_listener_path == Path("/run/x/g.sock")
    assert config.device_plugin_dir == agent.device_plugin_dir and config.spot_resource == agent.spot_resource


# --- owner record ---------------------------------------------------------------------------------------


def test_owner_record_round_trip(tmp_path: Path) -> None:
    cache = MappingCache()
    cache.create(OWNER, ["GPU-a"])
    cache.create(IDLE_SPACE, ["GPU-d"])
    path = tmp_path / "spotgpu" / "owners.json"
    write_owner_state(path, cache.snapshot())
    assert sorted(p.name for p in path.parent.iterdir()) == ["owners.json"]
    owners = OwnerStateFile(path)
    assert owners.owner_of(DeviceID("GPU-a")) == OWNER and owners.owner_of(DeviceID("GPU-d")) is IDLE_SPACE
    assert owners.owner_of(DeviceID("GPU-x")) is None
    with pytest.raises(TemporaryError, match="owner record"):
        OwnerStateFile(tmp_path / "absent.json").owner_of(DeviceID("GPU-a"))


# --- installer and console script --------------------------------------------------------------------


def test_install_shim_writes_a_self_contained_fast_path(tmp_path: Path) -> None:
    config = RuntimeConfig(agent_socket=tmp_path / "agent.sock", guard_listener_path=tmp_path / "g.sock")
    script = install_shim(tmp_path / "opt", config, python="/usr/bin/python3")
    assert os.access(script, os.X_OK)
    assert sorted(
        str(p.relative_to(tmp_path / "opt" / "lib")) for p in (tmp_path / "opt" / "lib").rglob("*.py")
    ) == sorted(WRAPPER_FILES)
    text = script.read_text()
    assert text.startswith("#!/bin/sh\n") and "exec '/usr/bin/python3' -I -S -c" in text
    subprocess.run(["sh", "-n", str(script)], check=True)
    assert subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True).stdout.startswith(
        "runc version"
    )


def test_console_script_help_and_print(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert runtime_main(["--help"]) == 0
    assert "install-shim" in capsys.readouterr().out
    config = tmp_path / "c.yaml"
    config.write_text("runtime:\n  lowerRuntime: /usr/sbin/runc\n")
    assert runtime_main(["install-shim", "--config", str(config), "--print", "--dest", "/opt/x"]) == 0
    out = capsys.readouterr().out
    assert "lower='/usr/sbin/runc'" in out and '"/opt/x/lib"' in out
    config.write_text("runtime:\n  lowerRuntime: no-such-runtime-here\n")
    assert runtime_main(["install-shim", "--config", str(config), "--dest", str(tmp_path / "d")]) == 1
    assert "not on PATH" in capsys.readouterr().err
