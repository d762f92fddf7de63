"""``spotgpu node-e2e``: the full lend/return cycle on this machine, with real containerd, runc,
spotgpu-runtime, agent and guard (root). See docs/node-e2e.md.

Side effects: everything :class:`spotgpu.e2e.node.Node` starts, under a private temporary
directory that is removed at the end (``--keep``, or a failed run, keeps it with every log);
with ``--background-load N``, N busy-loop processes (:mod:`spotgpu.bench.env`) while the
cycles and faults run. Prints progress and one line per fault on stderr, the figures as JSON
on stdout (``--json``: only the JSON object; ``--out FILE``: also into FILE), with the
environment block (cores, load averages before and after, kernel, runc and containerd
versions, the background load, the git revision). Exit status: 0 when every correctness check
passed (no leaked container, no owner error, every fault survived), 1 otherwise, 2 when the
machine cannot run it. The latency targets are reported (``met``) but do not decide the exit
status: they depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotgpu.bench import env

if TYPE_CHECKING:
    from spotgpu.e2e.model import Launcher, NodeSettings
    from spotgpu.e2e.node import Node

NEEDED = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "gcc")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cycles", type=int, default=5, help="lend/return cycles to run (default 5)")
    parser.add_argument("--spot-containers", type=int, default=8, help="spot containers per cycle (default 8)")
    parser.add_argument("--gpus", type=int, default=2, help="stand-in GPUs of the owner (default 2)")
    parser.add_argument("--faults", action="store_true", help="after the cycles, strike the faults (docs/node-e2e.md)")
    parser.add_argument("--json", action="store_true", help="print only the JSON figures on stdout")
    parser.add_argument("--detect-interval", type=float, default=0.25, help="agent detectInterval, s (default 0.25)")
    parser.add_argument("--max-inactive", type=float, default=1.0, help="agent maxInactiveTime, s (default 1)")
    parser.add_argument("--fail-open", type=float, default=5.0, help="guard failOpenTimeout, s (default 5)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, specs) and print its path")
    how = parser.add_mutually_exclusive_group()
    how.add_argument(
        "--cri",
        dest="launcher",
        action="store_const",
        const="cri",
        default="cri",
        help="pods through the kubelet CRI double and containerd's CRI plugin (default)",
    )
    how.add_argument(
        "--ctr", dest="launcher", action="store_const", const="ctr", help="containers through ctr run (a baseline)"
    )
    parser.add_argument(
        "--containerd",
        choices=["1.6", "2.2"],
        default="1.6",
        help="Debian's containerd 1.6 or containerd 2.2.7 ($SPOTGPU_CONTAINERD22 or ../shared/bin) (default 1.6)",
    )
    parser.add_argument(
        "--mode",
        choices=["wrapper", "nri"],
        default="wrapper",
        help="spotgpu-runtime as the containerd runtime handler, or the agent's NRI plugin (2.2) (default wrapper)",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON object to this file")
    env.add_arguments(parser)


def check_machine() -> str | None:
    if os.geteuid() != 0:
        return "needs root (containers, device nodes, seccomp, cgroups)"
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if missing or not Path("/bin/busybox").exists():
        return f"missing: {', '.join(missing + ([] if Path('/bin/busybox').exists() else ['/bin/busybox']))}"
    return None


def _invalid(args: argparse.Namespace) -> str | None:
    """What is wrong with the options (None: nothing)."""
    if args.cycles < 0 or args.spot_containers < 1 or args.gpus < 1:
        return "--cycles >= 0, --spot-containers >= 1 and --gpus >= 1"
    if args.launcher == "ctr" and (args.containerd != "1.6" or args.mode != "wrapper"):
        return "--ctr runs containerd 1.6 in wrapper mode only"
    if args.mode == "nri" and args.containerd == "1.6":
        return "containerd 1.6 has no NRI: --mode nri needs --containerd 2.2"
    if args.containerd == "2.2":
        from spotgpu.testing.cri_containerd import ENV_CONTAINERD22, containerd22_folder

        if containerd22_folder() is None:
            return f"containerd 2.2.7 not found (set ${ENV_CONTAINERD22})"
    return None


def run(args: argparse.Namespace) -> int:
    problem = check_machine()
    if problem:
        print(f"spotgpu node-e2e: {problem}", file=sys.stderr)
        return 2
    invalid = _invalid(args)
    if invalid:
        print(f"spotgpu node-e2e: {invalid}", file=sys.stderr)
        return 2
    from spotgpu.e2e.faults import run_faults
    from spotgpu.e2e.run import Run, run_cycles, summarize, targets

    settings = node_settings(args, gpus=args.gpus, launcher=args.launcher)
    base, node = new_node(settings, "sg-e2e-")
    began = time.monotonic()
    load_before = env.load_average()
    result: dict[str, Any]
    try:
        node.start()
        say(f"node up in {time.monotonic() - began:.1f} s ({base})")
        driver = Run(node, say)
        with env.background_load(args.background_load):
            records = run_cycles(driver, args.cycles)
            result = summarize(records, settings)
            if args.faults:
                outcomes = run_faults(driver)
                result["faults"] = [{"name": o.name, "passed": o.passed, "detail": o.detail} for o in outcomes]
                result["faults_passed"] = all(o.passed for o in outcomes)
    except Exception as exc:
        logging.getLogger("spotgpu.e2e").exception("node-e2e aborted")
        say(f"agent log tail:\n{node.agent.log_tail(40)}")
        result = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        node.close()
    result["wall_s"] = round(time.monotonic() - began, 1)
    result["node"] = {"launcher": args.launcher, "containerd": args.containerd, "mode": args.mode}
    result["environment"] = env.environment(
        background_load=args.background_load,
        load_before=load_before,
        load_after=env.load_average(),
        containerd_binaries=[*_containerd_binaries(args), *args.containerd_binary],
    )
    ok = "error" not in result and result["leaked_containers"] == 0 and result["owner_errors"] == 0
    ok = ok and not result.get("problems") and result.get("faults_passed", True)
    if args.keep or not ok:
        say(f"work directory kept (logs, specs): {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    if "error" not in result:
        hold = result["return_hold_ms_p99"]
        bars = targets(settings, args.background_load)
        result["targets"] = bars
        result["met"] = {
            "return_hold_ms_p99": hold is not None and hold <= bars["return_hold_ms_p99"],
            "leaked_containers": result["leaked_containers"] == 0,
            "owner_errors": result["owner_errors"] == 0,
        }
    result["passed"] = ok
    text = json.dumps(result, indent=2, sort_keys=True)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(json.dumps(result, sort_keys=True) if args.json else text)
    return 0 if ok else 1


def node_settings(args: argparse.Namespace, *, gpus: int, launcher: Launcher = "cri") -> NodeSettings:
    """The node of the options shared with ``spotgpu soak`` (spot containers, timings, containerd, mode)."""
    from spotgpu.e2e.model import NodeSettings

    return NodeSettings(
        gpus=gpus,
        spot_containers=args.spot_containers,
        detect_interval=args.detect_interval,
        max_inactive_time=args.max_inactive,
        fail_open_timeout=args.fail_open,
        launcher=launcher,
        containerd=args.containerd,
        mode=args.mode,
    )


def new_node(settings: NodeSettings, prefix: str) -> tuple[Path, Node]:
    """A node (not started) in a new private directory under ``/tmp`` (short: unix socket paths)."""
    from spotgpu.e2e.node import Node

    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per API request
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    return base, Node(base, settings)


def say(line: str) -> None:
    """A progress line on stderr."""
    print(line, file=sys.stderr, flush=True)


def _containerd_binaries(args: argparse.Namespace) -> list[Path]:
    """The containerd 2.2.7 binary the run used (reported in the environment block)."""
    if args.containerd != "2.2":
        return []
    from spotgpu.testing.cri_containerd import containerd22_folder

    folder = containerd22_folder()
    return [folder / "containerd"] if folder is not None else []
