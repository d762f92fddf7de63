"""Entry point of ``spotgpu-runtime``: hands every call to the lower runtime (runc).

Side effect: replaces this process with the lower runtime (``os.execvp``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

USAGE = """usage: spotgpu-runtime [runc global flags] COMMAND [flags] [ID]

An OCI runtime wrapper for containerd's runc shim (BinaryName). Every verb is handed to the
lower runtime (SPOTGPU_LOWER_RUNTIME, default: runc) with the same arguments and environment.
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--help"], ["-h"]):
        print(USAGE, end="")
        return 0
    lower = os.environ.get("SPOTGPU_LOWER_RUNTIME", "runc")
    try:
        os.execvp(lower, [lower, *args])
    except OSError as exc:
        print(f"spotgpu-runtime: cannot run lower runtime {lower!r}: {exc.strerror}", file=sys.stderr)
        return 127
