"""Small helpers shared by the Kubernetes integration tests (imported as ``kubehelpers``)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(cond: Callable[[], bool], timeout: float = 8.0) -> None:
    """Poll ``cond`` every 10 ms until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)
