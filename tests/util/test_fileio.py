"""write_atomic on real files: a reader never sees a part of a file, an error leaves the old
file and no temporary file, a writer killed outright leaves the old or the new file whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from spotgpu.util import fileio
from spotgpu.util.fileio import write_atomic


def _leftovers(directory: Path, name: str) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(f".{name}."))


@pytest.mark.parametrize("durable", [True, False])
def test_replaces_the_file_with_its_mode_and_leaves_nothing_behind(tmp_path: Path, durable: bool) -> None:
    path = tmp_path / "sub" / "state.json"
    write_atomic(path, b"one", mode=0o644, durable=durable)
    write_atomic(path, b"two", mode=0o600, durable=durable)
    assert path.read_bytes() == b"two" and path.stat().st_mode & 0o777 == 0o600
    assert _leftovers(path.parent, path.name) == []


def test_without_make_parents_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "missing" / "f", b"x", make_parents=False)
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    path = tmp_path / "ledger"
    write_atomic(path, b"old")

    def broken_fsync(fd: int) -> None:
        raise failure

    monkeypatch.setattr(fileio.os, "fsync", broken_fsync)
    with pytest.raises(type(failure)):
        write_atomic(path, b"new" * 1000)
    assert path.read_bytes() == b"old"
    assert _leftovers(tmp_path, "ledger") == []


def test_a_failed_rename_removes_the_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "inside").write_text("keep")  # a non-empty directory cannot be replaced by a file
    with pytest.raises(OSError):
        write_atomic(target, b"data")
    assert (target / "inside").read_text() == "keep" and _leftovers(tmp_path, "taken") == []


def test_a_concurrent_reader_sees_only_whole_versions(tmp_path: Path) -> None:
    path = tmp_path / "record"
    versions = {bytes([65 + i]) * (256 << 10) for i in range(4)}  # 256 KiB each: many write() calls
    write_atomic(path, min(versions), durable=False)
    seen: set[bytes] = set()
    torn: list[int] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            data = path.read_bytes()
            if data in versions:
                seen.add(data)
            else:
                torn.append(len(data))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(60):
            write_atomic(path, sorted(versions)[i % 4], durable=False)
    finally:
        stop.set()
        reader.join(10)
    assert torn == [] and seen <= versions and seen


KILLED_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from spotgpu.util.fileio import write_atomic
    path = Path(sys.argv[1])
    print("ready", flush=True)
    i = 0
    while True:
        write_atomic(path, bytes([65 + i % 2]) * (4 << 20), durable=False)
        i += 1
    """
)


def test_a_writer_killed_mid_write_leaves_a_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "record"
    write_atomic(path, b"A" * (4 << 20))
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(10)
    data = path.read_bytes()
    assert data in (b"A" * (4 << 20), b"B" * (4 << 20))
    # Its temporary file may remain (nothing runs at SIGKILL), never in the target's place.
    assert len(_leftovers(tmp_path, "record")) <= 1
