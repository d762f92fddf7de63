"""NRI mode's configuration (the ``nri`` section of the node configuration file).

Pure apart from :func:`load_nri_config` (one YAML file). ``enabled: true`` makes the agent
connect to the runtime's NRI socket and make spotgpu-runtime's decisions at CreateContainer
(:mod:`spotgpu.nri.host`); the chart's ``agent.runtime.mode: nri`` sets it.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Final

from spotgpu.core.configfile import ConfigError, Seconds, load_yaml_file

DEFAULT_SOCKET: Final = Path("/var/run/nri/nri.sock")
_INDEX: Final = re.compile(r"[0-9]{2}")
_NAME: Final = re.compile(r"[a-z0-9][a-z0-9._-]*")


@dataclasses.dataclass(frozen=True, slots=True)
class NriConfig:
    """YAML section ``nri``."""

    enabled: bool = False
    socket_path: Path = DEFAULT_SOCKET
    """The runtime's NRI socket (containerd 2.x and CRI-O default), a host path the agent mounts."""
    plugin_name: str = "spotgpu"
    plugin_index: str = "50"
    """Two digits; plugins are called in ascending order (later ones see our adjustment)."""
    call_timeout: Seconds = Seconds(5.0)
    """How long registration may take."""

    def __post_init__(self) -> None:
        if not self.socket_path.is_absolute():
            raise ConfigError(f"socketPath: {str(self.socket_path)!r} must be an absolute path")
        if _INDEX.fullmatch(self.plugin_index) is None:
            raise ConfigError(f"pluginIndex: {self.plugin_index!r} must be exactly two digits (NRI refuses others)")
        if _NAME.fullmatch(self.plugin_name) is None:
            raise ConfigError(f"pluginName: {self.plugin_name!r} must be lower-case letters, digits, '.', '_', '-'")
        if self.call_timeout <= 0:
            raise ConfigError("callTimeout: must be greater than zero")


def load_nri_config(path: Path, section: str = "nri") -> NriConfig:
    """:class:`NriConfig` from ``section`` of a YAML file (a missing section: NRI off)."""
    return load_yaml_file(path, NriConfig, section=section)


__all__ = ["DEFAULT_SOCKET", "NriConfig", "load_nri_config"]
