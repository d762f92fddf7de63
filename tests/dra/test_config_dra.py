"""``agent.mode: dra`` and ``agent.dra`` in the agent's configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotgpu.cli.agent import served
from spotgpu.core.config import AgentConfig, AgentMode
from spotgpu.core.configfile import ConfigError, from_mapping


def test_dra_mode_and_its_section_parse() -> None:
    config = from_mapping(
        AgentConfig,
        {"mode": "dra", "dra": {"driverName": "gpu.example.com", "cdiDir": "/run/cdi", "podUid": "u-1"}},
    )
    assert config.mode is AgentMode.DRA
    assert (config.dra.driver_name, config.dra.cdi_dir, config.dra.pod_uid) == (
        "gpu.example.com",
        Path("/run/cdi"),
        "u-1",
    )
    assert served(config).startswith("DRA driver gpu.example.com")
    assert from_mapping(AgentConfig, {}).mode is AgentMode.DEVICE_PLUGIN


@pytest.mark.parametrize("name", ["gpu", "GPU.example.com", "-gpu.example.com", "x" * 60 + ".com"])
def test_a_bad_driver_name_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=r"dra\.driverName"):
        from_mapping(AgentConfig, {"dra": {"driverName": name}})


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="mode"):
        from_mapping(AgentConfig, {"mode": "plugin"})
