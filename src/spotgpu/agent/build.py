"""Building an :class:`~spotgpu.agent.service.Agent` from its configuration.

Decides which adapter implements each port for a given :class:`~spotgpu.core.config.AgentConfig`
(GPU backend, utilization source, containerd, pod-resources, lending record) and how
spotgpu-runtime's service is hosted (:class:`~spotgpu.runtime.config.RuntimeConfig`). Side
effects: constructing the adapters opens gRPC channels (lazily connected) and, for NVML, loads
the driver library. Used by ``spotgpu agent`` (and so by the node end-to-end harness).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.adapters.agent_state import LendStateFile
from spotgpu.adapters.containerd import ContainerdTasks
from spotgpu.adapters.devnode_gpu import CgroupPids, DeviceNode, DeviceNodeBackend
from spotgpu.adapters.holderscan import DeviceFile, HolderScanner, ReleaseChecker, device_file, hierarchy
from spotgpu.adapters.kubelet import PodResourcesView
from spotgpu.agent.service import Agent, RuntimeServiceFactory, TwinHostFactory
from spotgpu.core.clock import Clock
from spotgpu.core.config import AgentConfig, AgentMode, GpuBackendKind, UtilizationSource
from spotgpu.core.errors import PermanentError
from spotgpu.core.ids import DeviceID, NodeName
from spotgpu.core.refs import ContainerRef
from spotgpu.dra.ports import DraApi
from spotgpu.nri.config import NriConfig
from spotgpu.ports.agent import RuntimeHost
from spotgpu.ports.guard import GuardPort
from spotgpu.ports.kube import KubePort
from spotgpu.ports.node import GpuBackend, PodResourcesPort, ReleaseCheck, UtilizationReader
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.service import RuntimeService
from spotgpu.util.cpuboost import CpuBoost

log = logging.getLogger(__name__)


def make_backend(config: AgentConfig) -> GpuBackend:
    if config.gpu_backend is GpuBackendKind.DEVNODE:
        nodes = [
            DeviceNode(DeviceID(n.id), str(n.path), n.index, n.numa_node, n.container_paths)
            for n in config.device_nodes
        ]
        pids = CgroupPids(config.eviction.release_check.cgroup_roots)  # the pods' processes only
        return DeviceNodeBackend(nodes, utilization_dir=config.utilization_dir, pids=pids)
    from spotgpu.adapters.nvml import NvmlBackend

    return NvmlBackend()


def make_release_check(config: AgentConfig, backend: GpuBackend) -> ReleaseCheck | None:
    """The release invariant's checker (None when ``agent.eviction.releaseCheck.enabled`` is
    false): the GPU nodes are the device-node backend's configured nodes, or ``/dev/nvidia<minor>``
    of each GPU the backend reports; the control nodes are configured."""
    check = config.eviction.release_check
    if not check.enabled:
        log.warning(
            "agent.eviction.releaseCheck.enabled is false: a GPU fd held outside the spot pods survives a return"
        )
        return None
    by_id = {DeviceID(n.id): (str(n.path), n.container_paths) for n in config.device_nodes}

    def gpu_files(device: DeviceID) -> list[DeviceFile]:
        if config.gpu_backend is GpuBackendKind.DEVNODE:
            path, extra = by_id.get(device, ("", ()))
            found = device_file(path, extra) if path else None
            return [found] if found is not None else []
        minors = [d.minor for d in backend.devices() if d.id == device and d.minor is not None]
        files = [device_file(f"/dev/nvidia{m}") for m in minors]
        return [f for f in files if f is not None]

    def control_files() -> list[DeviceFile]:
        files = [device_file(str(c.path), c.container_paths) for c in check.control_devices]
        return [f for f in files if f is not None]

    scanner = HolderScanner(check.cgroup_roots, mount=hierarchy(check.cgroup_mount))
    return ReleaseChecker(scanner, gpu_files, control_files)


def make_utilization(config: AgentConfig, metrics: AgentMetrics) -> UtilizationReader | None:
    """The exporter reader when configured; ``None`` means the backend's own utilization."""
    if config.utilization_source is not UtilizationSource.EXPORTER:
        return None
    from spotgpu.adapters.exporters.scrape import Exporter, ExporterUtilization

    exporters = [Exporter(e.vendor, e.url, e.timeout) for e in config.exporters]
    return ExporterUtilization(exporters, on_error=metrics.collector_error)


def runtime_service_factory(
    config: AgentConfig, runtime: RuntimeConfig, nri: NriConfig | None = None
) -> RuntimeServiceFactory:
    """spotgpu-runtime's service as the agent hosts it: the agent's paths, its owner lookup, and
    our own device plugins' sockets (exclusive twins and shared replicas) left out of the
    runtime's device plugin probing; with ``nri.enabled`` also the NRI plugin (NRI mode)."""
    sockets = (config.plugin_socket_name, config.shared_plugin_socket_name)

    def make(agent: Agent) -> RuntimeHost:
        if nri is not None and nri.enabled:
            from spotgpu.nri.service import NriRuntimeService

            return NriRuntimeService.for_agent(
                config, runtime, nri, owner_of=agent.owner_of, own_plugin_sockets=sockets, lendable=agent.lendable
            )
        return RuntimeService.for_agent(
            config, runtime, owner_of=agent.owner_of, own_plugin_sockets=sockets, lendable=agent.lendable
        )

    return make


def dra_host_factory(config: AgentConfig, runtime: RuntimeConfig | None, api: DraApi) -> TwinHostFactory:
    """``agent.mode: dra``: the DRA driver around the agent's lookups, the vendor device plugin's
    ``Allocate`` reached as spotgpu-runtime reaches it (our own plugin sockets left out)."""
    from spotgpu.dra.host import DraHost
    from spotgpu.runtime.node import KubeletNodeLookup

    rt = (runtime or RuntimeConfig()).with_agent(config)

    def make(agent: Agent) -> DraHost:
        lookup = KubeletNodeLookup.from_config(
            rt,
            agent.owner_of,
            exclude_sockets=(config.plugin_socket_name, config.shared_plugin_socket_name),
            lendable=agent.lendable,
        )
        return DraHost(
            config.dra,
            node=agent.node,
            gpu_resource=config.gpu_resource,
            spot_resource=config.spot_resource,
            api=api,
            owner_of=agent.owner_of,
            lendable=agent.lendable,
            allocate=lookup.allocate,
            devices=agent.solver.devices,
            forecasts=agent.solver.idle_forecasts,
        )

    return make


def _pod_resources(config: AgentConfig, node: NodeName) -> PodResourcesPort:
    """pod-resources; in DRA mode with the claims of our driver read as the twins they stand for."""
    if config.mode is not AgentMode.DRA:
        return PodResourcesView(config.pod_resources_socket)
    from spotgpu.dra.claim import DriverName
    from spotgpu.dra.podresources import DraPodResources

    return DraPodResources(
        config.pod_resources_socket,
        driver=DriverName(config.dra.driver_name),
        node=node,
        gpu_resource=config.gpu_resource,
        spot_resource=config.spot_resource,
        shared_replicas=config.shared_replicas,
    )


def build_agent(
    config: AgentConfig,
    *,
    node: NodeName,
    kube: KubePort,
    guard_factory: Callable[[Callable[[ContainerRef], None]], GuardPort] | None = None,
    backend: GpuBackend | None = None,
    clock: Clock | None = None,
    runtime: RuntimeConfig | None = None,
    metrics: AgentMetrics | None = None,
    nri: NriConfig | None = None,
    cpu_boost: CpuBoost | None = None,
    dra_api: DraApi | None = None,
) -> Agent:
    """An agent with the real node adapters the configuration names, hosting spotgpu-runtime's
    service configured by ``runtime`` (None: no service, e.g. a node without the runtime), in NRI
    mode when ``nri.enabled``.

    Pass ``metrics`` when something else must share its registry (the guard's metrics), and
    ``cpu_boost`` when something else raises CPU weights too (the guard, at its releases).
    In ``agent.mode: dra`` no device plugin is served and ``dra_api`` (the Kubernetes API for
    claims and slices) is required."""
    metrics = metrics or AgentMetrics()
    twin_host: TwinHostFactory | None = None
    if config.mode is AgentMode.DRA:
        if dra_api is None:
            raise PermanentError("agent.mode is dra but no Kubernetes API for DRA was given")
        twin_host = dra_host_factory(config, runtime, dra_api)
    backend = backend or make_backend(config)
    return Agent(
        config,
        node=node,
        kube=kube,
        backend=backend,
        tasks=ContainerdTasks(
            str(config.containerd_socket),
            config.containerd_namespace,
            verify_by_pidfd=config.eviction.verify_by_pidfd,
            pin_pidfds=config.eviction.pin_pidfds,
            boost_cpu=config.eviction.boost_cpu,
            boost=cpu_boost,
            hold_mount_ns=config.eviction.hold_mount_ns,
            state_dir=config.containerd_state_dir or config.containerd_socket.parent,
        ),
        pod_resources=_pod_resources(config, node),
        guard_factory=guard_factory,
        utilization=make_utilization(config, metrics),
        clock=clock,
        metrics=metrics,
        runtime_service=runtime_service_factory(config, runtime, nri) if runtime is not None else None,
        owner_record=runtime.with_agent(config).owner_state_file
        if runtime is not None and runtime.fallback == "local"
        else None,
        store=LendStateFile(config.state_file) if config.state_file is not None else None,
        serve_device_plugin=config.mode is AgentMode.DEVICE_PLUGIN,
        twin_host=twin_host,
        release_check=make_release_check(config, backend),
    )


__all__ = [
    "build_agent",
    "dra_host_factory",
    "make_backend",
    "make_release_check",
    "make_utilization",
    "runtime_service_factory",
]
