"""Detecting whether the guard can work here (pure decision table, and the real probe)."""

from __future__ import annotations

import shutil

import pytest

from spotgpu.guard.support import evaluate, parse_runtime_version, parse_version, probe

RUNC_115 = "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\ngo: go1.19.8\nlibseccomp: 2.5.4\n"


def test_parse_versions() -> None:
    assert parse_version("1.1.5+ds1") == (1, 1, 5)
    assert parse_version("6.18.44-fc-v669") == (6, 18, 44)
    assert parse_version("v1") is None
    assert parse_runtime_version(RUNC_115) == ("1.1.5+ds1", "2.5.4")
    assert parse_runtime_version("crun version 1.8.1\n") == (None, None)


@pytest.mark.parametrize(
    ("kernel", "runtime", "output", "self_test", "reason"),
    [
        ("6.1.0", "runc", RUNC_115, None, None),
        ("5.4.0-150-generic", "runc", RUNC_115, None, "kernel 5.4.0-150-generic is older than 5.5"),
        ("6.1.0", "runc", RUNC_115.replace("1.1.5", "1.0.3"), None, "runc 1.0.3+ds1 is older than 1.1"),
        ("6.1.0", "runc", RUNC_115.replace("2.5.4", "2.4.4"), None, "libseccomp 2.4.4 is older than 2.5"),
        ("6.1.0", "runc", RUNC_115.replace("libseccomp: 2.5.4\n", ""), None, "reports no libseccomp version"),
        ("6.1.0", "crun", "crun version 1.8.1\n", None, "only runc >= 1.1 is supported"),
        ("6.1.0", "runc", None, None, "cannot run 'runc' --version"),
        ("6.1.0", "", None, None, None),  # the operator vouched for the runtime
        ("6.1.0", "runc", RUNC_115, "no notification within 2s", "self-test failed: no notification"),
    ],
)
def test_evaluate(kernel: str, runtime: str, output: str | None, self_test: str | None, reason: str | None) -> None:
    support = evaluate(kernel, runtime, output, self_test)
    assert support.available is (reason is None)
    if reason is not None:
        assert any(reason in r for r in support.reasons), support.reasons
        assert "NOT available" in support.summary()


@pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed")
def test_probe_on_this_machine_runs_the_self_test() -> None:
    support = probe("runc")
    assert support.available, support.summary()
    assert support.runtime_version and support.libseccomp_version
    missing = probe("/nonexistent/runc", run_self_test=False)
    assert not missing.available and "cannot run" in missing.reasons[0]
