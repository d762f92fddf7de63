"""The CPU-weight raise of a return (spotgpu.util.cpuboost): which files, counted raises, restores
that keep a value the cgroup's owner wrote meanwhile, and paths that cannot lead outside the
cgroup mount. Fake trees under tmp_path for the rules; a real cgroup (root) for the kernel's
files."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.util.cpuboost import V1_MAX_SHARES, V2_MAX_WEIGHT, CpuBoost, Knob, cpu_knobs


def fake_tree(tmp_path: Path, cgroup_line: str, dirs: dict[str, dict[str, str]], *, v2: bool) -> tuple[Path, Path]:
    """A /proc/4242/cgroup with ``cgroup_line`` and a cgroup mount with ``dirs`` (path -> files)."""
    proc, root = tmp_path / "proc", tmp_path / "cg"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cgroup").write_text(cgroup_line + "\n")
    mount = root if v2 else root / "cpu"
    mount.mkdir(parents=True)
    if v2:
        (root / "cgroup.controllers").write_text("cpu memory pids\n")
    for rel, files in dirs.items():
        d = mount / rel
        d.mkdir(parents=True, exist_ok=True)
        for name, value in files.items():
            (d / name).write_text(value + "\n")
    return proc, root


def test_v1_chain_is_the_cpu_hierarchy_from_the_leaf_up_to_below_the_root(tmp_path: Path) -> None:
    dirs = {
        "kubepods": {"cpu.shares": "2048"},
        "kubepods/besteffort": {"cpu.shares": "2"},
        "kubepods/besteffort/podA": {"cpu.shares": "2", "cpu.idle": "1"},
        "kubepods/besteffort/podA/c1": {"cpu.shares": "2"},
    }
    proc, root = fake_tree(tmp_path, "4:cpu,cpuacct:/kubepods/besteffort/podA/c1\n0::/", dirs, v2=False)
    knobs = cpu_knobs(4242, proc_root=proc, cgroup_root=root)
    cpu = root / "cpu"
    assert [k.file.relative_to(cpu).as_posix() for k in knobs] == [
        "kubepods/besteffort/podA/c1/cpu.shares",
        "kubepods/besteffort/podA/cpu.shares",
        "kubepods/besteffort/podA/cpu.idle",
        "kubepods/besteffort/cpu.shares",
        "kubepods/cpu.shares",
    ]
    assert {k.value for k in knobs if k.file.name == "cpu.shares"} == {str(V1_MAX_SHARES)}


def test_v2_chain_uses_cpu_weight_where_the_controller_is_enabled(tmp_path: Path) -> None:
    slice_ = "kubepods.slice/kubepods-besteffort.slice"
    dirs = {
        "kubepods.slice": {"cpu.weight": "100"},
        slice_: {"cpu.weight": "1"},
        f"{slice_}/pod.slice": {},  # no cpu controller here: nothing to raise
        f"{slice_}/pod.slice/cri-containerd-x.scope": {"cpu.weight": "1", "cpu.idle": "0"},
    }
    proc, root = fake_tree(tmp_path, f"0::/{slice_}/pod.slice/cri-containerd-x.scope", dirs, v2=True)
    knobs = cpu_knobs(4242, proc_root=proc, cgroup_root=root)
    assert [(k.file.parent.name, k.file.name, k.value) for k in knobs] == [
        ("cri-containerd-x.scope", "cpu.weight", str(V2_MAX_WEIGHT)),
        ("cri-containerd-x.scope", "cpu.idle", "0"),
        ("kubepods-besteffort.slice", "cpu.weight", str(V2_MAX_WEIGHT)),
        ("kubepods.slice", "cpu.weight", str(V2_MAX_WEIGHT)),
    ]


@pytest.mark.parametrize(
    "line",
    ["4:cpu:/", "4:cpu:/../../escape", "4:cpu:/a/../../escape", "4:cpu:/a/./b", "4:memory:/a", "garbage"],
)
def test_no_knobs_for_the_root_for_dotted_paths_or_without_a_cpu_line(tmp_path: Path, line: str) -> None:
    """A path seen through a cgroup namespace (``/../..``) names no cgroup of this mount."""
    (tmp_path / "escape").mkdir()
    (tmp_path / "escape" / "cpu.shares").write_text("1024\n")
    proc, root = fake_tree(tmp_path, line, {"a": {"cpu.shares": "2"}, "a/b": {"cpu.shares": "2"}}, v2=False)
    assert cpu_knobs(4242, proc_root=proc, cgroup_root=root) == ()
    assert cpu_knobs(999, proc_root=proc, cgroup_root=root) == ()  # no such process


def test_a_symlinked_cgroup_directory_leading_outside_the_mount_is_not_followed(tmp_path: Path) -> None:
    proc, root = fake_tree(tmp_path, "4:cpu:/a/link", {"a": {"cpu.shares": "2"}}, v2=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpu.shares").write_text("1024\n")
    (root / "cpu" / "a" / "link").symlink_to(outside)
    knobs = cpu_knobs(4242, proc_root=proc, cgroup_root=root)
    assert [k.file for k in knobs] == [root / "cpu" / "a" / "cpu.shares"]
    CpuBoost().raise_(knobs)
    assert (outside / "cpu.shares").read_text() == "1024\n"


def test_counted_raises_restore_once_the_last_is_done_and_keep_a_value_written_meanwhile(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("2\n")
    b.write_text("1024\n")
    boost = CpuBoost()
    ka, kb = Knob(a, "262144"), Knob(b, "262144")
    first = boost.raise_([ka, kb, ka])
    second = boost.raise_([ka])
    assert a.read_text() == b.read_text() == "262144"
    first.restore()
    assert a.read_text() == "262144", "the second raise still holds a"
    assert b.read_text() == "1024"
    first.restore()  # a second restore does nothing
    assert a.read_text() == "262144"
    a.write_text("4")  # the kubelet wrote its own value meanwhile
    second.restore()
    assert a.read_text() == "4"
    assert boost.raised() == {}


def test_a_file_that_cannot_be_written_is_skipped(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.write_text("2\n")
    raised = CpuBoost().raise_([Knob(tmp_path / "missing" / "cpu.shares", "262144"), Knob(good, "262144")])
    assert [k.file for k in raised.knobs] == [good]
    raised.restore()
    assert good.read_text() == "2"


@given(st.lists(st.text(alphabet="ab./", max_size=12), max_size=4))
def test_cpu_knobs_never_name_a_file_outside_the_mount(
    tmp_path_factory: pytest.TempPathFactory, parts: list[str]
) -> None:
    tmp = tmp_path_factory.mktemp("h")
    proc, root = fake_tree(tmp, "4:cpu:/" + "/".join(parts), {"a/b": {"cpu.shares": "2"}}, v2=False)
    (tmp / "cpu.shares").write_text("1\n")
    mount = (root / "cpu").resolve()
    for knob in cpu_knobs(4242, proc_root=proc, cgroup_root=root):
        assert mount in knob.file.resolve().parents and knob.file.parent != mount


@pytest.fixture
def real_cgroup() -> Iterator[tuple[Path, int]]:
    """A two-level cgroup in the real v1 cpu hierarchy (or v2) with a sleeping process in it."""
    root = Path("/sys/fs/cgroup")
    v2 = (root / "cgroup.controllers").is_file()
    mount = root if v2 else root / "cpu"
    if os.geteuid() != 0 or not mount.is_dir():
        pytest.skip("needs root and a cpu cgroup hierarchy")
    top = mount / f"spotgpu-boost-{uuid.uuid4().hex[:8]}"
    leaf = top / "c1"
    leaf.mkdir(parents=True)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        (leaf / "cgroup.procs").write_text(str(proc.pid))
        yield leaf, proc.pid
    finally:
        proc.kill()
        proc.wait()
        leaf.rmdir()
        top.rmdir()


@pytest.mark.root
def test_a_real_cgroup_and_its_parent_are_raised_and_restored(real_cgroup: tuple[Path, int]) -> None:
    leaf, pid = real_cgroup
    knobs = cpu_knobs(pid)
    weights = [k for k in knobs if k.file.name in ("cpu.shares", "cpu.weight")]
    assert [k.file.parent for k in weights] == [leaf, leaf.parent]
    before = [k.file.read_text().strip() for k in weights]
    raised = CpuBoost().raise_(knobs)
    assert [k.file.read_text().strip() for k in weights] == [k.value for k in weights]
    raised.restore()
    assert [k.file.read_text().strip() for k in weights] == before
