"""Removing a test run's cgroup folders.

Side effects: ``rmdir`` of empty cgroup directories under ``/sys/fs/cgroup``. runc removes each
container's own cgroup; the kubelet-style pod folders above them belong to whoever made them
(the node end-to-end harness, the CRI rig), which calls this at the end.
"""

from __future__ import annotations

import contextlib
from pathlib import Path


def remove_cgroup_tree(name: str, root: Path = Path("/sys/fs/cgroup")) -> None:
    """Remove the (empty) cgroup directories ``/<name>/...`` in every hierarchy: runc removes each
    container's own cgroup; the kubelet-style pod directories above them are the caller's."""
    tops = [root / name, *(d / name for d in root.iterdir() if d.is_dir() and not d.is_symlink())]
    for top in tops:
        if not top.is_dir():
            continue
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


__all__ = ["remove_cgroup_tree"]
