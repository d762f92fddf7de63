"""``spotgpu status``: nodes (real GPUs, lendable, lent and to whom, owner states) and queues.

Side effects: read-only API requests. Output: readable tables, or ``-o json``.
"""

from __future__ import annotations

import argparse
import json
import sys

from spotgpu.core.errors import SpotgpuError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from spotgpu.kube.client import add_connection_arguments

    parser.add_argument("-o", "--output", choices=["table", "json"], default="table", help="output format")
    add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from spotgpu.kube.client import connect_from_args
    from spotgpu.kube.status import collect, render_table

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
    return 0
