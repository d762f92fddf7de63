"""``spotgpu simulate`` as a user runs it (a real subprocess): every input problem is refused
before the run starts, with exit 2, one line and no traceback; ``--json`` carries the useful gain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SPOTGPU = [sys.executable, "-m", "spotgpu"]


def simulate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SPOTGPU, "simulate", "--no-progress", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def refused(run: subprocess.CompletedProcess[str], message: str) -> None:
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert message in lines[-1], run.stderr
    assert run.stdout == ""


@pytest.mark.parametrize("where", ["file", "under-a-file", "proc"])
def test_an_unwritable_out_folder_is_refused_within_5_s(tmp_path: Path, where: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = {"file": blocker, "under-a-file": blocker / "report", "proc": Path("/proc/1/spotgpu-report")}[where]
    start = time.monotonic()
    run = simulate("--out", str(out))
    assert time.monotonic() - start < 5
    refused(run, f"--out {out}: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", ""], "--policies: no policy named; the scenario has baseline,"),
        (["--policies", " , "], "--policies: no policy named"),
        (["--policies", "baseline,baseline"], "--policies: ['baseline'] named more than once"),
        (["--policies", "nope"], "--policies: ['nope'] not in the scenario"),
        (["--nodes", "100000000"], "100,000,000 nodes x 72 h x 7 policies needs about"),
        (["--days", "-1"], "--days: must be a finite number greater than 0, got -1"),
        (["--days", "inf"], "--days: must be a finite number greater than 0, got inf"),
        (["--nodes", "many"], "--nodes: not a whole number: 'many'"),
    ],
)
def test_bad_arguments_are_refused_before_the_run(args: list[str], message: str) -> None:
    start = time.monotonic()
    refused(simulate(*args), message)
    assert time.monotonic() - start < 5


def test_a_negative_duration_in_a_scenario_says_negative(tmp_path: Path) -> None:
    path = tmp_path / "neg.yaml"
    path.write_text("name: neg\nduration: -5h\n")
    refused(simulate("--scenario", str(path)), "duration: duration must not be negative, got '-5h'")


def test_a_long_run_is_announced_with_an_estimate_before_it_starts() -> None:
    proc = subprocess.Popen(
        [*SPOTGPU, "simulate", "--no-progress", "--nodes", "40000", "--workers", "1", "--force"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
    finally:
        proc.kill()
        proc.wait()
    assert line.startswith("spotgpu simulate: warning: 40,000 nodes x 72 h x 7 policies on 1 worker(s) takes about ")
    assert "estimated from a measured 5,000-node run" in line


def test_json_gives_every_policy_its_useful_gain_and_out_writes_the_page(tmp_path: Path) -> None:
    run = simulate("--json", "--nodes", "8", "--days", "0.25", "--out", str(tmp_path / "r"))
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    for entry in summary["policies"]:
        assert isinstance(entry["useful_gain_gpu_hours"], float), entry["name"]
    assert summary["policies"][0]["useful_gain_gpu_hours"] == 0.0
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["policies"] == summary["policies"]
    assert "useful gain GPU-h" in (tmp_path / "r" / "report.html").read_text()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere: the permission check cannot fail")
def test_a_read_only_out_folder_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        refused(simulate("--out", str(tmp_path / "r")), "cannot write there: Permission denied")
    finally:
        tmp_path.chmod(0o700)
