"""spotgpu-runtime's configuration (the ``runtime`` section of the node configuration file).

Pure apart from :func:`load_runtime_config`, which reads one YAML file. Loaded with the typed
loader of :mod:`spotgpu.core.config`: camelCase keys, key-path errors, unknown keys refused.

Two processes read it: the agent, whose runtime service runs the modifier chain, and the
installer (``spotgpu-runtime install-shim``), which bakes the host-side values (lower runtime,
sockets, guard markers) into the shell fast path. The shared node paths default to the same
values as :class:`~spotgpu.core.config.AgentConfig`; :meth:`RuntimeConfig.with_agent` copies
them from an agent configuration so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Final, Literal

from spotgpu.core.config import AgentConfig
from spotgpu.core.configfile import ConfigError, Seconds, load_yaml_file
from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE, ResourceName, validate_resource_name
from spotgpu.core.refs import PodRef, RefError

DEFAULT_MODIFIERS: Final = ("devices", "replace-mounts", "generic", "cpuset", "guard-rule")
DEFAULT_CONFIG_PATH: Final = Path("/etc/spotgpu/config.yaml")
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

DEFAULT_DENIED_ENV: Final = (
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "NVIDIA_IMEX_CHANNELS",
    "NVIDIA_GDS",
    "NVIDIA_MOFED",
    "NVIDIA_NVSWITCH",
    "NVIDIA_GDRCOPY",
)
"""Every env the NVIDIA container toolkit (``internal/config/image``, ``internal/modifier``) turns
into device nodes: the GPUs (``NVIDIA_VISIBLE_DEVICES``), the MIG config and monitor devices,
IMEX channels (``NVIDIA_IMEX_CHANNELS``, created on the host by the hook), and, with any GPU
requested, the gated devices ``NVIDIA_GDS``, ``NVIDIA_MOFED``, ``NVIDIA_NVSWITCH``,
``NVIDIA_GDRCOPY`` (``=enabled``). Not listed: ``NVIDIA_DRIVER_CAPABILITIES`` (which driver
libraries are mounted for the GPUs selected; it selects no device, CUDA images set it, and spot
work on synced GPUs needs it), ``NVIDIA_REQUIRE_*``/``NVIDIA_DISABLE_REQUIRE`` (checks), and
``CUDA_VISIBLE_DEVICES``, which the CUDA library inside the container reads to narrow the devices
it already has: no runtime turns it into a device, so it cannot widen a container's access."""


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """How spotgpu-runtime modifies specs; YAML section ``runtime``."""

    lower_runtime: str = "runc"
    """The runtime that really creates containers: ``runc`` (default), ``nvidia-container-runtime``
    or ``crun``; a name looked up on ``PATH`` at install time, or an absolute path."""
    agent_socket: Path = Path("/run/spotgpu/agent.sock")
    """The agent's runtime service (host path; the agent mounts its directory at the same path)."""
    agent_timeout: Seconds = Seconds(10.0)
    """How long one ``create`` waits for the agent before failing (the kubelet retries)."""
    fallback: Literal["none", "local"] = "none"
    """When the agent is unreachable: ``none`` fails a sync; ``local`` runs the modifier chain
    inside the wrapper (imports gRPC, about 0.1 s; needs the full spotgpu package on the host)."""
    spot_resource: ResourceName = SPOT_GPU_RESOURCE
    gpu_resources: tuple[ResourceName, ...] = (NVIDIA_GPU_RESOURCE,)
    """Resources whose holders are GPU owners (guard rule) and whose devices may be synced."""
    cross_namespace_sources: tuple[str, ...] = ("*",)
    """Namespaces a sync source may live in besides the spot pod's own; ``"*"`` (the default)
    allows any, because the twin and owner rules already tie every synced device to the
    kubelet's grant and the agent's loan. List namespaces to narrow which owners may lend to
    pods of other namespaces (e.g. only a ShadowPod namespace)."""
    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    device_plugin_sockets: dict[str, str] = dataclasses.field(default_factory=dict)
    """Resource -> socket file name in ``devicePluginDir`` (``nvidia.com/gpu: nvidia-gpu.sock``).
    Without an entry the conventional ``<vendor>-<name>.sock`` is tried, then (if
    ``probeDevicePlugins``) each socket's ListAndWatch device list."""
    probe_device_plugins: bool = True
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    kubelet_timeout: Seconds = Seconds(5.0)
    owner_state_file: Path = Path("/run/spotgpu/owners.json")
    """The agent's owner record for ``fallback: local`` (written atomically by the agent)."""
    modifiers: tuple[str, ...] = DEFAULT_MODIFIERS
    """The modifier chain, in order (names from :data:`spotgpu.runtime.modifiers.MODIFIERS`)."""
    guard_enabled: bool = True
    guard_listener_path: Path = Path("/run/spotgpu/guard.sock")
    """The guard's seccomp listener (host path, injected into owner specs)."""
    owner_markers: tuple[str, ...] = ("NVIDIA_VISIBLE_DEVICES", "/dev/nvidia")
    """Substrings that make the shell fast path ask the agent whether a container is a GPU owner
    (only while the guard's listener exists). False positives cost one agent round trip."""
    denied_env: tuple[str, ...] = DEFAULT_DENIED_ENV
    """Names that select devices for the lower runtime: the annotation env (Generic) may never set
    them, and they are stripped from the own env of every container that is not an allocated GPU
    holder (:mod:`spotgpu.runtime.sanitize`). Names a device sync sets are refused too. Default:
    :data:`DEFAULT_DENIED_ENV`; add the ``swarm-resource`` names if the node's toolkit sets one."""
    env_selects_devices: bool | None = None
    """Whether the lower runtime turns ``deniedEnv`` entries into devices; then every ``create``
    whose spec sets one is checked by the agent (fail closed). ``null`` (default): true when the
    lower runtime's file name starts with ``nvidia`` (nvidia-container-runtime)."""

    def __post_init__(self) -> None:
        if not self.lower_runtime.strip():
            raise ConfigError("lowerRuntime: must not be empty")
        if self.agent_timeout <= 0:
            raise ConfigError("agentTimeout: must be greater than zero")
        if self.kubelet_timeout <= 0:
            raise ConfigError("kubeletTimeout: must be greater than zero")
        validate_resource_name(self.spot_resource)
        for resource in self.gpu_resources:
            try:
                validate_resource_name(resource)
            except ValueError as exc:
                raise ConfigError(f"gpuResources: {exc}") from None
        if self.spot_resource in self.gpu_resources:
            raise ConfigError("gpuResources: must not contain the spot resource")
        for namespace in self.cross_namespace_sources:
            if namespace == "*":
                continue
            try:
                PodRef(namespace, "probe")
            except RefError as exc:
                raise ConfigError(f"crossNamespaceSources: {exc}") from None
        for name, socket in self.device_plugin_sockets.items():
            if "/" in socket or socket in ("", ".", ".."):
                raise ConfigError(f"devicePluginSockets.{name}: {socket!r} must be a file name in devicePluginDir")
        for name in self.denied_env:
            if _ENV_NAME.fullmatch(name) is None:
                raise ConfigError(f"deniedEnv: {name!r} is not an environment variable name")
        if any(not m or "'" in m or "\n" in m for m in self.owner_markers):
            raise ConfigError("ownerMarkers: entries must be non-empty and contain no quote or newline")
        for path_field in ("agent_socket", "guard_listener_path", "pod_resources_socket", "device_plugin_dir"):
            path = getattr(self, path_field)
            if not path.is_absolute() or "'" in str(path):
                raise ConfigError(f"{path_field}: {str(path)!r} must be an absolute path without quotes")
        if "'" in self.lower_runtime:
            raise ConfigError("lowerRuntime: must not contain quotes")
        from spotgpu.runtime.modifiers import MODIFIERS

        for name in self.modifiers:
            if name not in MODIFIERS:
                raise ConfigError(f"modifiers: unknown modifier {name!r}; known: {', '.join(MODIFIERS.names())}")
        if len(set(self.modifiers)) != len(self.modifiers):
            raise ConfigError("modifiers: a modifier is listed twice")

    @property
    def env_markers(self) -> tuple[str, ...]:
        """What marks a spec entry setting a denied env (``"NVIDIA_VISIBLE_DEVICES=``), when the
        lower runtime turns such env into devices; else none (runc ignores it). With
        ``NVIDIA_VISIBLE_DEVICES`` denied, ``"CUDA_VERSION=`` too: on a legacy CUDA image the
        variable's absence selects every GPU (:func:`spotgpu.runtime.sanitize.selects_all_when_unset`)."""
        selects = self.env_selects_devices
        if selects is None:
            selects = Path(self.lower_runtime).name.startswith("nvidia")
        if not selects:
            return ()
        legacy = ('"CUDA_VERSION=',) if "NVIDIA_VISIBLE_DEVICES" in self.denied_env else ()
        return (*(f'"{name}=' for name in self.denied_env), *legacy)

    def with_agent(self, agent: AgentConfig) -> RuntimeConfig:
        """This configuration with the node paths and resources the agent uses."""
        return dataclasses.replace(
            self,
            agent_socket=agent.runtime_socket,
            spot_resource=agent.spot_resource,
            gpu_resources=self.gpu_resources if agent.gpu_resource in self.gpu_resources else (agent.gpu_resource,),
            device_plugin_dir=agent.device_plugin_dir,
            pod_resources_socket=agent.pod_resources_socket,
            guard_enabled=self.guard_enabled and agent.guard.enabled,
            guard_listener_path=agent.guard.listener_path,
        )


def load_runtime_config(path: Path, section: str = "runtime") -> RuntimeConfig:
    """Load :class:`RuntimeConfig` from ``section`` of a YAML file (a missing section: defaults)."""
    return load_yaml_file(path, RuntimeConfig, section=section)


__all__ = ["DEFAULT_CONFIG_PATH", "DEFAULT_DENIED_ENV", "DEFAULT_MODIFIERS", "RuntimeConfig", "load_runtime_config"]
