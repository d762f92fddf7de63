"""Shared pytest configuration.

Tests marked ``root`` use real kernel features and programs (runc, containerd, namespaces,
seccomp); they are skipped, with the reason, when not running as root or when a needed
program is missing. CI runs as root with everything installed, so there they all run.
"""

from __future__ import annotations

import os
import shutil

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
