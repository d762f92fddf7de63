"""A minimal OCI runtime wrapper for the containerd test: at ``create`` it adds the guard's rule
to the bundle's config.json (what spotgpu-runtime does for owner containers), then it execs
runc with the same arguments. Usage: wrap_runtime.py LISTENER OWNER -- <runc args>."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from spotgpu.core.refs import ContainerRef
from spotgpu.guard.rule import apply_guard_rule, listener_ready


def main() -> None:
    listener, owner = sys.argv[1], ContainerRef.parse(sys.argv[2])
    args = sys.argv[4:]
    if "create" in args and "--bundle" in args and listener_ready(listener):
        config = Path(args[args.index("--bundle") + 1]) / "config.json"
        spec = json.loads(config.read_text())
        apply_guard_rule(spec, listener_path=listener, owner=owner)
        config.write_text(json.dumps(spec))
    os.execvp("runc", ["runc", *args])


if __name__ == "__main__":
    main()
