"""Fixtures shared by the agent's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spotgpu.testing.kubelet import KubeletDouble


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[KubeletDouble]:
    """The kubelet's device manager over real gRPC (no kubelet can run here)."""
    double = KubeletDouble(tmp_path / "device-plugins")
    double.start()
    try:
        yield double
    finally:
        double.close()
