"""Workload adapters on small real excerpts (shipped in tests/sim/data) and on the embedded data.

The excerpts are verbatim slices of the public traces: ``helios-vc6YE-2020-05-04-0900-4h.csv``
is 240 rows of HeliosArtifact's ``vc6YE/cluster_sequence_vc.csv`` (CC BY 4.0) and
``elasticflow-cluster10-first40.csv`` the first 40 jobs of ElasticFlow's ``cluster10.csv`` (MIT).
Tests that compare with the full traces run only where ``../shared/data`` exists.
"""

from __future__ import annotations

import math
import random
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotgpu.core.configfile import ConfigError, from_mapping
from spotgpu.core.types import SpotPriority
from spotgpu.sim import excerpts
from spotgpu.sim.workloads import JOB_SOURCES, OWNER_SOURCES, JobRequest, OwnerRequest, PriorityRule, TraceJob
from spotgpu.sim.workloads.base import WorkloadError, demand_gpu_seconds, merge_intervals, overlay_windows
from spotgpu.sim.workloads.devmachine import DevMachineConfig, owner_day_intervals
from spotgpu.sim.workloads.elasticflow import ElasticFlowConfig, Windows, load_trace
from spotgpu.sim.workloads.helios import HeliosConfig, active_counts, load_series
from spotgpu.sim.workloads.inline import InlineJobs, InlineOwners

DATA = Path(__file__).parent / "data"
HELIOS_EXCERPT = DATA / "helios-vc6YE-2020-05-04-0900-4h.csv"
EF_EXCERPT = DATA / "elasticflow-cluster10-first40.csv"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
HOUR = 3600.0


def owner_request(count: int, gpus: int = 8, horizon: float = 4 * HOUR, seed: str = "1") -> OwnerRequest:
    return OwnerRequest("grp", count, gpus, horizon, seed, DATA)


def job_request(
    horizon: float, *, scale: float | None = 1.0, target: float | None = None, max_gpus: int = 64
) -> JobRequest:
    return JobRequest("jobs", horizon, target, scale, max_gpus, "1", DATA)


def active_at(owners: list, t: float) -> int:  # type: ignore[type-arg]
    return sum(1 for o in owners if o.active_at(t))


# --- Helios ---------------------------------------------------------------------------------


def test_helios_series_from_a_real_per_team_file() -> None:
    series = load_series(str(HELIOS_EXCERPT), "vc6YE", DATA)
    assert series.start.isoformat(sep=" ") == "2020-05-04 09:00:00"
    assert series.length == 240
    assert series.quota() == 208
    # idle_gpu_num 24, 8, 24, 0, ... -> busy 184, 200, 184, 208, ...
    assert series.minutes[:5] == (0, 87, 89, 91, 94)
    assert series.busy[:5] == (184, 200, 184, 208, 184)


def test_helios_active_owners_follow_ceil_of_busy_gpus_per_owner() -> None:
    config = HeliosConfig(trace=str(HELIOS_EXCERPT), teams=("vc6YE",), start="2020-05-04 09:00:00")
    owners = OWNER_SOURCES.get("helios").build(config, owner_request(26))
    assert len(owners) == 26 and all(o.gpus == 8 for o in owners)
    assert {o.origin for o in owners} == {"helios:vc6YE+0h"}
    # 208 GPUs / 8 = 26 owners; busy 184 -> 23 active, 200 -> 25, 208 -> 26.
    for minute, expected in [(0, 23), (50, 23), (87, 25), (89, 23), (91, 26), (94, 23), (104, 26), (239, 25)]:
        assert active_at(owners, minute * 60 + 1) == expected, minute


def test_helios_is_deterministic_per_seed_and_the_seed_only_changes_who() -> None:
    config = HeliosConfig(trace=str(HELIOS_EXCERPT), teams=("vc6YE",), start="2020-05-04 09:00:00")
    source = OWNER_SOURCES.get("helios")
    a = source.build(config, owner_request(26, seed="7"))
    b = source.build(config, owner_request(26, seed="7"))
    c = source.build(config, owner_request(26, seed="8"))
    assert a == b
    assert a != c
    for minute in range(0, 240, 7):
        assert active_at(a, minute * 60 + 1) == active_at(c, minute * 60 + 1)


def test_helios_copies_cover_more_owners_than_one_team_and_scale_a_partial_copy() -> None:
    config = HeliosConfig(trace=str(HELIOS_EXCERPT), teams=("vc6YE",), start="2020-05-04 09:00:00")
    owners = OWNER_SOURCES.get("helios").build(config, owner_request(60))
    assert len(owners) == 60
    assert len({o.name for o in owners}) == 60
    # copies of 26, 26 and 8 owners; the partial copy has ceil(c * 8 / 26) active.
    assert active_at(owners[:26], 1) == 23
    assert active_at(owners[52:], 1) == math.ceil(23 * 8 / 26)


def test_helios_one_gpu_owners_mirror_the_busy_gpus_exactly() -> None:
    config = HeliosConfig(trace=str(HELIOS_EXCERPT), teams=("vc6YE",), start="2020-05-04 09:00:00")
    owners = OWNER_SOURCES.get("helios").build(config, owner_request(208, gpus=1))
    series = load_series(str(HELIOS_EXCERPT), "vc6YE", DATA)
    for minute in range(240):
        assert active_at(owners, minute * 60 + 30) == series.busy[series.index_at(minute)]


def test_helios_active_counts_wrap_around_the_end_of_the_series() -> None:
    series = load_series(str(HELIOS_EXCERPT), "vc6YE", DATA)
    counts = active_counts(series, first=230, minutes=20, owners=26)
    # minutes 230..239 of the series, then 0..9 again
    assert counts[0][0] == 0
    assert counts[-1] == (10, 23)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("time,total_gpu_num\n2020-05-01 00:00:00,8\n", "missing column"),
        ("time,total_gpu_num,idle_gpu_num\n2020-05-01 00:00:00,8,9\n", ":2: need 0 <= idle_gpu_num"),
        ("time,total_gpu_num,idle_gpu_num\n2020-05-01 00:00:00,8,x\n", ":2: idle_gpu_num: 'x' is not an integer"),
        (
            "time,total_gpu_num,idle_gpu_num\n2020-05-01 00:01:00,8,1\n2020-05-01 00:00:00,8,1\n",
            ":3: times must be whole minutes in increasing order",
        ),
    ],
    ids=["missing-column", "idle-above-quota", "not-a-number", "time-goes-back"],
)
def test_helios_bad_files_name_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(WorkloadError, match=message) as info:
        load_series(str(path), "t", tmp_path)
    assert str(path) in str(info.value)


def test_helios_embedded_excerpt_names_its_teams_and_refuses_unknown_ones() -> None:
    series = load_series("embedded", "vc3sl", DATA)
    assert series.quota() == 64 and series.length == 44640
    with pytest.raises(WorkloadError, match="no series for team 'nope'; it has vc3sl, vc6YE, vc8Sj, vcJLV"):
        load_series("embedded", "nope", DATA)


def test_helios_start_outside_the_series_is_refused() -> None:
    config = HeliosConfig(trace=str(HELIOS_EXCERPT), teams=("vc6YE",), start="2020-06-01 00:00:00")
    with pytest.raises(WorkloadError, match="outside team vc6YE's series"):
        OWNER_SOURCES.get("helios").build(config, owner_request(1))


def test_helios_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^helios: start: 'tomorrow' is not a time"):
        from_mapping(HeliosConfig, {"start": "tomorrow"}, "helios")
    with pytest.raises(ConfigError, match=r"^helios: copyOffset: must be at least one minute"):
        from_mapping(HeliosConfig, {"copyOffset": "10s"}, "helios")


@pytest.mark.skipif(not (SHARED / "helios-earth").is_dir(), reason="full Helios traces not present")
def test_embedded_helios_excerpt_equals_the_full_trace() -> None:
    for team in ("vc6YE", "vcJLV"):
        assert load_series("embedded", team, DATA) == load_series(str(SHARED / "helios-earth"), team, DATA)


@pytest.mark.skipif(not SHARED.is_dir(), reason="full traces not present")
def test_shipped_excerpts_are_fresh() -> None:
    assert (
        excerpts.main(
            [
                "--helios",
                str(SHARED / "helios-earth"),
                "--elasticflow",
                str(SHARED / "elasticflow/raw-traces.tar.gz"),
                "--check",
            ]
        )
        == 0
    )


# --- dev machines ----------------------------------------------------------------------------


def test_devmachine_owners_work_on_workdays_and_rest_on_weekends() -> None:
    owners = OWNER_SOURCES.get("devmachine").build(DevMachineConfig(), owner_request(40, horizon=7 * 86400.0))
    assert len(owners) == 40
    weekday = sum(o.active_seconds(5 * 86400) for o in owners) / 5
    weekend = sum(o.active_seconds(7 * 86400) - o.active_seconds(5 * 86400) for o in owners) / 2
    assert weekday > 5 * weekend
    # During office hours on a Tuesday most owners are in; at 4 a.m. few are.
    noon = 86400 + 11 * HOUR
    assert active_at(owners, noon) > active_at(owners, 86400 + 4 * HOUR)
    assert OWNER_SOURCES.get("devmachine").build(DevMachineConfig(), owner_request(40, horizon=7 * 86400.0)) == owners


def test_devmachine_absent_owners_never_work() -> None:
    config = DevMachineConfig(absent_probability=1.0, weekend_probability=0.0, overnight_probability=0.0)
    owners = OWNER_SOURCES.get("devmachine").build(config, owner_request(5, horizon=7 * 86400.0))
    assert all(o.active == () for o in owners)


def test_devmachine_one_day_respects_lunch_and_office_hours() -> None:
    config = DevMachineConfig(arrive_jitter=0.0, leave_jitter=0.0, overnight_probability=0.0, absent_probability=0.0)
    spans = owner_day_intervals(config, random.Random(3), day=0, shift=0.0)
    assert spans
    assert min(s for s, _ in spans) >= 9 * HOUR
    assert max(e for _, e in spans) <= 18.5 * HOUR
    lunch = (12.5 * HOUR, 12.5 * HOUR + 45 * 60)
    assert all(e <= lunch[0] or s >= lunch[1] for s, e in spans)


@settings(max_examples=40)
@given(
    seed=st.integers(0, 10_000),
    jitter=st.floats(0, 3 * HOUR),
    overnight=st.floats(0, 1),
    spread=st.floats(0, 12 * HOUR),
)
def test_devmachine_intervals_are_always_valid(seed: int, jitter: float, overnight: float, spread: float) -> None:
    config = DevMachineConfig(arrive_jitter=jitter, overnight_probability=overnight, timezone_spread=spread)
    horizon = 3 * 86400.0
    owners = OWNER_SOURCES.get("devmachine").build(config, owner_request(3, horizon=horizon, seed=str(seed)))
    for owner in owners:  # OwnerTrace validates order and disjointness itself
        assert all(0 <= s < e <= horizon for s, e in owner.active)


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"arrive": "19h"}, "devmachine: leave: must be after arrive"),
        ({"overnightProbability": 1.5}, "devmachine: overnightProbability: a probability must be within 0..1"),
        ({"workdays": [0, 7]}, "devmachine: workdays: days are 0"),
        ({"sessionMean": 0}, "devmachine: sessionMean: must be greater than zero"),
        ({"lunchLenght": "1h"}, "devmachine.lunchLenght: unknown key; did you mean 'lunchLength'"),
    ],
    ids=["leave-before-arrive", "probability", "weekday", "session", "typo"],
)
def test_devmachine_config_errors_name_the_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=f"^{key}"):
        from_mapping(DevMachineConfig, data, "devmachine")


# --- ElasticFlow -----------------------------------------------------------------------------


def test_elasticflow_reads_a_real_cluster_file() -> None:
    rows = load_trace(str(EF_EXCERPT), DATA)
    assert len(rows) == 40
    assert rows[0].cluster == "elasticflow-cluster10-first40"
    assert (rows[0].submission, rows[0].duration, rows[0].gpus) == (2266647, 604, 16)


def test_elasticflow_window_replays_arrivals_relative_to_its_start() -> None:
    windows = Windows(load_trace(str(EF_EXCERPT), DATA), (), start=2870000, horizon=HOUR)
    jobs = windows(0)
    assert [j.arrival for j in jobs] == [901, 999, 1137, 1435, 1547]
    assert [j.duration for j in jobs] == [605, 607, 611, 719, 718]
    assert all(j.gpus == 1 for j in jobs)


def test_elasticflow_reads_the_published_tarball(tmp_path: Path) -> None:
    tarball = tmp_path / "raw-traces.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(EF_EXCERPT, arcname="cluster10.csv")
    rows = load_trace(str(tarball), tmp_path)
    assert [(r.cluster, r.row) for r in rows[:2]] == [("cluster10", 0), ("cluster10", 1)]
    assert [r.submission for r in rows] == [r.submission for r in load_trace(str(EF_EXCERPT), DATA)]
    config = ElasticFlowConfig(trace=str(tarball), clusters=("cluster10",), start=2870000)
    jobs = JOB_SOURCES.get("elasticflow").build(config, job_request(HOUR))
    assert [j.origin for j in jobs] == [f"elasticflow:cluster10:{i}" for i in range(6, 11)]


def test_elasticflow_leaves_out_jobs_larger_than_the_cluster() -> None:
    config = ElasticFlowConfig(trace=str(EF_EXCERPT), start=2266000)
    week = 7 * 86400.0
    jobs = JOB_SOURCES.get("elasticflow").build(config, job_request(week, max_gpus=8))
    assert [j.gpus for j in jobs] == [2, 2, 4, 2]
    assert [j.gpus for j in JOB_SOURCES.get("elasticflow").build(config, job_request(week))] == [16, 16, 2, 2, 4, 2]


def test_elasticflow_unknown_cluster_and_late_start_are_refused() -> None:
    source = JOB_SOURCES.get("elasticflow")
    with pytest.raises(WorkloadError, match=r"clusters: \['cluster99'\] not in the trace"):
        source.build(ElasticFlowConfig(trace=str(EF_EXCERPT), clusters=("cluster99",)), job_request(HOUR))
    with pytest.raises(WorkloadError, match="past the end of the trace"):
        source.build(ElasticFlowConfig(trace=str(EF_EXCERPT), start=10**9), job_request(HOUR))


def test_elasticflow_bad_rows_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "cluster01.csv"
    path.write_text("job_id,submission_time,duration,num_gpu\na,10,600,1\nb,20,-5,1\n")
    with pytest.raises(WorkloadError, match=r"cluster01.csv:3: need submission_time >= 0, duration > 0"):
        load_trace(str(path), tmp_path)


def test_elasticflow_embedded_excerpt_has_every_job() -> None:
    rows = load_trace("embedded", DATA)
    assert len(rows) == 69351
    assert sum(1 for r in rows if r.gpus == 8) == 7009


@pytest.mark.skipif(not (SHARED / "elasticflow").is_dir(), reason="full ElasticFlow traces not present")
def test_embedded_elasticflow_excerpt_equals_the_published_tarball() -> None:
    assert load_trace("embedded", DATA) == load_trace(str(SHARED / "elasticflow/raw-traces.tar.gz"), DATA)


def _synthetic_window(i: int) -> list[TraceJob]:
    return [TraceJob(f"w{i}:{k}", arrival=100.0 * k, duration=1000.0, gpus=1 + k % 2) for k in range(10)]


def test_overlay_with_a_scale_takes_whole_windows_and_thins_the_last() -> None:
    whole = overlay_windows(_synthetic_window, 5, job_request(HOUR, scale=2.0))
    assert len(whole) == 20 and {j.origin.split(":")[0] for j in whole} == {"w0", "w1"}
    part = overlay_windows(_synthetic_window, 5, job_request(HOUR, scale=2.5))
    extra = [j for j in part if j.origin.startswith("w2")]
    assert 0 < len(extra) < 10
    assert part == overlay_windows(_synthetic_window, 5, job_request(HOUR, scale=2.5))  # seeded thinning


def test_overlay_with_a_target_reaches_the_offered_demand() -> None:
    one = demand_gpu_seconds(_synthetic_window(0), HOUR)
    jobs = overlay_windows(_synthetic_window, 3, job_request(HOUR, scale=None, target=3.5 * one))
    got = demand_gpu_seconds(jobs, HOUR)
    assert 3.0 * one <= got <= 4.0 * one
    # windows are reused cyclically when the trace has fewer than needed
    assert {j.origin.split(":")[0] for j in jobs} == {"w0", "w1", "w2"}


def test_overlay_refuses_a_trace_without_jobs_in_the_horizon() -> None:
    with pytest.raises(WorkloadError, match="no window of the trace has jobs"):
        overlay_windows(lambda i: [], 3, job_request(HOUR, scale=None, target=10.0))


def test_merge_intervals_clips_and_merges() -> None:
    assert merge_intervals([(5, 8), (-3, 1), (7, 9), (9, 10), (20, 30)], horizon=25) == ((0, 1), (5, 10), (20, 25))


# --- priorities and inline ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("duration", "expected"),
    [
        (600, SpotPriority.SPOTHIGH),
        (3599, SpotPriority.SPOTHIGH),
        (3600, SpotPriority.SPOTMID),
        (50000, SpotPriority.SPOTLOW),
    ],
)
def test_duration_rule(duration: float, expected: SpotPriority) -> None:
    assert PriorityRule().assign(TraceJob("x", 0, duration, 1)) is expected


def test_hash_rule_is_stable_and_follows_the_shares() -> None:
    rule = PriorityRule(rule="hash", high_share=0.2, mid_share=0.3)
    jobs = [TraceJob(f"elasticflow:c:{i}", 0, 100, 1) for i in range(5000)]
    tiers = [rule.assign(j) for j in jobs]
    assert tiers == [rule.assign(j) for j in jobs]
    assert abs(tiers.count(SpotPriority.SPOTHIGH) / 5000 - 0.2) < 0.03
    assert abs(tiers.count(SpotPriority.SPOTLOW) / 5000 - 0.5) < 0.03


def test_fixed_rule_and_explicit_priorities() -> None:
    assert PriorityRule(rule="fixed", fixed=SpotPriority.SPOTLOW).assign(TraceJob("x", 0, 1, 1)) is SpotPriority.SPOTLOW
    explicit = TraceJob("x", 0, 1, 1, SpotPriority.SPOTHIGH)
    assert PriorityRule(rule="fixed", fixed=SpotPriority.SPOTLOW).assign(explicit) is SpotPriority.SPOTHIGH


def test_priority_rule_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^priority.rule: 'random' is not one of"):
        from_mapping(PriorityRule, {"rule": "random"}, "priority")
    with pytest.raises(ConfigError, match=r"^priority: midBelow"):
        from_mapping(PriorityRule, {"highBelow": "2h", "midBelow": "1h"}, "priority")


def test_inline_sources_take_what_is_written() -> None:
    owners_cfg = from_mapping(InlineOwners, {"owners": [{"active": [{"start": "1h", "end": "2h"}]}]})
    owners = OWNER_SOURCES.get("inline").build(owners_cfg, owner_request(1))
    assert owners[0].active == ((3600.0, 7200.0),)
    with pytest.raises(WorkloadError, match=r"inline.owners: lists 1 owner\(s\) but the group has room for 2"):
        OWNER_SOURCES.get("inline").build(owners_cfg, owner_request(2))
    jobs_cfg = from_mapping(
        InlineJobs, {"jobs": [{"arrival": "10m", "duration": "1h", "gpus": 4, "priority": "spothigh"}]}
    )
    jobs = JOB_SOURCES.get("inline").build(jobs_cfg, job_request(HOUR, scale=None))
    assert jobs == [TraceJob("inline:jobs:0", 600.0, 3600.0, 4, SpotPriority.SPOTHIGH)]
    with pytest.raises(WorkloadError, match="drop 'load' and 'scale'"):
        JOB_SOURCES.get("inline").build(jobs_cfg, job_request(HOUR, scale=2.0))
