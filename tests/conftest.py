"""Shared pytest configuration.

Tests marked ``root`` use real kernel features and programs (runc, containerd, namespaces,
seccomp); they are skipped, with the reason, when not running as root or when a needed
program is missing. CI runs as root with everything installed, so there they all run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile("ci")

REAL_PROGRAMS = ("runc", "containerd", "ctr")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons = []
    if os.geteuid() != 0:
        reasons.append("needs root")
    missing = [p for p in REAL_PROGRAMS if shutil.which(p) is None]
    if missing:
        reasons.append(f"missing {', '.join(missing)}")
    if not os.path.exists("/bin/busybox"):
        reasons.append("missing /bin/busybox (busybox-static)")
    if not reasons:
        return
    skip = pytest.mark.skip(reason="; ".join(reasons))
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


# --- real CRI runtimes (containerd 1.6 and 2.2.7) ------------------------------------------------

REQUIRE_CONTAINERD22 = "SPOTGPU_REQUIRE_CONTAINERD22"
"""Set by scripts/test.sh (CI): tests needing containerd 2.2.7 fail, rather than skip, without it."""


@pytest.fixture(scope="session")
def cri_images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The pause and busybox image tarballs (built once per session, imported per containerd)."""
    from spotgpu.testing.images import busybox_image, pause_image

    folder = tmp_path_factory.mktemp("images")
    return [pause_image(folder), busybox_image(folder)]


@pytest.fixture(scope="session")
def containerd_binaries() -> Callable[[str], object]:
    """``binaries(version)``: the containerd build of ``version``; skips (or, under
    scripts/test.sh, fails) when it is not installed."""
    from spotgpu.testing.cri_containerd import binaries

    def find(version: str) -> object:
        try:
            return binaries(version)  # type: ignore[arg-type]
        except FileNotFoundError as exc:
            if version == "2.2" and os.environ.get(REQUIRE_CONTAINERD22):
                pytest.fail(f"{exc} ({REQUIRE_CONTAINERD22} is set: CI must run these tests)")
            pytest.skip(str(exc))

    return find
