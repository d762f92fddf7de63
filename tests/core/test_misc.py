"""Registry, clocks, types and the CLI entry points."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spotgpu.cli import COMMANDS, main
from spotgpu.core.clock import Clock, ManualClock, SystemClock
from spotgpu.core.errors import PermanentError, TemporaryError, ValidationError
from spotgpu.core.registry import Registry, RegistryError
from spotgpu.core.types import SpotPriority, VictimWeights

BIN = Path(sys.executable).parent


def test_registry() -> None:
    reg: Registry[int] = Registry("plugin")
    reg.register("gang", 1)

    @reg.decorator("spot")
    def _spot() -> None:
        pass

    assert reg.names() == ("gang", "spot") and "gang" in reg and len(reg) == 2 and list(reg) == ["gang", "spot"]
    assert reg.get("gang") == 1
    with pytest.raises(RegistryError, match="plugin 'gang' is already registered"):
        reg.register("gang", 2)
    with pytest.raises(RegistryError, match="unknown plugin 'nope'; known: gang, spot"):
        reg.get("nope")
    with pytest.raises(RegistryError, match="must not be empty"):
        reg.register(" ", 3)


def test_clocks() -> None:
    clock = ManualClock(start=10)
    assert isinstance(clock, Clock) and isinstance(SystemClock(), Clock)
    assert clock.advance(5) == 15 and clock.monotonic() == 15
    assert clock.time() == 1_700_000_015
    clock.set(20)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.set(19)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance(-1)


def test_types() -> None:
    assert [p.value_int for p in SpotPriority] == [3000, 2000, 1000]
    assert SpotPriority.parse("spotmid") is SpotPriority.SPOTMID
    with pytest.raises(ValidationError, match="'spotultra' is not one of spothigh, spotmid, spotlow"):
        SpotPriority.parse("spotultra")
    weights = VictimWeights()
    assert (weights.priority_class, weights.task_number, weights.task_resource, weights.running_duration) == (
        100,
        10,
        10,
        10,
    )
    assert weights.duration_policy == "shortest"
    with pytest.raises(ValidationError, match="task_number must be a non-negative integer"):
        VictimWeights(task_number=-1)
    assert TemporaryError.temporary and not PermanentError.temporary
    assert issubclass(ValidationError, ValueError)


def test_cli_help_lists_every_subcommand() -> None:
    out = subprocess.run([BIN / "spotgpu", "--help"], capture_output=True, text=True, check=True).stdout
    for name in COMMANDS:
        assert name in out
    assert "node-e2e" in out and "simulate" in out


def test_runtime_help_runs() -> None:
    proc = subprocess.run([BIN / "spotgpu-runtime", "--help"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0
    assert "spotgpu-runtime" in proc.stdout


def test_every_command_module_loads() -> None:
    for name in COMMANDS:
        with pytest.raises(SystemExit) as info:
            main([name, "--help"])
        assert info.value.code == 0
