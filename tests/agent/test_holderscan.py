"""The release check on real processes in real cgroups (root): it finds holders of a device by
what they hold (an fd passed with SCM_RIGHTS included), kills exactly the condemned ones, and
leaves the owner, exempt pods and host processes alone. The stand-in GPU is a character device
with /dev/null's numbers (matched by number and path, as on a real node a GPU is by number)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotgpu.adapters.holderscan import DeviceFile, HolderScanner, ReleaseChecker, device_file, hierarchy
from spotgpu.core.holders import ReleaseScope, Verdict
from spotgpu.core.ids import DeviceID
from spotgpu.testing.cgroups import remove_cgroup_tree

pytestmark = pytest.mark.root
GPU = DeviceID("GPU-0")
CGROUP_BASE = Path("/sys/fs/cgroup")


def _hierarchies() -> list[Path]:
    if (CGROUP_BASE / "cgroup.controllers").exists():
        return [CGROUP_BASE]
    # cpuset would need its cpus and mems copied down first; the others take a process as they are
    return [d for d in CGROUP_BASE.iterdir() if (d / "cgroup.procs").exists() and d.name != "cpuset"]


class Pods:
    """Pod cgroups (in every hierarchy, as runc makes them) and processes placed in them."""

    def __init__(self, root: str, gpu: Path) -> None:
        self.root = root
        self.gpu = gpu
        self.procs: list[subprocess.Popen[bytes]] = []

    def place(self, pid: int, uid: str, cid: str) -> None:
        for top in _hierarchies():
            folder = top / self.root / f"pod{uid}" / cid
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "cgroup.procs").write_text(f"{pid}\n")

    def run(self, uid: str, cid: str, script: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(["sh", "-c", f"read go; {script}"], stdin=subprocess.PIPE)
        self.place(proc.pid, uid, cid)
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        self.procs.append(proc)
        return proc

    def holder(self, uid: str, cid: str) -> subprocess.Popen[bytes]:
        return self.run(uid, cid, f"exec 3<>{self.gpu}; exec sleep 86401")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        remove_cgroup_tree(self.root)


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Pods]:
    if os.geteuid() != 0:
        pytest.skip("needs root (cgroups, mknod)")
    gpu = tmp_path / "gpu0"
    os.mknod(gpu, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    node = Pods(f"spotgpu-holders-{uuid.uuid4().hex[:8]}", gpu)
    try:
        yield node
    finally:
        node.close()


def _checker(pods: Pods, gpu: DeviceFile) -> ReleaseChecker:
    return ReleaseChecker(HolderScanner([pods.root]), lambda d: [gpu] if d == GPU else [], list)


def _holds(pid: int, path: Path) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd")):
                return True
        except OSError:
            pass
        time.sleep(0.01)
    return False


def _uid() -> str:
    return str(uuid.uuid4())


def test_a_stand_in_shares_null_s_number_so_its_path_is_part_of_it(pods: Pods) -> None:
    found = device_file(str(pods.gpu), ["/dev/nvidia0"])
    assert found is not None and found.paths == frozenset({str(pods.gpu), "/dev/nvidia0", "/nvidia0"})
    assert device_file(str(pods.gpu.parent)) is None  # not a character device
    assert hierarchy() in _hierarchies()


def test_the_check_kills_a_stranger_holding_the_gpu_and_spares_the_owner_and_exempt_pods(pods: Pods) -> None:
    owner, stranger, exempt, bystander = _uid(), _uid(), _uid(), _uid()
    owner_proc = pods.holder(owner, "a" * 64)
    stranger_proc = pods.holder(stranger, "b" * 64)
    exempt_proc = pods.holder(exempt, "c" * 64)
    bystander_proc = pods.run(bystander, "d" * 64, "exec sleep 86401")  # holds nothing
    assert all(_holds(p.pid, pods.gpu) for p in (owner_proc, stranger_proc, exempt_proc))
    host = subprocess.Popen(["sh", "-c", f"exec 3<>{pods.gpu}; exec sleep 86401"])  # a node daemon
    try:
        gpu = device_file(str(pods.gpu))
        assert gpu is not None
        scope = ReleaseScope(
            owner_pods=frozenset({owner}), exempt_pods=frozenset({exempt}),
            known_pods=frozenset({owner, stranger, exempt, bystander}),
        )  # fmt: skip
        report = _checker(pods, gpu).clear([GPU], scope, time.monotonic() + 10)
        assert report.clean and report.killed == {Verdict.FOREIGN_GPU_HOLDER: 1}
        assert stranger_proc.wait(5) == -9
        assert owner_proc.poll() is None and exempt_proc.poll() is None and bystander_proc.poll() is None
        assert host.poll() is None  # outside the pod cgroups: never looked at
    finally:
        host.kill()
        host.wait()


def test_an_fd_passed_over_a_unix_socket_is_found_in_the_receiver(pods: Pods, tmp_path: Path) -> None:
    """The receiver never opened the device: it got the fd by SCM_RIGHTS from a spot process."""
    sock = tmp_path / "pass.sock"
    receiver_code = (
        "import socket,sys,time\n"
        f"s=socket.socket(socket.AF_UNIX); s.bind({str(sock)!r}); s.listen(1); c,_=s.accept()\n"
        "msg,fds,_,_=socket.recv_fds(c,1,1); print(len(fds),flush=True); time.sleep(86401)\n"
    )
    receiver = subprocess.Popen([sys.executable, "-c", receiver_code], stdout=subprocess.PIPE)
    cpu_pod = _uid()
    pods.place(receiver.pid, cpu_pod, "e" * 64)
    pods.procs.append(receiver)
    deadline = time.monotonic() + 10
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    fd = os.open(pods.gpu, os.O_RDWR)
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(sock))
        socket.send_fds(client, [b"g"], [fd])
    os.close(fd)
    assert receiver.stdout is not None and receiver.stdout.readline().strip() == b"1"
    gpu = device_file(str(pods.gpu))
    assert gpu is not None
    scope = ReleaseScope(owner_pods=frozenset({_uid()}), known_pods=frozenset({cpu_pod}))
    report = _checker(pods, gpu).clear([GPU], scope, time.monotonic() + 10)
    assert report.killed == {Verdict.FOREIGN_GPU_HOLDER: 1} and report.clean
    assert receiver.wait(5) == -9


def test_a_holder_in_any_container_of_a_victim_pod_dies_and_its_other_processes_are_not_waited_for(
    pods: Pods,
) -> None:
    """A native sidecar nobody listed that received the spot container's GPU fd dies with the
    release check; the pod's sandbox and a sidecar holding nothing are left to the pod's deletion
    (killing them would only delay the owner)."""
    victim = _uid()
    pause = pods.run(victim, "f" * 64, "exec sleep 86401")
    idle = pods.run(victim, "8" * 64, "exec sleep 86401")
    holder = pods.holder(victim, "9" * 64)  # e.g. got the fd by SCM_RIGHTS
    assert _holds(holder.pid, pods.gpu)
    gpu = device_file(str(pods.gpu))
    assert gpu is not None
    scope = ReleaseScope(
        owner_pods=frozenset({_uid()}), victim_pods=frozenset({victim}), known_pods=frozenset({victim})
    )
    report = _checker(pods, gpu).clear([GPU], scope, time.monotonic() + 10)
    assert report.killed == {Verdict.VICTIM_POD: 1} and report.clean
    assert holder.wait(5) == -9 and pause.poll() is None and idle.poll() is None


def test_with_the_owner_unknown_no_gpu_holder_is_killed(pods: Pods) -> None:
    someone = pods.holder(_uid(), "a" * 64)
    assert _holds(someone.pid, pods.gpu)
    gpu = device_file(str(pods.gpu))
    assert gpu is not None
    report = _checker(pods, gpu).clear([GPU], ReleaseScope(), time.monotonic() + 5)
    assert not report.owner_known and report.killed == {} and someone.poll() is None
