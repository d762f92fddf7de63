"""spotgpu.bench.env: the background load really runs, at nice 0, and never outlives its block
or its parent; the environment block says what it ran on. No timing is asserted."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spotgpu.bench import env
from spotgpu.cli import main


def _state(pid: int) -> str | None:
    """The process's state letter, or None once it is gone (reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _exits_within(fd: int, seconds: float) -> bool:
    readable, _, _ = select.select([fd], [], [], seconds)
    return bool(readable)


def test_background_load_spins_at_nice_zero_and_is_reaped() -> None:
    with env.background_load(2) as pids:
        assert len(pids) == 2
        for pid in pids:
            assert _state(pid) in ("R", "S")  # S only while the kernel preempts it between checks
            assert os.getpriority(os.PRIO_PROCESS, pid) == 0
            assert int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid()
    assert [_state(pid) for pid in pids] == [None, None]


def test_background_load_is_killed_when_the_block_raises() -> None:
    seen: list[int] = []
    with pytest.raises(KeyboardInterrupt), env.background_load(1) as pids:
        seen += pids
        raise KeyboardInterrupt
    assert _state(seen[0]) is None


def test_background_load_of_zero_starts_nothing() -> None:
    with env.background_load(0) as pids:
        assert pids == []
    with pytest.raises(ValueError, match=">= 0"), env.background_load(-1):
        pass


def test_load_exits_by_itself_when_its_parent_is_killed() -> None:
    """SIGKILL of the benchmark (no finally runs): the loop notices its new parent and exits."""
    script = textwrap.dedent(
        """
        import sys, time
        from spotgpu.bench import env
        with env.background_load(1) as pids:
            print(pids[0], flush=True)
            time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        spinner = int(parent.stdout.readline())
        fd = os.pidfd_open(spinner)
    finally:
        parent.kill()
        parent.wait()
    try:
        assert _exits_within(fd, 20), "the load process outlived its killed parent"
    finally:
        os.close(fd)


def test_environment_block_names_machine_load_versions_and_revision(tmp_path: Path) -> None:
    fake = tmp_path / "containerd"
    fake.write_text("#!/bin/sh\necho 'containerd github.com/containerd/containerd/v2 v2.2.7 0123abc'\n")
    fake.chmod(0o755)
    block = env.environment(
        background_load=[0, 2], load_before=(1.0, 2.0, 3.0), load_after=(4.0, 5.0, 6.0), containerd_binaries=[fake]
    )
    assert block["background_load"] == [0, 2]
    assert block["load_average_before"] == [1.0, 2.0, 3.0] and block["load_average_after"] == [4.0, 5.0, 6.0]
    assert block["cores"] == len(os.sched_getaffinity(0))
    assert block["kernel"]["release"] == os.uname().release
    assert {"path": str(fake), "version": "v2.2.7"} in block["containerd"]
    assert block["date"].endswith("+00:00")
    assert block["git"] is None or (len(block["git"]["revision"]) == 40 and isinstance(block["git"]["dirty"], bool))
    json.dumps(block)  # plain JSON data


def test_absent_tools_read_as_none(tmp_path: Path) -> None:
    assert env.containerd_version(tmp_path / "no-such-containerd") is None
    assert env.runc_version(str(tmp_path / "no-such-runc")) is None
    assert env.git_revision(tmp_path) is None


def test_int_list_keeps_order_drops_repeats_and_refuses_bad_values() -> None:
    assert env.int_list("1,8,16,32") == [1, 8, 16, 32]
    assert env.int_list("2,0,2") == [2, 0]
    for bad in ("", "a", "1,-2", "1.5"):
        with pytest.raises(Exception, match="integers"):
            env.int_list(bad)
    assert env.non_negative("3") == 3
    with pytest.raises(Exception, match="one non-negative"):
        env.non_negative("1,2")


def test_bench_scheduler_runs_beside_a_load_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "scheduler", "--nodes", "20", "--gpus-per-node", "4", "--pending-pods", "20"]
    args += ["--running-spot-pods", "20", "--victim-repeats", "2", "--background-load", "1", "--json"]
    assert main(args) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["environment"]["background_load"] == 1
    assert len(figures["environment"]["load_average_before"]) == 3


@pytest.mark.skipif(not Path("/bin/busybox").exists(), reason="needs /bin/busybox")
def test_host_processes_idle_hold_files_every_other_one_and_are_reaped() -> None:
    with env.host_processes(6) as pids:
        assert len(pids) == 6
        assert all(_state(p) == "S" for p in pids)  # asleep: they cost no CPU
        held = [sorted(os.readlink(f"/proc/{p}/fd/{fd}") for fd in os.listdir(f"/proc/{p}/fd")) for p in pids]
        assert sum(1 for files in held if set(env.HOST_FILES[:3]) <= set(files)) == 3
    assert all(_state(p) is None for p in pids)
