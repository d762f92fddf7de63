"""Compile a small C test program statically, for use inside busybox containers.

Side effects: writes ``<name>.c`` and the binary ``<name>`` into the given directory and runs
the C compiler. The guard's stand-in GPU client and the node end-to-end owner client use it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def compile_static(source: str, directory: Path, name: str) -> Path:
    """Compile ``source`` with ``gcc -static -O2 -Wall`` into ``directory/name``; returns its path."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise FileNotFoundError(f"gcc with a static libc is needed to build {name} (Debian: gcc libc6-dev)")
    directory.mkdir(parents=True, exist_ok=True)
    source_path = directory / f"{name}.c"
    binary = directory / name
    source_path.write_text(source)
    command = [compiler, "-static", "-O2", "-Wall", "-o", str(binary), str(source_path)]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"building {name} failed: {proc.stderr.strip()}")
    return binary


__all__ = ["compile_static"]
