"""``spotgpu gangjob submit|list``: submit a spot GangJob, list GangJobs.

``spotgpu gangjob submit --queue spot-queue --replicas N --gpus G --priority spotmid --image IMG -- CMD...``
creates a GangJob (the seed's "inject workload gangjob"); the GangJob controller in the
``spotgpu scheduler`` process then creates its PodGroup and pods. Side effects: API requests
(a create; lists). Output: readable tables, or ``-o json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from spotgpu.cli import add_verbose_argument, quiet_unless_verbose
from spotgpu.core.errors import SpotgpuError
from spotgpu.core.refs import label_problem
from spotgpu.core.types import SpotPriority

if TYPE_CHECKING:
    from spotgpu.kube.client import Connection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from spotgpu.kube.client import add_connection_arguments

    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    submit = sub.add_parser("submit", help="submit a GangJob", description="submit a GangJob")
    submit.add_argument("--name", help="GangJob name (default: generated, gangjob-xxxxx)")
    submit.add_argument("-n", "--namespace", default="default")
    submit.add_argument("--queue", default="spot-queue", help="queue (default: spot-queue)")
    submit.add_argument("--replicas", type=int, required=True, help="pods in the gang")
    submit.add_argument("--min-available", type=int, help="pods that must run together (default: all)")
    submit.add_argument("--gpus", type=int, required=True, help="platform/spot-gpu twins per pod")
    submit.add_argument(
        "--priority", default=SpotPriority.SPOTMID.value, choices=[p.value for p in SpotPriority], help="spot tier"
    )
    submit.add_argument("--image", required=True)
    submit.add_argument("--retry-limit", type=int, default=3, help="evictions tolerated before the job fails")
    submit.add_argument("--requeue-backoff", type=int, default=10, help="seconds before the first requeue")
    submit.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="container environment")
    submit.add_argument("--dry-run", action="store_true", help="print the GangJob instead of creating it")
    submit.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...: the container's command")
    listing = sub.add_parser("list", help="list GangJobs", description="list GangJobs")
    listing.add_argument("-n", "--namespace", help="namespace (default: all)")
    for p in (submit, listing):
        p.add_argument("-o", "--output", choices=["table", "json"], default="table")
        add_verbose_argument(p)
        add_connection_arguments(p)


def _fail(message: str) -> int:
    print(f"spotgpu gangjob: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    quiet_unless_verbose(args)
    try:
        if args.action == "submit":
            return _submit(args)
        return _list(args)
    except SpotgpuError as exc:
        print(f"spotgpu gangjob {args.action}: {exc}", file=sys.stderr)
        return 1


def _row(obj: dict[str, Any]) -> list[str]:
    spec, status, meta = obj.get("spec") or {}, obj.get("status") or {}, obj.get("metadata") or {}
    return [
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        str(spec.get("queue", "")),
        str(spec.get("priorityClassName", "")),
        f"{spec.get('replicas', '')}x{spec.get('gpus', 0)}",
        str(status.get("phase", "Pending")),
        str(status.get("evictions", 0)),
        str(status.get("retries", 0)),
    ]


HEADERS = ["NAMESPACE", "NAME", "QUEUE", "PRIORITY", "PODSxGPUS", "PHASE", "EVICTIONS", "RETRIES"]


def _names_problem(args: argparse.Namespace) -> str | None:
    """Why the GangJob's name, namespace or queue cannot be an object's name, or None."""
    from spotgpu.kube.resources import MAX_GANGJOB_NAME

    checks = [("--namespace", args.namespace, 63), ("--queue", args.queue, 63)]
    if args.name is not None:
        checks.insert(0, ("--name", args.name, MAX_GANGJOB_NAME))
    for flag, value, limit in checks:
        problem = label_problem(f"{flag} {value!r}", value, limit)
        if problem is not None:
            return problem
    return None


def _queue_problem(connection: Connection, queue: str) -> str | None:
    """Why GangJobs cannot go to ``queue`` in this cluster (it does not exist), or None."""
    from spotgpu.kube.client import NotFound
    from spotgpu.kube.informer import collection_path
    from spotgpu.kube.resources import GROUP, VERSION

    path = collection_path(GROUP, VERSION, "queues")
    try:
        connection.get(f"{path}/{queue}", {}, f"get Queue {queue}")
    except NotFound:
        names = sorted(
            str((q.get("metadata") or {}).get("name"))
            for q in connection.get(path, {}, "list queues").get("items") or []
        )
        return f"--queue {queue!r}: no such Queue in the cluster; it has {', '.join(names) or 'none'}"
    return None


def _submit(args: argparse.Namespace) -> int:
    from spotgpu.kube.client import connect_from_args
    from spotgpu.kube.informer import collection_path
    from spotgpu.kube.resources import GROUP, VERSION, gangjob_manifest
    from spotgpu.kube.status import table

    problem = _names_problem(args)
    if problem is not None:
        return _fail(problem)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            return _fail(f"--env {item!r} must be NAME=VALUE")
        env[key] = value
    try:
        manifest = gangjob_manifest(
            namespace=args.namespace,
            name=args.name,
            queue=args.queue,
            replicas=args.replicas,
            gpus=args.gpus,
            priority=args.priority,
            image=args.image,
            command=command,
            min_available=args.min_available,
            retry_limit=args.retry_limit,
            requeue_backoff=args.requeue_backoff,
            env=env,
        )
    except ValueError as exc:
        return _fail(str(exc))
    if args.dry_run:
        print(json.dumps(manifest, indent=2))
        return 0
    connection = connect_from_args(args, field_manager="spotgpu-cli", namespace=args.namespace)
    try:
        problem = _queue_problem(connection, args.queue)
        if problem is not None:
            return _fail(problem)
        path = collection_path(GROUP, VERSION, "gangjobs", args.namespace)
        created = connection.post(path, manifest, f"create GangJob in {args.namespace}")
    finally:
        connection.close()
    if args.output == "json":
        print(json.dumps(created, indent=2, sort_keys=True))
    else:
        print(table(HEADERS, [_row(created)]))
    return 0


def _list(args: argparse.Namespace) -> int:
    from spotgpu.kube.client import connect_from_args
    from spotgpu.kube.informer import collection_path
    from spotgpu.kube.resources import GROUP, VERSION
    from spotgpu.kube.status import table

    connection = connect_from_args(args, field_manager="spotgpu-cli")
    try:
        path = collection_path(GROUP, VERSION, "gangjobs", args.namespace)
        items = connection.get(path, {}, "list GangJobs").get("items") or []
    finally:
        connection.close()
    if args.output == "json":
        print(json.dumps(items, indent=2, sort_keys=True))
    else:
        print(table(HEADERS, [_row(i) for i in items]))
    return 0
