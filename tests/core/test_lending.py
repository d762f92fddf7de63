"""The lowpower detector: idle once after maxInactiveTime, busy at once, and while lent only the
owner's own processes (or the guard) count, never utilization."""

from __future__ import annotations

import pytest

from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import DeviceID
from spotgpu.core.lending import ActivitySample, ActivitySource, LowpowerDetector, OwnerBusy, OwnerIdle
from spotgpu.core.refs import ContainerRef

OWNER = ContainerRef("team", "dev-0", "main")
DEVICES = (DeviceID("GPU-0"), DeviceID("GPU-1"))


def sample(at: float, util: bool | None = False, proc: bool | None = False) -> ActivitySample:
    return ActivitySample(at, util, proc)


def test_idle_is_reported_once_after_max_inactive_time() -> None:
    d = LowpowerDetector(OWNER, DEVICES, max_inactive_time=60, now=0)
    assert d.observe(sample(30)) is None
    assert d.observe(sample(59.9)) is None
    event = d.observe(sample(60))
    assert event == OwnerIdle(OWNER, DEVICES, 60, 0)
    assert d.observe(sample(120)) is None
    assert d.idle


def test_activity_resets_the_timer() -> None:
    d = LowpowerDetector(OWNER, DEVICES, max_inactive_time=60, now=0)
    assert d.observe(sample(50, util=True)) is None
    assert d.observe(sample(100)) is None
    assert isinstance(d.observe(sample(110)), OwnerIdle)


def test_busy_is_reported_at_once_by_an_owner_process() -> None:
    d = LowpowerDetector(OWNER, DEVICES, max_inactive_time=10, now=0)
    d.observe(sample(10))
    event = d.observe(sample(11, proc=True))
    assert event == OwnerBusy(OWNER, DEVICES, 11, ActivitySource.PROCESS)
    assert not d.idle
    assert d.observe(sample(12, proc=True)) is None


def test_while_lent_utilization_belongs_to_the_spot_job() -> None:
    d = LowpowerDetector(OWNER, DEVICES, max_inactive_time=10, now=0)
    d.observe(sample(10))
    for t in range(11, 30):
        assert d.observe(sample(t, util=True, proc=False)) is None
    assert d.idle


def test_guard_signal() -> None:
    d = LowpowerDetector(OWNER, DEVICES, max_inactive_time=10, now=0)
    assert d.owner_back(5) is None  # not lent: nothing to do
    d.observe(sample(15))
    event = d.owner_back(16)
    assert event is not None and event.source is ActivitySource.GUARD
    assert d.owner_back(17) is None


@pytest.mark.parametrize(("util", "proc"), [(None, False), (False, None), (None, None)])
def test_unknown_measurements_never_make_an_owner_idle(util: bool | None, proc: bool | None) -> None:
    d = LowpowerDetector(OWNER, DEVICES, max_inactive_time=10, now=0)
    for t in range(0, 100, 5):
        assert d.observe(sample(t, util, proc)) is None
    assert not d.idle


def test_unknown_owner_processes_while_lent_end_the_loan() -> None:
    d = LowpowerDetector(OWNER, DEVICES, max_inactive_time=10, now=0)
    d.observe(sample(10))
    event = d.observe(sample(11, util=True, proc=None))
    assert event is not None and event.source is ActivitySource.UNKNOWN


def test_bad_arguments() -> None:
    with pytest.raises(ValidationError, match="must not be negative"):
        LowpowerDetector(OWNER, DEVICES, -1, 0)
    with pytest.raises(ValidationError, match="must name its namespace"):
        LowpowerDetector(ContainerRef(None, "p", "c"), DEVICES, 1, 0)
