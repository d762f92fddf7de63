"""An unpinned task's init from its shim's bundle (spotgpu.adapters.taskbundle): the names that
can reach a file (CRI IDs, containerd namespaces: nothing climbs out of the state folder), the
file's content, and the cgroup check that keeps a reused PID from being accepted. Files under
tmp_path; real processes for the pidfds."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotgpu.adapters.taskbundle import TASK_DIR, init_pid, pid_file, pin_init

CID = "ab" * 32
OTHER = "cd" * 32
NS = "k8s.io"


def bundle(state: Path, pid_text: str, cid: str = CID, ns: str = NS) -> Path:
    d = state / TASK_DIR / ns / cid
    d.mkdir(parents=True, exist_ok=True)
    (d / "init.pid").write_text(pid_text)
    return d / "init.pid"


def fake_cgroup(proc: Path, pid: int, cid: str) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-{cid}.scope\n"
    )


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "1000"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def test_the_pid_file_of_a_cri_container_is_read(tmp_path: Path) -> None:
    bundle(tmp_path, "4242\n")
    assert init_pid(tmp_path, NS, CID) == 4242


@pytest.mark.parametrize("text", ["", "abc", "1", "0", "-5", "12 13", "99999999999", "4242x"])
def test_a_pid_file_that_names_no_process_we_may_signal_is_refused(tmp_path: Path, text: str) -> None:
    bundle(tmp_path, text)
    assert init_pid(tmp_path, NS, CID) is None


@pytest.mark.parametrize(
    ("ns", "cid"),
    [(NS, "victim-0"), (NS, CID.upper()), (NS, "../" + CID), ("..", CID), (".", CID), ("a/b", CID), ("", CID)],
)
def test_names_other_than_cri_ids_and_namespace_names_are_refused(tmp_path: Path, ns: str, cid: str) -> None:
    (tmp_path / TASK_DIR / NS / CID).mkdir(parents=True)
    (tmp_path / TASK_DIR / NS / CID / "init.pid").write_text("4242")
    assert init_pid(tmp_path, ns, cid) is None


def test_a_symlinked_pid_file_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("4242")
    path = bundle(tmp_path, "1")
    path.unlink()
    path.symlink_to(elsewhere)
    assert init_pid(tmp_path, NS, CID) is None


@settings(max_examples=500, deadline=None)
@given(ns=st.text(max_size=20), cid=st.text(max_size=70))
def test_no_name_leads_outside_the_task_folder(ns: str, cid: str) -> None:
    state = Path("/run/containerd")
    path = pid_file(state, ns, cid)
    if path is None:
        return
    normal = Path(os.path.normpath(path))
    assert normal == path and normal.parent.parent.parent == state / TASK_DIR and normal.name == "init.pid"
    assert normal.parent.name == cid and normal.parent.parent.name == ns


@given(
    ns=st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\.[a-z0-9]+)?", fullmatch=True),
    cid=st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
)
def test_every_cri_id_in_a_namespace_has_its_file(ns: str, cid: str) -> None:
    assert pid_file(Path("/run/containerd"), ns, cid) == Path("/run/containerd") / TASK_DIR / ns / cid / "init.pid"


def test_a_running_init_in_the_containers_cgroup_is_pinned(tmp_path: Path, child: subprocess.Popen[bytes]) -> None:
    state, proc = tmp_path / "state", tmp_path / "proc"
    bundle(state, str(child.pid))
    fake_cgroup(proc, child.pid, CID)
    found = pin_init(state, NS, CID, proc_root=proc)
    assert found is not None
    pid, fd = found
    try:
        assert pid == child.pid
        assert (
            int(
                next(
                    ln for ln in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines() if ln.startswith("Pid:")
                ).split()[1]
            )
            == pid
        )
    finally:
        os.close(fd)


def test_a_pid_now_of_another_containers_process_is_refused(tmp_path: Path, child: subprocess.Popen[bytes]) -> None:
    """The attack: the task's init exited and its PID now names another process (another
    tenant's, or a host process). Its cgroup does not name this container: never pinned, so
    never signalled; the caller asks containerd instead."""
    state, proc = tmp_path / "state", tmp_path / "proc"
    bundle(state, str(child.pid))
    fake_cgroup(proc, child.pid, OTHER)
    assert pin_init(state, NS, CID, proc_root=proc) is None
    (proc / str(child.pid) / "cgroup").write_text("0::/system.slice/sshd.service\n")
    assert pin_init(state, NS, CID, proc_root=proc) is None
    assert child.poll() is None


def test_an_exited_init_is_refused(tmp_path: Path) -> None:
    state, proc = tmp_path / "state", tmp_path / "proc"
    gone = subprocess.Popen(["true"])
    gone.wait(10)
    bundle(state, str(gone.pid))
    fake_cgroup(proc, gone.pid, CID)
    assert pin_init(state, NS, CID, proc_root=proc) is None
