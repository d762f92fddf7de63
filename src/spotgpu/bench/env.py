"""What every benchmark result carries: a reproducible CPU load and the environment it ran in.

A GPU node is rarely quiet (data loaders keep every core busy), and a shared CI machine is not
quiet either; a figure means little without the load it was taken under. Two tools:

* :func:`background_load` (context manager): ``n`` CPU-bound processes at normal priority
  (nice 0) for the duration of a block, each a tight loop in a fresh interpreter of this
  Python (no ``multiprocessing``). They are SIGKILLed and reaped when the block ends, also on an
  exception or Ctrl-C; should this process die without running its ``finally`` (SIGKILL), each
  loop notices within a few ms that its parent changed and exits by itself.
* :func:`environment`: the JSON block a result carries: cores usable by this process, the load
  average before and after the measurement (the caller reads both with :func:`load_average`),
  kernel, runc and containerd versions (the one on ``PATH`` and any binaries named), Python,
  the background load, the git revision and dirty flag of the checkout the code runs from, the
  UTC date, the host name and the command line.

Use::

    from spotgpu.bench import env

    before = env.load_average()
    with env.background_load(2):
        figures = measure()
    figures["environment"] = env.environment(background_load=2, load_before=before, load_after=env.load_average())

Benchmarks take ``--background-load`` through :func:`add_arguments`. Side effects: starts and
kills the load processes; runs ``runc --version``, ``containerd --version`` and ``git``
(each bounded by a timeout; a missing tool reads as ``None``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

LoadAverage = tuple[float, float, float]

_SPIN = """
import os, sys
try:
    os.setpriority(os.PRIO_PROCESS, 0, 0)
except OSError:
    pass
parent = os.getppid()
sys.stdout.write("r")
sys.stdout.flush()
while os.getppid() == parent:
    for _ in range(1 << 18):
        pass
"""
"""The load process: nice 0 (a root parent may be niced; a non-root one cannot lower it), one
byte on stdout once it spins, then a pure busy loop that checks every few ms whether its parent
is still the one that started it."""

_START_TIMEOUT = 30.0
_TOOL_TIMEOUT = 5.0


def load_average() -> LoadAverage:
    """The 1, 5 and 15 minute load averages now."""
    one, five, fifteen = os.getloadavg()
    return (round(one, 2), round(five, 2), round(fifteen, 2))


def cores() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0))


@contextlib.contextmanager
def background_load(n: int) -> Iterator[list[int]]:
    """Run ``n`` busy-loop processes (nice 0) while the block runs; yields their PIDs.

    Returns once every process spins (bounded wait); on exit each is SIGKILLed and reaped."""
    if n < 0:
        raise ValueError(f"background load must be >= 0, not {n}")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-S", "-c", _SPIN],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    start_new_session=True,  # Ctrl-C in a terminal reaches us, not them (no tracebacks)
                )
            )
        deadline = time.monotonic() + _START_TIMEOUT
        for proc in procs:
            assert proc.stdout is not None
            if not _ready(proc, deadline):
                raise RuntimeError(f"background load process {proc.pid} did not start within {_START_TIMEOUT}s")
        yield [p.pid for p in procs]
    finally:
        _kill_all(procs)


HOST_FILES = ("/etc/hostname", "/etc/passwd", "/etc/hosts", "/proc/self/stat")
"""What every other host process holds open (besides its standard streams)."""


@contextlib.contextmanager
def host_processes(n: int, sleeper: str = "/bin/busybox") -> Iterator[list[int]]:
    """``n`` idle processes that have nothing to do with the node (a crowded host: daemons,
    shells, monitoring): every other one holds :data:`HOST_FILES` open as well. Yields their
    PIDs once all started; on exit each is SIGKILLed and reaped."""
    if n < 0:
        raise ValueError(f"host processes must be >= 0, not {n}")
    opens = " ".join(f"{3 + i}<{path}" for i, path in enumerate(HOST_FILES))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(n):
            script = f"exec {opens} {sleeper} sleep 1000000" if i % 2 else f"exec {sleeper} sleep 1000000"
            procs.append(
                subprocess.Popen(
                    [sleeper, "sh", "-c", script],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + _START_TIMEOUT
        for proc in procs:  # started once each sh has exec'd its sleep (its fds stay open)
            while proc.poll() is None and _argv1(proc.pid) != "sleep" and time.monotonic() < deadline:
                time.sleep(0.005)
        yield [p.pid for p in procs]
    finally:
        _kill_all(procs)


def _argv1(pid: int) -> str | None:
    """The first argument of our own child ``pid`` (``sleep`` once its ``sh`` exec'd it)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return argv[1].decode() if len(argv) > 1 else None


def _ready(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Wait for the process's one-byte "spinning" signal."""
    import select

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    while (remaining := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([fd], [], [], remaining)
        if readable:
            return os.read(fd, 1) == b"r"
    return False


def _kill_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


# -- the environment block -------------------------------------------------------------------


def _first_line(argv: Sequence[str], cwd: Path | None = None) -> str | None:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=_TOOL_TIMEOUT, check=False, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = proc.stdout.strip().splitlines()
    return lines[0].strip() if proc.returncode == 0 and lines else None


def runc_version(binary: str = "runc") -> dict[str, str | None] | None:
    """``{"path", "version"}`` of ``binary`` (``runc version 1.1.5`` -> ``1.1.5``); None when absent."""
    path = shutil.which(binary)
    if path is None:
        return None
    line = _first_line([path, "--version"])
    return {"path": path, "version": line.split()[-1] if line else None}


def containerd_version(binary: str | os.PathLike[str] = "containerd") -> dict[str, str | None] | None:
    """``{"path", "version"}`` of a containerd binary (the third word of ``containerd --version``:
    ``containerd github.com/containerd/containerd 1.6.20~ds1 ...``); None when absent."""
    path = shutil.which(os.fspath(binary))
    if path is None:
        return None
    line = _first_line([path, "--version"])
    words = line.split() if line else []
    return {"path": path, "version": words[2] if len(words) >= 3 else line}


def git_revision(directory: Path | None = None) -> dict[str, Any] | None:
    """``{"revision", "dirty"}`` of the checkout holding ``directory`` (default: this package's
    source); None when it is not a git checkout (an installed wheel) or git is missing. Changes
    under ``docs/results`` do not count: a batch of runs writes its result files there."""
    where = directory or Path(__file__).resolve().parent
    base = ["git", "-c", "safe.directory=*", "-C", str(where)]
    revision = _first_line([*base, "rev-parse", "HEAD"])
    if revision is None:
        return None
    try:
        status = subprocess.run(
            [*base, "status", "--porcelain", "--", ":(top)", ":(exclude,top)docs/results"],
            capture_output=True,
            text=True,
            timeout=_TOOL_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {"revision": revision, "dirty": None}
    return {"revision": revision, "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


def _command() -> str:
    argv = sys.argv
    if argv and Path(argv[0]).name in ("spotgpu", "__main__.py"):
        return shlex.join(["spotgpu", *argv[1:]])
    return shlex.join(argv)


def environment(
    *,
    background_load: int | Sequence[int],
    load_before: LoadAverage,
    load_after: LoadAverage,
    containerd_binaries: Sequence[str | os.PathLike[str]] = (),
    note: str | None = None,
) -> dict[str, Any]:
    """The environment block of a result (see module docstring). ``containerd_binaries``: more
    containerd binaries to report beside the one on ``PATH`` (e.g. a 2.x build a run used)."""
    uname = platform.uname()
    binaries = ["containerd", *(os.fspath(b) for b in containerd_binaries)]
    found = [containerd_version(b) for b in dict.fromkeys(binaries)]
    block: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "command": _command(),
        "cores": cores(),
        "cpu_count": os.cpu_count(),
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "background_load": background_load if isinstance(background_load, int) else list(background_load),
        "kernel": {"release": uname.release, "version": uname.version, "machine": uname.machine},
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "runc": runc_version(),
        "containerd": [f for f in found if f is not None],
        "git": git_revision(),
    }
    if note is not None:
        block["note"] = note
    return block


# -- command-line arguments --------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    """argparse type for ``1,8,16,32``: non-negative integers, in the order given, no repeats."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return list(dict.fromkeys(values))


def non_negative(text: str) -> int:
    """argparse type: one integer >= 0."""
    values = int_list(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one non-negative integer, got {text!r}")
    return values[0]


def add_arguments(parser: argparse.ArgumentParser, *, several: bool = False) -> None:
    """``--background-load`` (one N, or with ``several`` a list such as ``0,2``: each measured
    in the same run) and ``--containerd-binary`` (reported in the environment block)."""
    if several:
        parser.add_argument(
            "--background-load",
            type=int_list,
            default=[0],
            metavar="N[,N...]",
            help="busy-loop processes (nice 0) running while measuring; a list measures each (default 0)",
        )
    else:
        parser.add_argument(
            "--background-load",
            type=non_negative,
            default=0,
            metavar="N",
            help="busy-loop processes (nice 0) running while measuring (default 0)",
        )
    parser.add_argument(
        "--containerd-binary",
        action="append",
        default=[],
        metavar="PATH",
        help="also report this containerd binary's version in the environment block (repeatable)",
    )


__all__ = [
    "HOST_FILES",
    "host_processes",
    "LoadAverage",
    "add_arguments",
    "background_load",
    "containerd_version",
    "cores",
    "environment",
    "git_revision",
    "int_list",
    "load_average",
    "non_negative",
    "runc_version",
]
