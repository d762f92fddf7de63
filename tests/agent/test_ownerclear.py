"""The fd holder's release check on real processes in real cgroups and mount namespaces (root):
before the holder releases an owner's call by itself (no agent), every process of another pod
holding one of the GPU nodes the owner's container has is killed; the owner's pod, host
processes and holders of other devices are spared; an owner outside any pod kills nothing.

The stand-in GPU is ``/dev/nvidia0`` with ``/dev/null``'s numbers on a private ``/dev`` (tmpfs in
a mount namespace of its own per process, as a container has), so it is matched by number and
by the path containers see."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.agent.test_holderscan import Pods

from spotgpu.adapters.holderscan import HolderScanner
from spotgpu.adapters.ownerclear import OwnerClearer, owner_gpu_files

pytestmark = pytest.mark.root

OWN_DEV = "mount -t tmpfs none /dev && mknod /dev/nvidia0 c 1 3 && mknod /dev/nvidiactl c 1 3 && mknod /dev/null c 1 3"


class Containers(Pods):
    """Processes in pod cgroups, each in a mount namespace with its own ``/dev/nvidia0``."""

    def contained(self, uid: str, cid: str, script: str) -> subprocess.Popen[bytes]:
        inner = f"{OWN_DEV} && {script}"
        return self.run(uid, cid, f"exec unshare --mount --propagation private sh -c '{inner}'")


@pytest.fixture
def pods() -> Iterator[Containers]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (cgroups, mount namespaces, mknod)")
    node = Containers(f"spotgpu-ownerclear-{uuid.uuid4().hex[:8]}", Path("/dev/null"))
    try:
        yield node
    finally:
        node.close()


def _holds(pid: int, path: str) -> bool:
    """Whether ``pid`` (or the process it exec'd into) holds ``path`` open, within 5 s."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == path for fd in os.listdir(f"/proc/{pid}/fd")):
                return True
        except OSError:
            pass
        time.sleep(0.01)
    return False


def _alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def _uid() -> str:
    return str(uuid.uuid4())


def test_the_holder_s_check_kills_other_pods_on_the_owner_s_gpu_and_spares_the_rest(pods: Containers) -> None:
    owner, stranger, other = _uid(), _uid(), _uid()
    owner_proc = pods.contained(owner, "a" * 64, "exec 3<>/dev/nvidia0; exec sleep 86402")
    owner_sidecar = pods.contained(owner, "b" * 64, "exec 3<>/dev/nvidia0; exec sleep 86402")
    stranger_proc = pods.contained(stranger, "c" * 64, "exec 3<>/dev/nvidia0; exec sleep 86402")
    control_only = pods.contained(other, "d" * 64, "exec 3<>/dev/nvidiactl; exec sleep 86402")
    null_user = pods.contained(other, "e" * 64, "exec 3<>/dev/null; exec sleep 86402")
    host = subprocess.Popen(["sleep", "86402"])  # a node daemon: never walked
    try:
        assert all(_holds(p.pid, "/dev/nvidia0") for p in (owner_proc, owner_sidecar, stranger_proc))
        assert _holds(control_only.pid, "/dev/nvidiactl") and _holds(null_user.pid, "/dev/null")
        files = owner_gpu_files(owner_proc.pid)
        assert len(files) == 1 and files[0].paths is not None and "/dev/nvidia0" in files[0].paths

        line = OwnerClearer(HolderScanner([pods.root])).clear(owner_proc.pid)

        assert "killed 1 holder(s)" in line, line
        stranger_proc.wait(5)
        assert not _alive(stranger_proc)
        assert all(_alive(p) for p in (owner_proc, owner_sidecar, control_only, null_user, host))
    finally:
        host.kill()
        host.wait()


def test_an_owner_in_no_pod_cgroup_kills_nothing(pods: Containers) -> None:
    stranger = pods.contained(_uid(), "f" * 64, "exec 3<>/dev/nvidia0; exec sleep 86402")
    loose = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", f"{OWN_DEV} && exec sleep 86402"]
    )
    try:
        assert _holds(stranger.pid, "/dev/nvidia0")
        line = OwnerClearer(HolderScanner([pods.root])).clear(loose.pid)
        assert "owner unknown: nothing killed" in line
        assert _alive(stranger)
    finally:
        loose.kill()
        loose.wait()


def test_a_gone_owner_process_or_a_failing_walk_never_raises(pods: Containers) -> None:
    line = OwnerClearer(HolderScanner([pods.root])).clear(2**22 + 1)  # no such PID
    assert "nothing killed" in line
