"""The node agent's configuration, loaded from YAML by :mod:`spotgpu.core.configfile`.

The node agent's configuration (:class:`AgentConfig`) lives here because the agent, the guard,
spotgpu-runtime and the node end-to-end harness all read it.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import re
from pathlib import Path
from typing import Final

from spotgpu.core.configfile import ConfigError, Seconds
from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import (
    NVIDIA_GPU_RESOURCE,
    SHARED_SUFFIX,
    SPOT_GPU_RESOURCE,
    ResourceName,
    shared_resource_of,
    validate_resource_name,
)
from spotgpu.core.keys import DEFAULT_SHADOW_NAMESPACE

# --- the node agent's configuration -----------------------------------------------------------


class UtilizationSource(enum.StrEnum):
    NVML = "nvml"
    EXPORTER = "exporter"


@dataclasses.dataclass(frozen=True, slots=True)
class ExporterEndpoint:
    """One vendor exporter to scrape (Prometheus text over HTTP)."""

    vendor: str
    url: str
    timeout: Seconds = Seconds(2.0)

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"url: {self.url!r} must start with http:// or https://")


class GpuBackendKind(enum.StrEnum):
    NVML = "nvml"
    """NVIDIA GPUs through NVML (nvidia-ml-py)."""
    DEVNODE = "devnode"
    """GPUs given as device nodes (``deviceNodes``); processes found through ``/proc/*/fd``."""


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceNodeConfig:
    """One GPU of the ``devnode`` backend: the vendor plugin's device ID and its device node."""

    id: str
    path: Path
    index: int
    numa_node: int | None = None
    container_paths: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class GuardConfig:
    """The return guard (seccomp user notification) of the agent."""

    enabled: bool = True
    listener_path: Path = Path("/run/spotgpu/guard.sock")
    """The ``listenerPath`` runc connects to; injected into owner specs by spotgpu-runtime."""
    holder_path: Path = Path("/run/spotgpu/fd-holder.sock")
    """Control socket of the fd holder that keeps notify fds across agent restarts."""
    fail_open_timeout: Seconds = Seconds(5.0)
    """A held owner call is released after this long even if eviction has not finished."""
    holder_timeout: Seconds = Seconds(3.0)
    """The fd holder takes the notify fds back from a guard that sent nothing for this long
    (the guard pings every quarter of it); bounds how long a hung agent can hold a call."""
    runtime_binary: str = "runc"
    """Low-level runtime whose ``--version`` must show runc >= 1.1 with libseccomp >= 2.5;
    empty skips that check (the operator vouches for it)."""
    handover_timeout: Seconds = Seconds(60.0)
    """How long an fd holder asked to stop (SIGTERM) keeps serving while it waits for a
    successor holder to take its notify fds; keep it below the holder pod's
    ``terminationGracePeriodSeconds``."""

    def __post_init__(self) -> None:
        if self.fail_open_timeout <= 0:
            raise ConfigError("guard.failOpenTimeout: must be greater than zero")
        if self.holder_timeout <= 0:
            raise ConfigError("guard.holderTimeout: must be greater than zero")
        if self.handover_timeout <= 0:
            raise ConfigError("guard.handoverTimeout: must be greater than zero")


class LendPolicyKind(enum.StrEnum):
    """When an idle owner's GPUs are lent (:mod:`spotgpu.core.lending`)."""

    TIMER = "timer"
    """After ``maxInactiveTime`` without activity (the fixed timer)."""
    PREDICTIVE = "predictive"
    """After ``maxInactiveTime``, and only when the owner's learned idle durations promise at
    least ``predictive.minExpectedIdle`` more idle time; owners whose loans ended quickly are
    backed off."""


class UnguardedPolicy(enum.StrEnum):
    """What to do with an owner the return guard does not cover (no notify fd of it held)."""

    REFUSE = "refuse"
    """Never lend it; a loan whose coverage is lost ends (its spot work is evicted)."""
    POLL_ONLY = "pollOnly"
    """Lend it anyway; its return is caught by polling only (see docs/agent.md for the exposure)."""


@dataclasses.dataclass(frozen=True, slots=True)
class PredictiveConfig:
    """The owner-return model (:mod:`spotgpu.core.idle_forecast`) and the predictive policy's
    thresholds. The model learns under every policy (the node's idle forecast comes from it);
    ``minExpectedIdle`` and the backoff only gate lending under the ``predictive`` policy."""

    min_expected_idle: Seconds = Seconds(1800.0)
    """Lend only when the expected rest of the current idle period is at least this long."""
    min_likely_idle: Seconds = Seconds(1200.0)
    """... and when 80% of such idle periods last at least this much longer (the forecast's
    ``p20``); 0: no such condition. The mean is dominated by long idle periods (nights), this
    quantile by the common short ones."""
    prior_mean: Seconds = Seconds(7200.0)
    """Mean idle duration of the prior (exponential) a new owner starts from."""
    prior_weight: float = 1.0
    """How many observed idle periods the prior counts as."""
    memory: float = 20.0
    """Idle periods the model remembers: each new one scales the older ones by ``1 - 1/memory``."""
    quick_return: Seconds = Seconds(600.0)
    """A loan that ended sooner than this counts as a strike against the owner."""
    backoff_step: Seconds = Seconds(600.0)
    """Extra idle time required per strike before the owner is lent again."""
    backoff_max: Seconds = Seconds(7200.0)
    """Cap on the extra idle time the strikes require."""
    backoff_half_life: Seconds = Seconds(21600.0)
    """Strikes halve after this long (and at every loan that lasted ``quickReturn`` or longer)."""

    def __post_init__(self) -> None:
        if self.prior_mean <= 0:
            raise ConfigError("priorMean: must be greater than zero")
        if not 0 < self.prior_weight <= 1000:
            raise ConfigError(f"priorWeight: must be within (0, 1000], got {self.prior_weight}")
        if not 1 <= self.memory <= 10_000:
            raise ConfigError(f"memory: must be within 1..10000 idle periods, got {self.memory}")
        if self.backoff_half_life <= 0:
            raise ConfigError("backoffHalfLife: must be greater than zero")


@dataclasses.dataclass(frozen=True, slots=True)
class LendingConfig:
    """``agent.lending``: the lending policy (docs/agent.md, "The lending state machine")."""

    policy: LendPolicyKind = LendPolicyKind.PREDICTIVE
    unguarded_policy: UnguardedPolicy = UnguardedPolicy.REFUSE
    predictive: PredictiveConfig = dataclasses.field(default_factory=PredictiveConfig)


@dataclasses.dataclass(frozen=True, slots=True)
class ControlDeviceConfig:
    """One shared control device node every GPU container gets (``nvidiactl``, ``nvidia-uvm``)."""

    path: Path
    container_paths: tuple[str, ...] = ()
    """Further paths it has inside containers (NVIDIA keeps the host path)."""


NVIDIA_CONTROL_DEVICES: Final = tuple(
    ControlDeviceConfig(Path(p))
    for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
)


@dataclasses.dataclass(frozen=True, slots=True)
class ReleaseCheckConfig:
    """``agent.eviction.releaseCheck``: the release invariant (docs/security.md): before a
    returning owner's call is released, no process outside the owner's pod holds a device node
    of its GPUs; every process of an evicted pod is gone (:mod:`spotgpu.core.holders`)."""

    enabled: bool = True
    """``false`` releases the owner once the spot tasks are stopped, without looking for other
    holders (the earlier behaviour: a GPU fd passed to another pod survives the return)."""
    cgroup_mount: Path = Path("/sys/fs/cgroup")
    """The host's cgroup tree (v2: its mount; v1: the folder of the hierarchies); the chart
    mounts the host's over the pod's own, which may show only its cgroup namespace."""
    cgroup_roots: tuple[str, ...] = ("kubepods.slice", "kubepods")
    """The kubelet's pod cgroups, relative to the cgroup v2 mount or a v1 hierarchy: both cgroup
    drivers' names by default. Only processes below them are looked at."""
    control_devices: tuple[ControlDeviceConfig, ...] = NVIDIA_CONTROL_DEVICES
    """Shared control nodes: a pod holding one must hold some GPU of the node."""
    exempt_namespaces: tuple[str, ...] = ()
    """Namespaces whose pods may hold GPUs they were not allocated (a DCGM exporter, a vendor
    device plugin running as pods). Tenants must not be able to create pods there."""
    watch_interval: Seconds = Seconds(5.0)
    """Between returns, the holder watch (:mod:`spotgpu.agent.holderwatch`) looks this often at
    the GPUs lent now or lately for processes that hold one without right (a passed fd received
    after a release); 0 turns it off."""
    watch_window: Seconds = Seconds(600.0)
    """How long after its last loan an owner's GPUs stay watched."""


@dataclasses.dataclass(frozen=True, slots=True)
class EvictionConfig:
    """``agent.eviction``: how the return path stops spot work (docs/agent.md, "The return path
    on a busy node"). Every switch defaults to the measured fastest safe choice; turning one
    off restores the earlier behaviour of that step."""

    realtime: bool = True
    """Run the threads a returning owner waits on (the guard's notification thread, the handler
    threads it starts, the eviction executor) at ``SCHED_RR`` 10; when the kernel refuses (no
    ``CAP_SYS_NICE``) that is logged and they run at nice -10, or normal priority. ``false``:
    normal priority."""
    pin_pidfds: bool = True
    """Pin a pidfd of every spot container's init (and, for a container that shares a PID
    namespace, of each of its processes) while its GPU is lent, so the kill on a return needs
    no containerd call first; ``false``: the init PIDs are asked from containerd on the return."""
    verify_by_pidfd: bool = True
    """Verify a stop by the processes' pidfds turning readable (the kernel's exit: every file,
    the GPU's among them, closed) and tell containerd after the owner's release; ``false``:
    wait for containerd's ``Wait`` answer of every task before the release."""
    boost_cpu: bool = True
    """Raise the CPU weight (``cpu.shares``/``cpu.weight``, ``cpu.idle`` 0) of the killed spot
    containers' cgroups and their ancestors from the kill until their stops are verified: a
    dying process must still run to exit, and a spot pod's cgroups otherwise get the smallest
    share of a busy node (:mod:`spotgpu.util.cpuboost`); ``false``: weights untouched."""
    hold_mount_ns: bool = True
    """Hold a reference to each killed spot container's mount namespace from just before the
    SIGKILL until after the owner's release: the container's last process then exits without
    tearing the namespace down (an RCU grace period inside ``exit``, tens of ms on a busy node),
    and the teardown runs on a thread of the agent after the release
    (:mod:`spotgpu.adapters.mntns`); ``false``: the exits tear their namespaces down."""
    defer_detection: bool = True
    """Detection cycles wait while an eviction runs (they take the solver's lock, the GIL and
    a CPU the eviction needs)."""
    release_check: ReleaseCheckConfig = dataclasses.field(default_factory=ReleaseCheckConfig)
    """The release invariant (``releaseCheck``)."""


def loopback_port(address: str, key: str) -> int:
    """The port of ``address`` (``127.0.0.1:9479``, ``[::1]:9479``; 0 picks one), refused with a
    :class:`ConfigError` naming ``key`` unless its host is a loopback IP literal (no name: a name
    could resolve to any address)."""
    host, sep, port = address.rpartition(":")
    try:
        loopback = ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        loopback = False
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{key}: {address!r} is not <ip>:<port>")
    if not loopback:
        raise ConfigError(f'{key}: {address!r} must be a loopback address such as 127.0.0.1:9479 (or "" for none)')
    return int(port)


class AgentMode(enum.StrEnum):
    """How spot containers get their twins: the device plugin (``platform/spot-gpu``) or DRA."""

    DEVICE_PLUGIN = "devicePlugin"
    DRA = "dra"


_DRIVER_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+")


@dataclasses.dataclass(frozen=True, slots=True)
class DraConfig:
    """``agent.dra``: the DRA kubelet plugin of ``agent.mode: dra`` (docs/dra.md)."""

    driver_name: str = "gpu.spotgpu.io"
    """The DRA driver name (a DNS subdomain of at most 63 characters): ResourceSlices'
    ``spec.driver``, DeviceClass selectors, CDI vendor ``k8s.<driverName>``."""
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    """The service socket is ``<pluginsDir>/<driverName>/dra.sock``; the checkpoint lives there too."""
    cdi_dir: Path = Path("/var/run/cdi")
    """Where the claims' CDI specs are written: one of containerd's ``cdi_spec_dirs``."""
    vendor_cdi_dirs: tuple[Path, ...] = (Path("/etc/cdi"), Path("/var/run/cdi"))
    vendor_cdi_kind: str = "nvidia.com/gpu"
    """A vendor spec of this kind with a device named by the GPU's ID is used instead of ours;
    empty: always write our own spec."""
    pod_uid: str = ""
    """The agent pod's UID for rolling-update socket names (kubelet >= 1.33); empty: the fixed names."""
    republish_interval: Seconds = Seconds(10.0)
    """How often the ResourceSlices are checked (and re-created after the kubelet deleted them)."""

    def __post_init__(self) -> None:
        if len(self.driver_name) > 63 or _DRIVER_NAME_RE.fullmatch(self.driver_name) is None:
            raise ConfigError(
                f"dra.driverName: {self.driver_name!r} must be a DNS subdomain with a dot, at most 63 characters"
            )
        if self.republish_interval <= 0:
            raise ConfigError("dra.republishInterval: must be greater than zero")


@dataclasses.dataclass(frozen=True, slots=True)
class AgentConfig:
    """``spotgpu agent --config FILE`` (section ``agent``). Defaults suit a stock kubelet node."""

    node_name: str = ""
    """Kubernetes node name; empty means the ``NODE_NAME`` environment variable."""
    detect_interval: Seconds = Seconds(10.0)
    max_inactive_time: Seconds = Seconds(600.0)
    utilization_source: UtilizationSource = UtilizationSource.NVML
    exporters: tuple[ExporterEndpoint, ...] = ()
    gpu_resource: ResourceName = NVIDIA_GPU_RESOURCE
    spot_resource: ResourceName = SPOT_GPU_RESOURCE
    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    containerd_socket: Path = Path("/run/containerd/containerd.sock")
    containerd_namespace: str = "k8s.io"
    containerd_state_dir: Path | None = None
    """containerd's ``state`` folder (its shims' task bundles, where the init PID of a spot
    container not pinned yet is read on a return with no containerd call); None: the folder of
    ``containerdSocket`` (``/run/containerd``, containerd's default for both)."""
    sigterm_grace: Seconds = Seconds(0.0)
    """Seconds between SIGTERM and SIGKILL when evicting; 0 means SIGKILL at once."""
    metrics_address: str = "0.0.0.0:9477"
    """``/metrics`` (Prometheus), reachable by the cluster's scraper."""
    debug_address: str = "127.0.0.1:9479"
    """``/debug/state`` (every owner, loan and spot pod of the node): its own listener, on a loopback
    address only (reach it with ``kubectl port-forward``); ``""`` serves no dump. Never on
    ``metricsAddress``."""
    runtime_socket: Path = Path("/run/spotgpu/agent.sock")
    """Local service spotgpu-runtime asks for device resolution and guard state."""
    guard: GuardConfig = dataclasses.field(default_factory=GuardConfig)
    gpu_backend: GpuBackendKind = GpuBackendKind.NVML
    device_nodes: tuple[DeviceNodeConfig, ...] = ()
    """GPUs of the ``devnode`` backend (other vendors' device nodes, or test stand-ins)."""
    utilization_dir: Path | None = None
    """``devnode`` backend: a directory of ``<device id>`` files holding a utilization percentage."""
    plugin_socket_name: str = "spotgpu-spot-gpu.sock"
    eviction_timeout: Seconds = Seconds(10.0)
    """Longest wait for spot tasks to exit after SIGKILL before the eviction reports failure."""
    eviction: EvictionConfig = dataclasses.field(default_factory=EvictionConfig)
    """The return path's switches (``eviction``)."""
    twin_replicas: int = 1
    """Twins advertised per real GPU: 1 gives ``spot-<id>`` (one spot container per lent GPU);
    N > 1 gives ``spot-<id>::0`` .. ``::N-1``, so up to N spot containers share one GPU (shared spot).
    Legacy: the spot resource then has no exclusive twins; prefer ``sharedReplicas``."""
    shared_replicas: int = 0
    """Shared spot: N > 0 also serves ``<spotResource>-shared`` (``platform/spot-gpu-shared``)
    with replicas ``spot-<id>::0`` .. ``::N-1`` per GPU, one per shared spot container, beside the
    exclusive twins; a GPU is lent to one kind at a time. 0: not served."""
    lending: LendingConfig = dataclasses.field(default_factory=LendingConfig)
    """When idle owners are lent, the owner-return model, and unguarded owners (``lending``)."""
    shadow_namespace: str = DEFAULT_SHADOW_NAMESPACE
    """The namespace of ShadowPods (the scheduler's ``shadowNamespace``): a pod elsewhere that claims
    to be one is an ordinary owner (:mod:`spotgpu.core.shadow`)."""
    state_file: Path | None = Path("/run/spotgpu/agent-state.json")
    """Which owners are lent, kept across agent restarts (a tmpfs path: a node reboot forgets it);
    ``null`` keeps no file (a restarted agent then re-lends only owners whose GPUs carry spot users)."""
    mode: AgentMode = AgentMode.DEVICE_PLUGIN
    """``devicePlugin``: twins through the ``platform/spot-gpu`` device plugin; ``dra``: the agent is
    a DRA driver (``dra``) and serves no device plugin."""
    dra: DraConfig = dataclasses.field(default_factory=DraConfig)

    def __post_init__(self) -> None:
        if self.debug_address:
            port = loopback_port(self.debug_address, "debugAddress")
            if port and self.metrics_address.rpartition(":")[2] == str(port):
                raise ConfigError(f"debugAddress: port {port} is metricsAddress's; /debug/state needs its own listener")
        if self.detect_interval <= 0:
            raise ConfigError("detectInterval: must be greater than zero")
        if self.max_inactive_time < self.detect_interval:
            raise ConfigError(
                f"maxInactiveTime: {self.max_inactive_time:g}s is shorter than detectInterval "
                f"{self.detect_interval:g}s; an owner could never be judged idle reliably"
            )
        if self.utilization_source is UtilizationSource.EXPORTER and not self.exporters:
            raise ConfigError("exporters: utilizationSource is 'exporter' but no exporter endpoint is configured")
        if self.gpu_resource == self.spot_resource:
            raise ConfigError("spotResource: must differ from gpuResource")
        if self.gpu_backend is GpuBackendKind.DEVNODE and not self.device_nodes:
            raise ConfigError("deviceNodes: gpuBackend is 'devnode' but no device node is configured")
        if "/" in self.plugin_socket_name or not self.plugin_socket_name.endswith(".sock"):
            raise ConfigError(f"pluginSocketName: {self.plugin_socket_name!r} must be a file name ending in .sock")
        if not 1 <= self.twin_replicas <= 64:
            raise ConfigError(f"twinReplicas: must be between 1 and 64, got {self.twin_replicas}")
        if not 0 <= self.shared_replicas <= 64:
            raise ConfigError(f"sharedReplicas: must be between 0 and 64, got {self.shared_replicas}")
        if self.shared_replicas and self.twin_replicas > 1:
            raise ConfigError(
                "sharedReplicas: cannot be combined with twinReplicas > 1 (the legacy replicas of the spot "
                "resource itself); set twinReplicas: 1"
            )
        if self.shared_replicas:
            try:
                validate_resource_name(self.shared_resource)
            except ValidationError as exc:
                raise ConfigError(f"sharedReplicas: the shared resource of spotResource: {exc}") from None

    @property
    def kubelet_socket(self) -> Path:
        return self.device_plugin_dir / "kubelet.sock"

    @property
    def shared_resource(self) -> ResourceName:
        """The shared spot resource (served when ``sharedReplicas`` > 0)."""
        return shared_resource_of(self.spot_resource)

    @property
    def shared_plugin_socket_name(self) -> str:
        """The shared resource's device plugin socket: ``pluginSocketName`` with ``-shared``."""
        return self.plugin_socket_name.removesuffix(".sock") + SHARED_SUFFIX + ".sock"


__all__ = [
    "AgentConfig",
    "AgentMode",
    "DraConfig",
    "DeviceNodeConfig",
    "ControlDeviceConfig",
    "EvictionConfig",
    "GpuBackendKind",
    "ExporterEndpoint",
    "GuardConfig",
    "LendPolicyKind",
    "LendingConfig",
    "PredictiveConfig",
    "loopback_port",
    "UnguardedPolicy",
    "UtilizationSource",
    "ReleaseCheckConfig",
]
