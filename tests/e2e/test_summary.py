"""The figures ``spotgpu node-e2e`` prints, from cycle records (no root needed)."""

from __future__ import annotations

from spotgpu.core.ids import DeviceID
from spotgpu.core.refs import PodRef
from spotgpu.e2e.model import Spot
from spotgpu.e2e.node import NodeSettings
from spotgpu.e2e.run import CycleRecord, Release, Run, summarize, targets

KEYS = (
    "return_hold_ms_p50",
    "return_hold_ms_p99",
    "eviction_ms_p99",
    "lend_detect_s",
    "spot_start_ms_p50",
    "leaked_containers",
    "owner_errors",
    "cycles",
    "guard_signal_ms_p50",
    "guard_release_ms_p99",
    "last_spot_exit_ms_p99",
    "exit_to_release_ms_min",
    "containerd_exit_after_release_ms_max",
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


class _Exits:
    """The exit watcher's answers: PID -> CLOCK_MONOTONIC ns (None: still running)."""

    def __init__(self, times: dict[int, int | None]) -> None:
        self.times = times

    def exits(self, pids: list[int], timeout: float) -> dict[int, int | None]:
        return {p: self.times[p] for p in pids}


class _Node:
    def __init__(self, times: dict[int, int | None]) -> None:
        self.settings = NodeSettings()
        self.exits = _Exits(times)


def _spot(name: str, pids: tuple[int, ...]) -> Spot:
    return Spot(
        PodRef("spot-jobs", name), f"uid-{name}", f"{name:0<64}", 0, DeviceID("spot-GPU-e2e-0"), 1.0, pids[0], pids
    )


def test_a_spot_process_that_exited_after_the_owners_call_returned_is_a_leak() -> None:
    """Judged on the kernel's exit times, as the owner sees it: exited before the call
    returned is clean (however late containerd records it), after it or never is a leak."""
    release = Release({"start_ns": 1_000_000, "end_ns": 9_000_000, "end_real_ns": 0}, 0.0)
    run = Run(_Node({1: 2_000_000, 2: 8_999_999, 3: 9_000_001, 4: None, 5: 3_000_000}), lambda _l: None)  # type: ignore[arg-type]
    spots = [_spot("clean", (1, 2)), _spot("late", (3,)), _spot("alive", (4, 5))]
    late, times = run.late_exits(spots, release)
    assert set(late) == {spots[1].cid, spots[2].cid}
    assert "0.00 ms after the owner's call returned" in late[spots[1].cid]
    assert "[4] still running" in late[spots[2].cid]
    assert times == []  # not every process exited
    clean, times = run.late_exits(spots[:1], release)
    assert clean == {} and sorted(times) == [2_000_000, 8_999_999]


def test_the_bars_are_issue_15s_on_the_default_node_and_the_cri_issues_elsewhere() -> None:
    default = NodeSettings(spot_containers=8)
    assert targets(default, 0)["return_hold_ms_p99"] == 30.0
    assert targets(default, 2)["return_hold_ms_p99"] == 50.0
    assert targets(NodeSettings(spot_containers=32), 2)["return_hold_ms_p99"] == 100.0
    nri = NodeSettings(spot_containers=8, containerd="2.2", mode="nri")
    assert targets(nri, 0)["return_hold_ms_p99"] == 100.0 and "CRI issue" in targets(nri, 0)["bar"]
    assert targets(default, 0)["leaked_containers"] == 0 and targets(default, 0)["owner_errors"] == 0
