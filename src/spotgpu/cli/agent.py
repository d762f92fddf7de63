"""``spotgpu agent --config FILE``: run the node agent until SIGTERM/SIGINT.

Side effects: everything the agent does (device plugin socket, spotgpu-runtime's service
socket, the guard, metrics port, containerd and Kubernetes API calls). The configuration is the
``agent`` section of FILE (:class:`~spotgpu.core.config.AgentConfig`) and its ``runtime``
section (:class:`~spotgpu.runtime.config.RuntimeConfig`, defaults when absent) for the
runtime service the agent hosts, and its ``nri`` section (:class:`~spotgpu.nri.config.NriConfig`)
for NRI mode; ``--check`` validates them and exits.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from spotgpu.cli import stop_on_signals
from spotgpu.core.config import AgentConfig, AgentMode
from spotgpu.core.configfile import ConfigError, load_yaml_file
from spotgpu.core.errors import SpotgpuError
from spotgpu.core.ids import NodeName
from spotgpu.core.refs import ContainerRef
from spotgpu.ports.guard import GuardPort
from spotgpu.util.cpuboost import CpuBoost

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("spotgpu.agent")

DEFAULT_CONFIG: Final = Path("/etc/spotgpu/config.yaml")
"""Where the chart mounts the agent's configuration (so ``spotgpu agent --check`` in the agent's pod needs no flag)."""

NO_NODE: Final = (
    "no node name: set agent.nodeName, --node or $NODE_NAME (the chart sets $NODE_NAME in the agent's pod; "
    "outside it pass --node)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help=f"YAML file with an 'agent' section (default: {DEFAULT_CONFIG}, where the chart mounts it)",
    )
    parser.add_argument(
        "--node", help="node name (default: agent.nodeName, then $NODE_NAME, which the chart sets in the agent's pod)"
    )
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit")


def guard_factory(
    config: AgentConfig, registry: CollectorRegistry | None = None, boost: CpuBoost | None = None
) -> Callable[[Callable[[ContainerRef], None]], GuardPort] | None:
    """The return guard's service, when enabled and installed (spotgpu.guard.service.GuardService),
    with its metrics in ``registry`` (the agent's, so they appear on the agent's ``/metrics``)
    and the CPU-weight raises counted in ``boost`` (the one the agent's task port uses, so
    overlapping raises of one cgroup by both are counted together)."""
    if not config.guard.enabled:
        log.info("return guard disabled by configuration: return detection by polling only")
        return None
    try:
        module = importlib.import_module("spotgpu.guard.service")
        service = module.GuardService
    except (ImportError, AttributeError) as exc:
        log.warning("return guard not available (%s): return detection by polling only", exc)
        return None

    def make(handler: Callable[[ContainerRef], None]) -> GuardPort:
        guard: GuardPort = service(
            config.guard,
            handler,
            registry=registry,
            realtime=config.eviction.realtime,
            boost_cpu=config.eviction.boost_cpu,
            boost=boost,
        )
        return guard

    return make


def legacy_warnings(config: AgentConfig) -> list[str]:
    """One line per legacy key the configuration sets (said once, at start)."""
    if config.twin_replicas > 1:
        return [
            "agent.twinReplicas is legacy and will be removed in the next minor release: it makes every "
            "spot twin shared; use sharedReplicas (platform/spot-gpu-shared beside exclusive twins)"
        ]
    return []


def served(config: AgentConfig) -> str:
    """The device plugin resources (or the DRA driver) the configuration serves, in words."""
    if config.mode is AgentMode.DRA:
        return (
            f"DRA driver {config.dra.driver_name} (ResourceSlices, kubelet plugin, CDI specs in {config.dra.cdi_dir})"
        )
    if config.twin_replicas > 1:
        return f"{config.spot_resource} ({config.twin_replicas} shared replicas per GPU, legacy twinReplicas)"
    text = f"{config.spot_resource} (exclusive twins)"
    if config.shared_replicas:
        text += f", {config.shared_resource} ({config.shared_replicas} shared replicas per GPU)"
    return text


def _check(path: Path, node: str, config: AgentConfig, nri_socket: Path | None) -> int:
    """``--check``: the configuration is valid; the node name is there or what sets it is named."""
    mode = f"NRI on {nri_socket} and the wrapper's socket" if nri_socket else "the wrapper's socket"
    where = f"for node {node}" if node else "(no node name yet)"
    print(f"configuration {path} OK {where}; serves {served(config)}; spotgpu-runtime through {mode}")
    if not node:
        print(f"spotgpu agent: {NO_NODE}", file=sys.stderr)
        return 2
    return 0


def run(args: argparse.Namespace) -> int:
    from spotgpu.nri.config import load_nri_config
    from spotgpu.runtime.config import load_runtime_config

    try:
        config = load_yaml_file(args.config, AgentConfig, section="agent")
        runtime = load_runtime_config(args.config)
        nri = load_nri_config(args.config)
    except ConfigError as exc:
        print(f"spotgpu agent: {exc}", file=sys.stderr)
        return 2
    for warning in legacy_warnings(config):
        log.warning("%s", warning)
    node = args.node or config.node_name or os.environ.get("NODE_NAME", "")
    if args.check:
        return _check(args.config, node, config, nri.socket_path if nri.enabled else None)
    if not node:
        print(f"spotgpu agent: {NO_NODE}", file=sys.stderr)
        return 2
    from spotgpu.adapters.agent_metrics import AgentMetrics
    from spotgpu.agent.build import build_agent
    from spotgpu.kube.agent_port import KubeAgentPort
    from spotgpu.kube.client import connect

    metrics = AgentMetrics()
    boost = CpuBoost() if config.eviction.boost_cpu else None  # one count for the guard and the kills
    try:
        connection = connect(kubeconfig=args.kubeconfig)
        kube = KubeAgentPort(connection)
        dra_api = None
        if config.mode is AgentMode.DRA:
            from spotgpu.kube.dra_port import KubeDraApi

            dra_api = KubeDraApi(connection)
        agent = build_agent(
            config,
            node=NodeName(node),
            kube=kube,
            guard_factory=guard_factory(config, metrics.registry, boost),
            cpu_boost=boost,
            runtime=runtime,
            metrics=metrics,
            nri=nri,
            dra_api=dra_api,
        )
    except SpotgpuError as exc:
        print(f"spotgpu agent: cannot start: {exc}", file=sys.stderr)
        return 1
    stop = stop_on_signals(log)
    try:
        agent.start()
    except (SpotgpuError, OSError) as exc:
        log.error("cannot start: %s", exc)
        agent.stop()
        return 1
    log.info(
        "agent running on node %s (metrics on port %s, /debug/state on %s)",
        node,
        agent.metrics_port,
        agent.config.debug_address or "no listener",
    )
    try:
        stop.wait()
    finally:
        agent.stop()
    return 0
