"""The ``local`` fallback: the modifier chain inside the wrapper when the agent cannot be reached.

Decides nothing itself. Side effects: reads the runtime configuration and the agent's owner
record file, and makes the kubelet gRPC calls of one ``create``. Needs the full spotgpu
package and gRPC importable on the host (``runtime.fallback: local``); costs about 0.1 s of
imports per use, which is why it is only a fallback (docs/runtime.md).
"""

from __future__ import annotations

from pathlib import Path

from spotgpu.core.errors import SpotgpuError
from spotgpu.runtime import protocol
from spotgpu.runtime.config import RuntimeConfig, load_runtime_config
from spotgpu.runtime.engine import SpecEngine
from spotgpu.runtime.node import KubeletNodeLookup, LinuxHost
from spotgpu.runtime.ownerstate import OwnerStateFile


def modify_locally(config_path: str, container_id: str, bundle: str, spec: bytes) -> tuple[bytes, bytes]:
    """One wire-protocol answer computed in this process: ``(status, body)``."""
    try:
        config = load_runtime_config(Path(config_path)) if config_path else RuntimeConfig()
    except SpotgpuError as exc:
        return protocol.RETRY, f"local fallback: {exc}".encode()
    lookup = KubeletNodeLookup.from_config(config, OwnerStateFile(config.owner_state_file).owner_of)
    try:
        return SpecEngine(config, lookup, LinuxHost()).handle(container_id, bundle, spec)
    finally:
        lookup.close()


__all__ = ["modify_locally"]
