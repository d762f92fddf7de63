"""The GPU check's launcher and counter, exercised with the stand-in client on /dev/null (the
GPU check itself needs an NVIDIA GPU and was not run here)."""

from __future__ import annotations

from pathlib import Path

from spotgpu.guard.gpucheck import count
from spotgpu.testing import standin


def test_count_runs_a_command_under_the_rule_and_counts_what_it_catches(probe_binary: Path) -> None:
    calls = [standin.Call("/dev/null", c.request) for c in standin.TORCH_SESSION]
    result = count([str(probe_binary), "seq", standin.sequence_arg(calls)])
    assert result["exit"] == 0
    assert result["guard_notifications"] == 2
    assert result["guard_requests"] == {f"{standin.CHECK_VERSION_STR:#x}": 2}
    assert result["nvidia_ioctls_total"] == len(standin.TORCH_SESSION)
