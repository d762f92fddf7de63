"""Through a real containerd and its runc shim (root): a wrapper runtime adds the guard's rule at
``create`` (as spotgpu-runtime does), the guard maps the container and every ``ctr task exec``
to the owner, and an exec'd session start into an armed owner is held until disarm."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotgpu.testing import standin
from spotgpu.testing.containerd import Containerd

from .conftest import OWNER, Node, OwnerBacks

pytestmark = pytest.mark.root

WRAPPER = Path(__file__).parent / "wrap_runtime.py"


def test_containerd_container_and_exec_are_guarded(node: Node) -> None:
    node.holder()
    backs = OwnerBacks()
    guard = node.guard(backs)
    runtime = node.base / "spotgpu-test-runtime"
    runtime.write_text(f'#!/bin/sh\nexec {sys.executable} {WRAPPER} {node.listener} {OWNER} -- "$@"\n')
    runtime.chmod(0o755)
    with Containerd(node.base / "containerd") as containerd:
        containerd.run_detached("owner-ctr", node.rootfs, ["/bin/sleep", "600"], runc_binary=str(runtime))
        assert guard.wait_until(lambda g: len(g.fds()) == 1, 15), "the container's notify fd never arrived"
        assert guard.fds()[0].owner == OWNER and guard.fds()[0].container_id == "owner-ctr"

        def exec_call(exec_id: str) -> subprocess.Popen[str]:
            return subprocess.Popen(
                ["ctr", "--address", containerd.address, "task", "exec", "--exec-id", exec_id, "owner-ctr",
                 "/bin/guardprobe", "call", "/dev/null", f"{standin.CHECK_VERSION_STR:#x}"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip

        quick = exec_call("e1")
        out, err = quick.communicate(timeout=30)
        assert quick.returncode == 0, err
        assert json.loads(out)["errno"] == errno.ENOTTY
        guard.arm(OWNER)
        held = exec_call("e2")
        assert backs.wait(1, 15), "owner-back not signalled for the exec"
        time.sleep(0.2)
        assert held.poll() is None
        guard.disarm(OWNER)
        out, err = held.communicate(timeout=30)
        assert held.returncode == 0, err
        result = json.loads(out)
        assert result["errno"] == errno.ENOTTY and (result["end_ns"] - result["start_ns"]) / 1e9 >= 0.2
