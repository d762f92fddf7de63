"""A GuardService in a process of its own (so tests can SIGKILL it), driven over stdin.

Commands (one per line): ``arm REF``, ``disarm REF``, ``wait-fds N``, ``wait-holds N``,
``wait-attached``, ``state REF``, ``metrics``. Each answers one JSON line ``{"event": "done", ...}``;
owner-back signals print ``{"event": "owner-back", "owner": REF, "t_ns": ...}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from spotgpu.core.config import GuardConfig
from spotgpu.core.configfile import Seconds
from spotgpu.core.refs import ContainerRef
from spotgpu.guard.service import GuardService

_out = threading.Lock()


def emit(**item: object) -> None:
    with _out:
        sys.stdout.write(json.dumps(item) + "\n")
        sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listener", type=Path, required=True)
    parser.add_argument("--control", type=Path, required=True)
    parser.add_argument("--fail-open", type=float, default=5.0)
    parser.add_argument("--holder-timeout", type=float, default=1.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(asctime)s guard %(message)s")
    config = GuardConfig(
        listener_path=args.listener,
        holder_path=args.control,
        fail_open_timeout=Seconds(args.fail_open),
        holder_timeout=Seconds(args.holder_timeout),
    )
    registry = CollectorRegistry()
    guard = GuardService(
        config,
        lambda owner: emit(event="owner-back", owner=owner.format(), t_ns=time.monotonic_ns()),
        registry=registry,
    )
    guard.start()
    if not guard.wait_until(lambda g: g.attached, 15):
        emit(event="error", error="not attached")
        return 1
    emit(event="ready")
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cmd, rest = words[0], words[1:]
        if cmd == "arm":
            guard.arm(ContainerRef.parse(rest[0]))
            emit(event="done")
        elif cmd == "disarm":
            t = time.monotonic_ns()
            guard.disarm(ContainerRef.parse(rest[0]))
            emit(event="done", t_ns=t)
        elif cmd == "wait-fds":
            ok = guard.wait_until(lambda g, n=int(rest[0]): len(g.fds()) >= n, 10)
            emit(event="done", ok=ok, fds=len(guard.fds()))
        elif cmd == "wait-holds":
            ok = guard.wait_until(lambda g, n=int(rest[0]): len(g.holds()) >= n, 10)
            emit(event="done", ok=ok, holds=len(guard.holds()))
        elif cmd == "wait-attached":
            emit(event="done", ok=guard.wait_until(lambda g: g.attached, 10))
        elif cmd == "state":
            emit(event="done", state=guard.state(ContainerRef.parse(rest[0])).value)
        elif cmd == "metrics":
            values = {
                f"{m.name}{m_labels}": s.value
                for m in registry.collect()
                for s in m.samples
                for m_labels in [json.dumps(s.labels, sort_keys=True) if s.labels else ""]
            }
            emit(event="done", metrics=values)
        else:
            emit(event="done", error=f"unknown command {cmd}")
    guard.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
