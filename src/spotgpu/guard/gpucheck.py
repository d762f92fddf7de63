"""The guard's rule on a real NVIDIA GPU: how often it fires, and what it costs steady-state work.

Run on a GPU node as root (``scripts/gpu_guard_check.sh`` wraps it)::

    python -m spotgpu.guard.gpucheck all            # everything, one JSON object
    python -m spotgpu.guard.gpucheck count -- nvidia-smi

Decides nothing. Side effects: child processes, each started under a seccomp notify filter
with the rule's exact match (:data:`spotgpu.guard.rule.GUARD_MATCH`) installed by a small
launcher right before it execs the command (the filter survives exec and covers every thread
and child of the command). This process receives the notifications, counts them, and answers
CONTINUE at once, i.e. it plays an unarmed guard. No runc is needed, so the check runs on any
GPU node with the driver installed; runc applies the same match through libseccomp.

Figures:

* ``nvidia_smi`` / ``cuda_init`` / ``torch_init``: notifications caught while the command ran
  (``torch_init`` only when PyTorch is installed), and how many NVIDIA ioctls the same command
  issued in total (a second run under a broad rule matching every ``'F'``-type and UVM ioctl).
* ``steady_state``: a CUDA driver API loop (allocate, copy 4 KiB, synchronise, free) timed
  with and without the rule, alternately in the same run; per-iteration microseconds and the
  paired difference; notifications caught during the loop (must be 0).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from spotgpu.guard import seccomp
from spotgpu.guard.rule import GUARD_MATCH, NV_IOCTL_MAGIC

RULE = [(GUARD_MATCH.mask, GUARD_MATCH.value)]
BROAD = [(0x0000_FF00, NV_IOCTL_MAGIC << 8), (0xFFFF_FF00, 0x0000_0000), (0xFFFF_FFF0, 0x3000_0000)]
"""Every 'F'-type request, UVM's small raw numbers (< 256) and UVM_(DE)INITIALIZE: to count all
NVIDIA ioctls a command issues (never used by the guard itself)."""

CUDA_INIT = """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0, "cuInit failed"
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
cuda.cuCtxDestroy_v2(ctx)
"""

TORCH_INIT = "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"

STEADY = """
import ctypes, json, sys, time
n = int(sys.argv[1])
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
ptr, host = ctypes.c_uint64(), (ctypes.c_char * 4096)()
def step():
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), 1 << 20) == 0
    assert cuda.cuMemcpyHtoD_v2(ptr, host, 4096) == 0
    assert cuda.cuCtxSynchronize() == 0
    assert cuda.cuMemFree_v2(ptr) == 0
for _ in range(50):
    step()
print("READY", flush=True)
sys.stdin.readline()
t0 = time.perf_counter_ns()
for _ in range(n):
    step()
print(json.dumps({"us_per_iteration": (time.perf_counter_ns() - t0) / n / 1e3}), flush=True)
"""


def _launch(sock_fd: int, matches: str, argv: Sequence[str]) -> None:
    """Child side: install the filter, hand its listener fd to the parent, exec the command."""
    sock = socket.socket(fileno=sock_fd)
    pairs = [tuple(int(x, 0) for x in m.split(":")) for m in matches.split(",")]
    listener = seccomp.install_notify_filter([(m, v) for m, v in pairs])
    seccomp.send_with_fd(sock, b"fd", listener)
    os.close(listener)
    sock.recv(1)  # the parent has the fd: go
    sock.close()
    os.execvp(argv[0], list(argv))


def run_filtered(
    argv: Sequence[str], matches: Sequence[tuple[int, int]], stdin: str | None = None, timeout: float = 600
) -> dict[str, Any]:
    """Run ``argv`` under a notify filter; count and continue every notification."""
    parent, child = socket.socketpair()
    spec = ",".join(f"{m:#x}:{v:#x}" for m, v in matches)
    proc = subprocess.Popen(
        [sys.executable, "-m", "spotgpu.guard.gpucheck", "_launch", str(child.fileno()), spec, "--", *argv],
        pass_fds=[child.fileno()],
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child.close()
    _, fds = seccomp.recv_with_fds(parent, 16)
    listener = fds[0]
    parent.send(b"g")
    requests: dict[str, int] = {}
    started = time.monotonic()
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    if stdin is not None and proc.stdin is not None:
        proc.stdin.write(stdin)
        proc.stdin.flush()
        proc.stdin.close()
    while True:
        events = poller.poll(100)
        for _fd, mask in events:
            if mask & select.POLLIN:
                n = seccomp.recv(listener)
                if n is not None:
                    requests[f"{n.request:#x}"] = requests.get(f"{n.request:#x}", 0) + 1
                    seccomp.send_continue(listener, n.id)
        if any(mask & select.POLLHUP for _fd, mask in events) or time.monotonic() - started > timeout:
            break
    out, err = proc.communicate(timeout=30)
    os.close(listener)
    parent.close()
    return {
        "exit": proc.returncode,
        "notifications": sum(requests.values()),
        "requests": requests,
        "wall_s": round(time.monotonic() - started, 3),
        "stdout_tail": out[-400:],
        "stderr_tail": err[-400:],
    }


def count(argv: Sequence[str]) -> dict[str, Any]:
    caught = run_filtered(argv, RULE)
    total = run_filtered(argv, BROAD)
    return {
        "exit": caught["exit"],
        "guard_notifications": caught["notifications"],
        "guard_requests": caught["requests"],
        "nvidia_ioctls_total": total["notifications"],
        "stderr_tail": caught["stderr_tail"],
    }


def _steady_once(iterations: int, with_rule: bool) -> tuple[float, int]:
    argv = [sys.executable, "-c", STEADY, str(iterations)]
    if not with_rule:
        proc = subprocess.run(argv, input="go\n", capture_output=True, text=True, timeout=600, check=True)
        return json.loads(proc.stdout.splitlines()[-1])["us_per_iteration"], 0
    # The filter's caught calls during init are answered by run_filtered; the loop must add none.
    result = run_filtered(argv, RULE, stdin="go\n")
    line = [x for x in result["stdout_tail"].splitlines() if x.startswith("{")][-1]
    return json.loads(line)["us_per_iteration"], result["notifications"]


def steady_state(iterations: int, trials: int) -> dict[str, Any]:
    with_rule, without, diffs, caught = [], [], [], []
    for trial in range(trials):
        order = (True, False) if trial % 2 else (False, True)
        got: dict[bool, float] = {}
        for ruled in order:
            us, notifications = _steady_once(iterations, ruled)
            got[ruled] = us
            if ruled:
                caught.append(notifications)
        with_rule.append(got[True])
        without.append(got[False])
        diffs.append(got[True] - got[False])
    return {
        "with_rule_us_per_iteration": round(statistics.median(with_rule), 3),
        "without_rule_us_per_iteration": round(statistics.median(without), 3),
        "overhead_us_per_iteration": round(statistics.median(diffs), 3),
        "notifications_per_run_incl_init": caught,
        "iterations": iterations,
        "trials": trials,
    }


def check_all(iterations: int, trials: int) -> dict[str, Any]:
    result: dict[str, Any] = {"check": "guard-gpu"}
    if shutil.which("nvidia-smi"):
        result["nvidia_smi"] = count(["nvidia-smi"])
    result["cuda_init"] = count([sys.executable, "-c", CUDA_INIT])
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, check=False).returncode == 0:
        result["torch_init"] = count([sys.executable, "-c", TORCH_INIT])
    result["steady_state"] = steady_state(iterations, trials)
    try:
        result["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        result["driver"] = "unknown"
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["_launch"]:
        sep = args_list.index("--")
        _launch(int(args_list[1]), args_list[2], args_list[sep + 1 :])
        return 127  # execvp returned: impossible
    parser = argparse.ArgumentParser(prog="python -m spotgpu.guard.gpucheck", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_all = sub.add_parser("all", help="every figure, one JSON object")
    p_all.add_argument("--iterations", type=int, default=2000)
    p_all.add_argument("--trials", type=int, default=5)
    p_count = sub.add_parser("count", help="notifications for one command: count -- CMD ARGS")
    p_count.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(args_list)
    if args.command == "all":
        result = check_all(args.iterations, args.trials)
    else:
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not cmd:
            parser.error("count needs a command after --")
        result = count(cmd)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
