"""Prepared claims on real containerd 2.2.7 through CRI (root): the spot container gets the
(stand-in) GPU by containerd's own CDI injection from the spec our writer wrote, the kubelet
passing the CDI IDs in ``CDI_devices`` as it does since 1.31; a claim the plugin refuses, or one
taken back on the owner's return, never yields a device.

The stand-in GPU is a character device 195:7 (NVIDIA's major, no driver): outside runc's default
device rules, so an ``open`` that fails with ENXIO ("No such device or address") proves the
container's device cgroup allows it (EPERM would mean CDI did not add the rule)
(shared/reference/cdi-containerd22.md section 6).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.dra.helpers import DRIVER, GPU0, claim
from tests.dra.rig import Rig, dra_rig

from spotgpu.testing.cgroups import remove_cgroup_tree
from spotgpu.testing.cri import ContainerSpec, CriError, DeviceOptions, KubeletCri, PodSpec
from spotgpu.testing.cri_containerd import CriContainerd, CriSettings

pytestmark = pytest.mark.root

PROBE = (
    "stat -c %t:%T /dev/nvidia0; echo VISIBLE=$NVIDIA_VISIBLE_DEVICES; echo LENT=$SPOTGPU_DRA_DEVICE_0; "
    "head -c1 /dev/nvidia0"
)


@pytest.fixture
def node(cri_images: list[Path], containerd_binaries: Callable[[str], Any]) -> Iterator[tuple[Rig, KubeletCri]]:
    binaries = containerd_binaries("2.2")
    base = Path(tempfile.mkdtemp(prefix="dracd.", dir="/tmp"))
    fake = base / "fakegpu0"
    os.mknod(fake, 0o666 | stat.S_IFCHR, os.makedev(195, 7))
    cgroup = f"spotgpu-dra-{os.getpid()}"
    with dra_rig(str(fake)) as rig:
        ctd = CriContainerd(base / "c", binaries, CriSettings(cdi_dirs=(str(rig.cdi_dir),)), cri_images)
        cri: KubeletCri | None = None
        try:
            ctd.start()
            cri = KubeletCri(ctd.address, cgroup_root=cgroup, log_root=base / "logs")
            rig.start_plugin()
            yield rig, cri
        except CriError as exc:
            pytest.fail(f"{exc}\n{ctd.log_tail()}")
        finally:
            if cri is not None:
                cri.delete_all()
                cri.close()
            ctd.stop()
            remove_cgroup_tree(cgroup)
            shutil.rmtree(base, ignore_errors=True)


def run_spot(cri: KubeletCri, name: str, cdi_ids: tuple[str, ...]) -> str:
    pod = cri.run_pod(PodSpec("spot", name))
    pod.grants["worker"] = DeviceOptions(cdi_devices=cdi_ids)  # the kubelet's CDI_devices for the claim
    return cri.run_container(pod, ContainerSpec("worker"))


def probe(cri: KubeletCri, cid: str) -> str:
    answer = cri.exec_sync(cid, ["sh", "-c", PROBE + " 2>&1; true"])
    return bytes(answer.stdout).decode()


def test_a_prepared_claim_reaches_the_spot_container_through_containerds_cdi(node: tuple[Rig, KubeletCri]) -> None:
    rig, cri = node
    key = rig.put_claim(claim())
    answer = rig.kubelet.prepare(DRIVER, [key])[key[2]]
    assert answer.error == ""
    [(_, _, _, cdi_ids)] = answer.devices
    cid = run_spot(cri, "spot-job-0", cdi_ids)
    out = probe(cri, cid)
    assert out.splitlines()[0] == "c3:7", out  # 195:7 as the node the spec names
    assert f"VISIBLE={GPU0}" in out and f"LENT={GPU0}" in out
    assert "No such device or address" in out, "the device cgroup allows it (EPERM would mean it does not)"
    control = cri.run_container(cri.pods[("spot", "spot-job-0")], ContainerSpec("control"))
    assert "No such file" in probe(cri, control), "a container without the claim has no device"


def test_a_refused_claim_never_yields_a_device(node: tuple[Rig, KubeletCri]) -> None:
    rig, cri = node
    key = rig.put_claim(claim(["spot-gpu-1bb"]))  # GPU1's owner is active: not lent
    answer = rig.kubelet.prepare(DRIVER, [key])[key[2]]
    assert "not-lent" in answer.error and answer.devices == ()
    # a container that names the CDI device the claim would have had is refused by containerd
    forged = (f"k8s.{DRIVER}/claim={key[2]}-spot-gpu-1bb",)
    with pytest.raises(CriError, match="unresolvable CDI devices"):
        run_spot(cri, "spot-job-1", forged)


def test_after_the_owner_returns_no_new_container_gets_the_device(node: tuple[Rig, KubeletCri]) -> None:
    rig, cri = node
    key = rig.put_claim(claim())
    [(_, _, _, cdi_ids)] = rig.kubelet.prepare(DRIVER, [key])[key[2]].devices
    run_spot(cri, "spot-job-2", cdi_ids)
    rig.node.lent[GPU0] = False
    assert rig.driver is not None
    rig.driver.revoke({GPU0})  # the return path
    with pytest.raises(CriError, match="unresolvable CDI devices"):
        run_spot(cri, "spot-job-3", cdi_ids)  # e.g. the kubelet restarting the container with its old grant
