"""The figures ``spotgpu node-e2e`` prints, from cycle records (no root needed)."""

from __future__ import annotations

from spotgpu.e2e.node import NodeSettings
from spotgpu.e2e.run import CycleRecord, summarize

KEYS = (
    "return_hold_ms_p50",
    "return_hold_ms_p99",
    "eviction_ms_p99",
    "lend_detect_s",
    "spot_start_ms_p50",
    "leaked_containers",
    "owner_errors",
    "cycles",
)


def test_the_issue_keys_with_nearest_rank_percentiles() -> None:
    records = [
        CycleRecord(i, lend_detect_s=1.0 + i / 100, spot_start_ms=[100.0 + i, 90.0], hold_ms=10.0 * (i + 1),
                    eviction_ms=5.0 * (i + 1), eviction_complete_ms=50.0)
        for i in range(10)
    ]  # fmt: skip
    records[3].leaked = ["spot-jobs/spot-7 (abc) pid(s) [42] had a GPU open at release"]
    records[5].owner_error = "ENOSYS: the GPU call failed"
    result = summarize(records, NodeSettings(spot_containers=8, gpus=2))
    assert set(KEYS) <= set(result)
    assert result["cycles"] == 10 and result["twin_replicas"] == 4
    assert result["return_hold_ms_p50"] == 50.0 and result["return_hold_ms_p99"] == 100.0
    assert result["eviction_ms_p99"] == 50.0
    assert result["lend_detect_s"] == 1.045
    assert result["spot_start_ms_p50"] == 90.0
    assert result["leaked_containers"] == 1 and result["owner_errors"] == 1
    assert result["problems"] == [
        "cycle 3: spot-jobs/spot-7 (abc) pid(s) [42] had a GPU open at release",
        "cycle 5: owner error: ENOSYS: the GPU call failed",
    ]


def test_no_cycles_gives_empty_figures() -> None:
    result = summarize([], NodeSettings())
    assert result["cycles"] == 0 and result["return_hold_ms_p99"] is None and result["lend_detect_s"] is None
