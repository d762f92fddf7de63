"""The device-node backend with :class:`CgroupPids`: detection looks only at the processes of the
pod cgroups (root, real cgroups): a GPU holder in a pod is seen, a host process holding the same
node is not looked at, and without any pod cgroup root on the machine every process is."""

from __future__ import annotations

import subprocess
import time
import uuid

import pytest
from tests.agent import test_holderscan
from tests.agent.test_holderscan import Pods

from spotgpu.adapters.devnode_gpu import CgroupPids, DeviceNode, DeviceNodeBackend
from spotgpu.adapters.holderscan import hierarchy
from spotgpu.core.ids import DeviceID

pytestmark = pytest.mark.root
GPU = DeviceID("GPU-0")
pods = test_holderscan.pods  # the same fixture: a stand-in GPU and pod cgroups


def _seen(backend: DeviceNodeBackend, pid: int) -> bool:
    deadline = time.monotonic() + 5
    while pid not in {p.pid for p in backend.processes()[GPU]}:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_detection_through_the_pod_cgroups_sees_pods_only(pods: Pods) -> None:
    in_pod = pods.holder(str(uuid.uuid4()), "a" * 64)
    host = subprocess.Popen(["sh", "-c", f"exec 3<>{pods.gpu}; exec sleep 86403"])
    try:
        node = DeviceNode(GPU, str(pods.gpu), 0)
        by_cgroup = DeviceNodeBackend([node], pids=CgroupPids([pods.root]))
        everything = DeviceNodeBackend([node])
        assert _seen(by_cgroup, in_pod.pid)
        assert _seen(everything, host.pid) and _seen(everything, in_pod.pid)
        assert host.pid not in {p.pid for p in by_cgroup.processes()[GPU]}
        assert set(CgroupPids([pods.root]).pids() or []) == {in_pod.pid}
    finally:
        host.kill()
        host.wait()


def test_without_any_pod_cgroup_root_every_process_is_looked_at(pods: Pods) -> None:
    host = subprocess.Popen(["sh", "-c", f"exec 3<>{pods.gpu}; exec sleep 86403"])
    try:
        missing = CgroupPids([f"no-such-root-{uuid.uuid4().hex[:8]}"])
        assert missing.pids() is None and missing.mount == hierarchy()
        assert _seen(DeviceNodeBackend([DeviceNode(GPU, str(pods.gpu), 0)], pids=missing), host.pid)
    finally:
        host.kill()
        host.wait()
