"""The ``spotgpu-runtime`` console script: the runtime in pure Python, and the fast path's installer.

Side effects: ``install-shim`` writes the shell fast path (:mod:`spotgpu.runtime.shim`); any
other command line is handled like the installed fast path would (modify the spec of a
``create`` through the agent, then ``os.execv`` the lower runtime), with the configuration read
from ``$SPOTGPU_CONFIG`` or ``/etc/spotgpu/config.yaml`` (section ``runtime``).

Configure the installed shell script, not this console script, as containerd's ``BinaryName``:
this entry point starts a full Python with site-packages for every verb (tens of
milliseconds each, ``kill`` included); it exists for ``--help``, installation and debugging.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from spotgpu.runtime.config import DEFAULT_CONFIG_PATH

USAGE = """usage: spotgpu-runtime [runc global flags] COMMAND [flags] [ID]
       spotgpu-runtime install-shim [--config FILE] [--dest DIR] [--python PYTHON] [--print]

An OCI runtime wrapper for containerd's runc shim (runtime option BinaryName). Every verb is
handed to the lower runtime (runc, nvidia-container-runtime or crun) with the same arguments
and environment; for `create`, the spotgpu agent first syncs the GPUs a spot container may use
into its spec and installs the return guard's seccomp rule into GPU owners' specs.

install-shim writes the fast path that containerd should run (a POSIX shell script that starts
Python only for the creates that need it) and prints its path. See docs/runtime.md.

Configuration: section `runtime` of $SPOTGPU_CONFIG (default /etc/spotgpu/config.yaml).
"""


def _config_path() -> Path:
    return Path(os.environ.get("SPOTGPU_CONFIG") or DEFAULT_CONFIG_PATH)


def install(argv: Sequence[str]) -> int:
    from spotgpu.core.errors import SpotgpuError
    from spotgpu.runtime.config import RuntimeConfig, load_runtime_config
    from spotgpu.runtime.shim import install_shim, render_shim, resolve_lower

    parser = argparse.ArgumentParser(prog="spotgpu-runtime install-shim", description="write the shell fast path")
    parser.add_argument("--config", type=Path, default=None, help="node configuration (default: $SPOTGPU_CONFIG)")
    parser.add_argument("--dest", type=Path, default=Path("/usr/local/lib/spotgpu"), help="directory to write to")
    parser.add_argument("--python", default=None, help="host interpreter for the wrapper (default: this one)")
    parser.add_argument("--print", action="store_true", help="print the script instead of installing it")
    args = parser.parse_args(list(argv))
    path = args.config or _config_path()
    try:
        config = load_runtime_config(path) if path.exists() else RuntimeConfig()
        if args.print:
            print(
                render_shim(
                    lower=resolve_lower(config.lower_runtime),
                    python=args.python or sys.executable,
                    lib=str(args.dest / "lib"),
                    agent_socket=str(config.agent_socket),
                    timeout=config.agent_timeout,
                    listener=str(config.guard_listener_path) if config.guard_enabled else None,
                    owner_markers=config.owner_markers,
                    source=str(path),
                ),
                end="",
            )
            return 0
        script = install_shim(args.dest, config, python=args.python, config_path=path if path.exists() else None)
    except (SpotgpuError, OSError) as exc:
        print(f"spotgpu-runtime install-shim: {exc}", file=sys.stderr)
        return 1
    print(script)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--help"], ["-h"], ["help"]):
        print(USAGE, end="")
        return 0
    if args[:1] == ["install-shim"]:
        return install(args[1:])
    from spotgpu.core.errors import SpotgpuError
    from spotgpu.runtime import wrapper
    from spotgpu.runtime.config import RuntimeConfig, load_runtime_config

    path = _config_path()
    try:
        config = load_runtime_config(path) if path.exists() else RuntimeConfig()
    except SpotgpuError as exc:
        print(f"spotgpu-runtime: {exc}", file=sys.stderr)
        return 1
    return wrapper.main(
        args,
        lower=config.lower_runtime,
        agent_socket=str(config.agent_socket),
        timeout=config.agent_timeout,
        listener=str(config.guard_listener_path) if config.guard_enabled else None,
        owner_markers=config.owner_markers,
        fallback=((), str(path) if path.exists() else "") if config.fallback == "local" else None,
    )


if __name__ == "__main__":
    sys.exit(main())
