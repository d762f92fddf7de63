"""Typed configuration: durations, the agent's YAML, and errors that name the key."""

from __future__ import annotations

import dataclasses
from enum import StrEnum
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.core.config import AgentConfig, UtilizationSource
from spotgpu.core.configfile import ConfigError, Seconds, camel, from_mapping, load_yaml_file, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10s", 10),
        ("5m", 300),
        ("1h30m", 5400),
        ("250ms", 0.25),
        ("1.5s", 1.5),
        (3, 3),
        (0.5, 0.5),
        ("7", 7),
        ("2h", 7200),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("abc", "is not a duration"),
        ("5 minutes", "is not a duration"),
        (-1, "not negative"),
        (True, "got True"),
        ("", "got ''"),
        (float("inf"), "finite"),
    ],
)
def test_bad_durations(text: object, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(text, "agent.detectInterval")
    assert str(info.value).startswith("agent.detectInterval: ")
    assert fragment in str(info.value)


@given(st.integers(0, 100), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999))
def test_duration_composition(h: int, m: int, s: int, ms: int) -> None:
    assert parse_duration(f"{h}h{m}m{s}s{ms}ms") == pytest.approx(h * 3600 + m * 60 + s + ms / 1000)


def test_camel() -> None:
    assert camel("max_inactive_time") == "maxInactiveTime"
    assert camel("guard") == "guard"


def test_agent_config_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        """
agent:
  nodeName: gpu-node-1
  detectInterval: 5s
  maxInactiveTime: 10m
  utilizationSource: exporter
  exporters:
    - {vendor: nvidia, url: "http://127.0.0.1:9400/metrics", timeout: 500ms}
  guard:
    failOpenTimeout: 2s
    listenerPath: /run/x/guard.sock
"""
    )
    config = load_yaml_file(path, AgentConfig, "agent")
    assert config.node_name == "gpu-node-1"
    assert config.detect_interval == 5 and config.max_inactive_time == 600
    assert config.utilization_source is UtilizationSource.EXPORTER
    assert config.exporters[0].timeout == 0.5
    assert config.guard.fail_open_timeout == 2
    assert config.guard.listener_path == Path("/run/x/guard.sock")
    assert config.guard.enabled is True
    assert config.kubelet_socket == Path("/var/lib/kubelet/device-plugins/kubelet.sock")


def test_defaults_from_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_yaml_file(path, AgentConfig, "agent") == AgentConfig()


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("agent: {detectInterval: soon}", "agent.detectInterval: 'soon' is not a duration"),
        ("agent: {maxInactiveTim: 5m}", "agent.maxInactiveTim: unknown key; did you mean 'maxInactiveTime'?"),
        ("agent: {guard: {failOpenTimeout: 0}}", "agent.guard: guard.failOpenTimeout: must be greater than zero"),
        ("agent: {guard: {enabled: yes please}}", "agent.guard.enabled: expected true or false"),
        ("agent: {exporters: [{vendor: nvidia}]}", "agent.exporters[0].url: required key is missing"),
        (
            "agent: {exporters: [{vendor: nvidia, url: 'ftp://x'}]}",
            "agent.exporters[0]: url: 'ftp://x' must start with",
        ),
        ("agent: {utilizationSource: dcgm}", "agent.utilizationSource: 'dcgm' is not one of 'nvml', 'exporter'"),
        ("agent: {utilizationSource: exporter}", "agent: exporters: utilizationSource is 'exporter' but no exporter"),
        ("agent: {gpuResource: gpu}", "agent.gpuResource: resource name 'gpu' must have a domain prefix"),
        (
            "agent: {detectInterval: 10m, maxInactiveTime: 1m}",
            "agent: maxInactiveTime: 60s is shorter than detectInterval",
        ),
        ("agent: {exporters: {vendor: x}}", "agent.exporters: expected a list, got dict"),
        ("agent: [1, 2]", "agent: expected a mapping, got list"),
        ("agent: {containerdNamespace: 3}", "agent.containerdNamespace: expected a string, got 3"),
        ("agent: {devicePluginDir: null}", "agent.devicePluginDir: must not be null"),
        ("agent: {", "not valid YAML"),
        (
            "agent: {lending: {unguardedPolicy: maybe}}",
            "agent.lending.unguardedPolicy: 'maybe' is not one of 'refuse', 'pollOnly'",
        ),
        ("agent: {lending: {policy: magic}}", "agent.lending.policy: 'magic' is not one of 'timer', 'predictive'"),
        ("agent: {lending: {predictive: {priorWeight: 0}}}", "agent.lending.predictive: priorWeight: must be within"),
        ("agent: {lending: {predictive: {minExpectedIdle: soon}}}", "agent.lending.predictive.minExpectedIdle:"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_yaml_file(path, AgentConfig, "agent")
    assert message in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration"):
        load_yaml_file(tmp_path / "nope.yaml", AgentConfig)


class Color(StrEnum):
    RED = "red"


@dataclasses.dataclass(frozen=True, slots=True)
class Everything:
    count: int
    ratio: float = 1.0
    mode: Literal["a", "b"] = "a"
    color: Color = Color.RED
    names: tuple[str, ...] = ()
    limits: dict[str, int] = dataclasses.field(default_factory=dict)
    maybe: Seconds | None = None


def test_generic_loader_types() -> None:
    value = from_mapping(
        Everything, {"count": 2, "ratio": 3, "mode": "b", "names": ["x"], "limits": {"a": 1}, "maybe": "1m"}
    )
    assert value == Everything(2, 3.0, "b", Color.RED, ("x",), {"a": 1}, Seconds(60.0))
    assert from_mapping(Everything, {"count": 1, "maybe": None}).maybe is None
    for data, fragment in [
        ({"count": True}, "count: expected an integer, got True"),
        ({"count": 1, "ratio": "x"}, "ratio: expected a number"),
        ({"count": 1, "mode": "c"}, "mode: 'c' is not one of 'a', 'b'"),
        ({"count": 1, "limits": {"a": "x"}}, "limits.a: expected an integer"),
        ({}, "count: required key is missing"),
    ]:
        with pytest.raises(ConfigError) as info:
            from_mapping(Everything, data)
        assert fragment in str(info.value)
