"""Replacing a file atomically: :func:`write_atomic`.

Side effects: creates a temporary file next to the target, renames it over the target and,
when ``durable``, flushes both to the disk. What a reader sees is the old file or the new one,
never a part of either: the rename is atomic within one filesystem, which is why the temporary
file is in the target's own directory. On an error (and on ``KeyboardInterrupt``) the
temporary file is removed and the target is untouched. A process killed outright mid-write
(SIGKILL, power loss) can leave its temporary file (``.<name>.<random>``) behind, never a torn
target.

The shell fast path's wrapper (:func:`spotgpu.runtime.wrapper.write_atomically`) keeps its own
copy; its docstring says why.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(
    path: Path, data: bytes, *, mode: int = 0o600, durable: bool = True, make_parents: bool = True
) -> None:
    """Replace ``path`` by ``data``, with permission bits ``mode``.

    ``durable``: ``fsync`` the file before the rename and its directory after it, so that the
    new content survives a power loss once this returns. Without it the replacement is still
    atomic for every reader and survives crashes of processes, but a power loss may bring back
    the old content (cheaper: no disk flush). ``make_parents``: create missing directories.
    Raises ``OSError``; then ``path`` is unchanged and the temporary file is gone.
    """
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # O_EXCL, mode 0600
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (the directory entry lives in the directory's blocks)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["write_atomic"]
