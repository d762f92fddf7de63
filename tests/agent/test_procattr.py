"""Process attribution: every cgroup path shape of protocols.md section 8.2, table-driven,
plus real /proc reads of this test's own process and a property test of the parser."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.adapters.procattr import ContainerRefPoint, ProcessAttributor, parse_cgroup, pid_namespace, read_cgroup
from spotgpu.util.cgroupfile import cgroup_lines

CID = "0123456789abcdef" * 4
UID = "6b5e4c1a-2f3d-4e5f-8a9b-0c1d2e3f4a5b"
UID_ = UID.replace("-", "_")

# (id, /proc/<pid>/cgroup text, expected pod uid, expected container id)
CASES = [
    (
        "v2-systemd-containerd-burstable",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        UID,
        CID,
    ),
    (
        "v2-systemd-containerd-besteffort",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        UID,
        CID,
    ),
    (
        "v2-systemd-containerd-guaranteed",
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        UID,
        CID,
    ),
    (
        "v2-systemd-crio",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope\n",
        UID,
        CID,
    ),
    (
        "v2-systemd-crio-conmon-is-not-the-container",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{CID}.scope\n",
        UID,
        None,
    ),
    ("v2-cgroupfs-burstable", f"0::/kubepods/burstable/pod{UID}/{CID}\n", UID, CID),
    ("v2-cgroupfs-besteffort", f"0::/kubepods/besteffort/pod{UID}/{CID}\n", UID, CID),
    ("v2-cgroupfs-guaranteed", f"0::/kubepods/pod{UID}/{CID}\n", UID, CID),
    (
        "v2-cgroup-namespace-dotdot",
        f"0::/../../kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        UID,
        CID,
    ),
    ("v2-cgroupfs-dotdot", f"0::/../../../kubepods/burstable/pod{UID}/{CID}\n", UID, CID),
    ("v2-docker-outside-kubernetes", f"0::/system.slice/docker-{CID}.scope\n", None, CID),
    (
        "v1-cgroupfs-many-hierarchies",
        (
            f"12:pids:/kubepods/burstable/pod{UID}/{CID}\n"
            f"11:devices:/kubepods/burstable/pod{UID}/{CID}\n"
            f"4:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n"
            f"1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n"
        ),
        UID,
        CID,
    ),
    (
        "v1-systemd-hybrid-with-unified-root",
        (
            f"11:devices:/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
            f"4:memory:/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
            "0::/\n"
        ),
        UID,
        CID,
    ),
    ("host-process", "0::/system.slice/kubelet.service\n", None, None),
    ("host-init", "0::/init.scope\n", None, None),
    ("ctr-container-default-namespace", "0::/default/spot-0\n", None, None),
    ("pod-level-cgroup-only", f"0::/kubepods/burstable/pod{UID}\n", UID, None),
]


@pytest.mark.parametrize(("text", "pod_uid", "container_id"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_path_shapes(text: str, pod_uid: str | None, container_id: str | None) -> None:
    identity = parse_cgroup(text)
    assert identity is not None
    assert identity.pod_uid == pod_uid
    assert identity.container_id == container_id
    assert ".." not in identity.path.split("/")


def test_v1_lines_split_per_controller() -> None:
    lines = cgroup_lines("4:cpu,cpuacct:/a\n0::/b\ngarbage\n")
    assert lines == {"cpu": "/a", "cpuacct": "/a", "": "/b"}


def test_empty_text_is_none() -> None:
    assert parse_cgroup("") is None
    assert parse_cgroup("not a cgroup file") is None


@given(st.text(max_size=400))
def test_parser_never_raises(text: str) -> None:
    identity = parse_cgroup(text)
    if identity is not None:
        assert identity.path.startswith("/")
        assert identity.container_id is None or len(identity.container_id) == 64


def test_reads_own_process() -> None:
    identity = read_cgroup(os.getpid())
    assert identity is not None and identity.path.startswith("/")
    assert pid_namespace(os.getpid()) is not None
    assert read_cgroup(2**22 + 12345) is None
    assert pid_namespace(2**22 + 12345) is None


def test_attributor_matches_by_container_id_and_path(tmp_path: Path) -> None:
    """A fake /proc tree (real files) with a k8s container and a ctr-style container."""
    for pid, text in ((100, f"0::/kubepods/pod{UID}/{CID}\n"), (200, "0::/default/spot-0\n"), (300, "0::/\n")):
        (tmp_path / str(pid) / "ns").mkdir(parents=True)
        (tmp_path / str(pid) / "cgroup").write_text(text)
    attributor = ProcessAttributor(tmp_path)
    refs = {
        CID: ContainerRefPoint(CID),
        "spot-0": ContainerRefPoint("spot-0", cgroup_path="/default/spot-0"),
        "root": ContainerRefPoint("root", cgroup_path="/"),
    }
    assert attributor.attribute([100, 200, 300, 400], refs) == {100: CID, 200: "spot-0"}


def test_attributor_matches_by_pid_namespace(tmp_path: Path) -> None:
    (tmp_path / "7" / "ns").mkdir(parents=True)
    (tmp_path / "7" / "cgroup").write_text("0::/somewhere\n")
    os.symlink("pid:[4026532999]", tmp_path / "7" / "ns" / "pid")
    attributor = ProcessAttributor(tmp_path)
    assert attributor.owner_of(7, [ContainerRefPoint("c1", pid_ns=4026532999)]) == "c1"
    assert attributor.owner_of(7, [ContainerRefPoint("c1", pid_ns=4026532000)]) is None
