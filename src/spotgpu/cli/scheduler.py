"""``spotgpu scheduler``: the gang scheduler's control loop and the GangJob controller, leader elected.

Side effects: API watches and writes, a Lease for leader election, ``/metrics`` on
``--metrics-port``. Runs until SIGTERM/SIGINT, then stops acting and releases the Lease so a
standby replica takes over at once. The scheduling policy comes from the ``scheduler`` section of
``--config`` (:class:`~spotgpu.scheduler.config.SchedulerConfig`); ``--check`` validates it.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path

from spotgpu.cli import stop_on_signals
from spotgpu.core.errors import SpotgpuError

log = logging.getLogger("spotgpu.scheduler")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from spotgpu.kube.apply import EvictionMode
    from spotgpu.kube.client import add_connection_arguments

    parser.add_argument("--config", type=Path, help="YAML file with a 'scheduler' section (default: built-in policy)")
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit")
    parser.add_argument("--gpu-resource", default="nvidia.com/gpu", help="the nodes' real GPU resource")
    parser.add_argument("--default-queue", default="default", help="queue of spotgpu pods without a PodGroup")
    parser.add_argument("--period", type=float, default=5.0, help="seconds between cycles without changes")
    parser.add_argument(
        "--eviction-mode",
        choices=[m.value for m in EvictionMode],
        default=EvictionMode.EVICT.value,
        help="evict: the Eviction API (honours PodDisruptionBudgets); delete: delete after the reason condition",
    )
    parser.add_argument("--pause-image", default="registry.k8s.io/pause:3.10", help="image of ShadowPods")
    parser.add_argument("--no-gangjob-controller", action="store_true", help="do not run the GangJob controller")
    election = parser.add_argument_group("leader election")
    election.add_argument("--no-leader-elect", action="store_true", help="act without a Lease (one replica only!)")
    election.add_argument("--lease-name", default="spotgpu-scheduler")
    election.add_argument(
        "--lease-namespace", default=os.environ.get("POD_NAMESPACE", "spotgpu-system"), help="default: $POD_NAMESPACE"
    )
    election.add_argument("--identity", default=f"{socket.gethostname()}_{os.getpid()}")
    election.add_argument("--lease-duration", type=float, default=15.0)
    election.add_argument("--renew-deadline", type=float, default=10.0)
    election.add_argument("--retry-period", type=float, default=2.0)
    parser.add_argument("--metrics-port", type=int, default=9478, help="0 disables /metrics")
    parser.add_argument("--metrics-address", default="0.0.0.0")
    add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from spotgpu.core.configfile import ConfigError, load_yaml_file
    from spotgpu.core.ids import validate_resource_name
    from spotgpu.kube.apply import ApplyConfig, EvictionMode
    from spotgpu.kube.client import connect_from_args
    from spotgpu.kube.events import EventRecorder
    from spotgpu.kube.gangjob_controller import GangJobController
    from spotgpu.kube.leader import ElectionConfig, LeaderElector
    from spotgpu.kube.metrics import ControllerMetrics, serve
    from spotgpu.kube.scheduler_loop import SchedulerLoop
    from spotgpu.kube.snapshot import TranslateConfig
    from spotgpu.scheduler import check_config
    from spotgpu.scheduler.config import SchedulerConfig

    logging.getLogger("httpx2").setLevel(logging.WARNING)
    try:
        config = load_yaml_file(args.config, SchedulerConfig, "scheduler") if args.config else SchedulerConfig()
        check_config(config)  # unknown actions/plugins, plugins enrolled at no extension point
        election = ElectionConfig(args.lease_duration, args.renew_deadline, args.retry_period)
        translate = TranslateConfig(
            gpu_resource=validate_resource_name(args.gpu_resource),
            default_queue=args.default_queue,
            shadow_namespace=config.shadow_namespace,
        )
    except (ConfigError, ValueError) as exc:
        print(f"spotgpu scheduler: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print("configuration ok")
        return 0

    stop = stop_on_signals(log)

    try:
        connection = connect_from_args(args, field_manager="spotgpu-scheduler")
    except SpotgpuError as exc:
        print(f"spotgpu scheduler: {exc}", file=sys.stderr)
        return 1
    metrics = ControllerMetrics()
    events = EventRecorder(connection, component="spotgpu-scheduler", instance=args.identity)
    if args.metrics_port:
        serve(metrics, args.metrics_port, args.metrics_address)
    elector: LeaderElector | None = None
    if not args.no_leader_elect:
        elector = LeaderElector(
            connection,
            name=args.lease_name,
            namespace=args.lease_namespace,
            identity=args.identity,
            config=election,
            on_started=lambda: metrics.leader.set(1),
            on_stopped=lambda: metrics.leader.set(0),
        ).start()
    may_act = elector.is_leader if elector is not None else (lambda: True)
    loop = SchedulerLoop(
        connection,
        may_act=may_act,
        scheduler_config=config,
        translate=translate,
        apply=ApplyConfig(eviction_mode=EvictionMode(args.eviction_mode), pause_image=args.pause_image),
        metrics=metrics,
        period=args.period,
        events=events,
    ).start()
    controller = None
    if not args.no_gangjob_controller:
        controller = GangJobController(connection, may_act=may_act, metrics=metrics, events=events).start()
    log.info("spotgpu scheduler %s running (leader election %s)", args.identity, "off" if elector is None else "on")
    try:
        stop.wait()
    finally:
        if elector is not None:
            elector.stop(release=True)  # first: stop acting, let a standby take over
        # the process exits next: signal the threads (daemons) instead of waiting out their watches
        loop.stop(wait=False)
        if controller is not None:
            controller.stop(wait=False)
    return 0
