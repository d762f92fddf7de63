"""The rule composed into a RuntimeDefault-like profile works in real runc 1.1 with its
libseccomp (root): the session start is caught, ordinary ioctls still pass, and the profile's
own denials still hold. (libseccomp lets an unconditional ioctl ALLOW override a conditional
NOTIFY, which is why the rule rewrites the allow entry; see spotgpu.guard.rule.)"""

from __future__ import annotations

import errno
import time

import pytest

from spotgpu.testing import standin
from spotgpu.testing.guard_testbed import runtime_default_like

from .conftest import OWNER, Node, OwnerBacks

pytestmark = pytest.mark.root


def test_runtime_default_profile_composed_with_the_rule(node: Node) -> None:
    node.holder()
    backs = OwnerBacks()
    guard = node.guard(backs)
    owner = node.container("rd", seccomp=runtime_default_like())
    entries = owner.spec["linux"]["seccomp"]["syscalls"]
    assert "ioctl" not in entries[0]["names"]
    assert guard.wait_until(lambda g: len(g.fds()) == 1, 10)
    # Every ordinary request, sign-extended or not, is still allowed (ENOTTY from the device).
    for request in (
        standin.RM_CONTROL,
        standin.RM_ALLOC,
        standin.UVM_INITIALIZE,
        0x5401,
        0x4600,
        0xFFFF_FFFF_C020_462A,
        0xC008_46D2 ^ 0x4000_0000,
    ):
        result = owner.command(f"loop {standin.CTL} {request:#x} 10")
        assert result["unexpected_errors"] == 0, (hex(request), result)
    guard.arm(OWNER)
    for request in (standin.CHECK_VERSION_STR, 0xFFFF_FFFF_C048_46D2, 0xC000_46D2):
        owner.send(f"call {standin.CTL} {request:#x}")
        assert guard.wait_until(lambda g: len(g.holds()) == 1, 5), hex(request)
        time.sleep(0.05)
        guard.disarm(OWNER)
        assert owner.read(5)["errno"] == errno.ENOTTY
        guard.arm(OWNER)
    assert backs.wait(3, 5)
    # The profile's own denials still apply: mkdir is not in its allow list.
    proc = owner.exec("/bin/busybox", "mkdir", "/tmp/denied")
    _, err = proc.communicate(timeout=10)
    assert proc.returncode != 0 and b"Operation not permitted" in err, err
