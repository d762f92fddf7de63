"""``spotgpu soak``: the schedule comes from the seed alone, durations parse, resource growth is
judged per process instance after its warm-up; and a short soak on the real node harness (root,
slow: about 75 s) runs plain cycles and faults with every invariant holding."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys

import pytest

from spotgpu.e2e.soak import WARMUP_SAMPLES, Instance, all_faults, draw, parse_duration


def test_the_same_seed_draws_the_same_schedule_and_every_kind_can_be_drawn() -> None:
    kinds = sorted(all_faults())

    def schedule(seed: int) -> list[str | None]:
        rng = random.Random(seed)
        return [draw(rng, kinds) for _ in range(400)]

    assert schedule(7) == schedule(7) != schedule(8)
    drawn = schedule(7)
    assert set(drawn) == {None, *kinds}
    assert 0.3 < sum(1 for k in drawn if k is not None) / len(drawn) < 0.5
    assert len(kinds) >= 8


def test_durations_parse_and_nonsense_is_refused() -> None:
    assert parse_duration("90") == parse_duration("90s") == 90.0
    assert parse_duration("10m") == 600.0 and parse_duration("1.5h") == 5400.0
    for bad in ("0", "-1m", "ten", "5x"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_growth_is_judged_after_the_warm_up_against_its_peak() -> None:
    flat = Instance(1, [{"rss_kb": 100 + i % 3, "fds": 10, "threads": 4} for i in range(WARMUP_SAMPLES + 20)])
    assert flat.growth() is None
    warming = Instance(2, [{"rss_kb": 50 + 10 * i, "fds": 10, "threads": 4} for i in range(WARMUP_SAMPLES)])
    assert warming.growth() is None  # still warming up: not judged
    leaking = Instance(3, [*warming.samples, *[{"rss_kb": 200 + i, "fds": 10, "threads": 4} for i in range(5)]])
    assert leaking.growth() is not None and "rss_kb 200" in (leaking.growth() or "")
    later = [{"rss_kb": 100, "fds": 12, "threads": 4}] * WARMUP_SAMPLES
    fds = Instance(4, [*flat.samples[:WARMUP_SAMPLES], *later])
    assert "fds 12" in (fds.growth() or "")
    spike = [{"rss_kb": 100, "fds": 10 + 3 * (i == 2), "threads": 4} for i in range(WARMUP_SAMPLES)]
    assert Instance(5, [*flat.samples[:WARMUP_SAMPLES], *spike]).growth() is None  # a moment's fds


@pytest.mark.root
@pytest.mark.slow
def test_a_short_soak_holds_every_invariant(containerd_binaries: object) -> None:
    if os.geteuid() != 0 or shutil.which("gcc") is None:
        pytest.skip("needs root and gcc (the owner's GPU client)")
    proc = subprocess.run(
        [sys.executable, "-m", "spotgpu", "soak", "--duration", "60s", "--seed", "7", "--json"],
        capture_output=True, text=True, timeout=400, check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stdout.strip(), proc.stderr[-6000:]
    result = json.loads(proc.stdout)
    assert result["violations"] == [], proc.stderr[-6000:]
    assert proc.returncode == 0 and result["passed"] is True
    assert result["cycles"] >= 10 and result["faults"] >= 3 and result["fault_kind_count"] >= 2
    assert result["hold_ms_p99"] is not None and result["hold_ms_p99"] < 6000
    assert set(result["resources"]["end"]) == {"agent", "holder"}
    assert result["environment"]["git"] is not None
