"""Fixtures of the runtime tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import fakes


@pytest.fixture(params=["wrapper", "nri"])
def runtime_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test twice: with :func:`fakes.engine` the wrapper's engine, and as NRI mode runs it
    (:class:`fakes.NriModeEngine`). Modules whose tests exercise a decision use it."""
    fakes.MODE.value = request.param
    try:
        yield request.param
    finally:
        fakes.MODE.value = "wrapper"
