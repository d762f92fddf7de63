"""``spotgpu status``: nodes (real GPUs, lendable, lent and to whom, owner states) and queues.

Side effects: read-only API requests. Output: readable tables, or ``-o json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Final

from spotgpu.cli import add_verbose_argument, quiet_unless_verbose
from spotgpu.core import keys
from spotgpu.core.errors import SpotgpuError

NO_NODES: Final = (
    f"no node runs the spotgpu agent: only nodes with the {keys.NODE_SPOT_GPU_STATE} annotation (written by "
    "the agent) are shown. Install the chart (it runs the agent as a DaemonSet on the GPU nodes) or check the "
    "agent's pods and logs on a GPU node."
)
NO_QUEUES: Final = (
    "no queues: spot and reserved GangJobs need a Queue (the chart creates them from its values' queues list)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from spotgpu.kube.client import add_connection_arguments

    parser.add_argument("-o", "--output", choices=["table", "json"], default="table", help="output format")
    add_verbose_argument(parser)
    add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from spotgpu.kube.client import connect_from_args
    from spotgpu.kube.status import collect, render_table

    quiet_unless_verbose(args)
    try:
        connection = connect_from_args(args, field_manager="spotgpu-cli")
        try:
            report = collect(connection)
        finally:
            connection.close()
    except SpotgpuError as exc:
        print(f"spotgpu status: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        print(render_table(report))
        hints = ([NO_NODES] if not report.nodes else []) + ([NO_QUEUES] if not report.queues else [])
        for hint in hints:
            print(f"spotgpu status: {hint}", file=sys.stderr)
    return 0
