"""The default policy set and its recommended policy; the summary's comparisons with the baseline;
job streams that replay their trace; embedded scenarios by name."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotgpu.cli import main
from spotgpu.core.config import AgentConfig
from spotgpu.core.configfile import ConfigError, parse_duration
from spotgpu.core.ids import NodeName
from spotgpu.core.lending import LendRules
from spotgpu.scheduler.model import Node, parse_node_annotations
from spotgpu.sim.inputs import scenario_summary
from spotgpu.sim.lending import policy_rules
from spotgpu.sim.page import render_html
from spotgpu.sim.runner import simulate
from spotgpu.sim.scenario import (
    DEFAULT_POLICIES,
    EMBEDDED_SCENARIOS,
    PolicySpec,
    _policy_set,
    build_workload,
    default_scenario,
    parse_scenario,
    scenario_argument,
)
from spotgpu.sim.table import RECOMMENDED_MARK, summary_table

EF_EXCERPT = Path(__file__).parent / "data" / "elasticflow-cluster10-first40.csv"


def agent_rules(agent: AgentConfig) -> LendRules:
    """The state machine's rules as the agent builds them (``agent.settings``)."""
    return LendRules(agent.max_inactive_time, agent.lending)


def test_default_set_recommends_exactly_auto_predictive() -> None:
    assert [p.name for p in DEFAULT_POLICIES if p.recommended] == ["auto-predictive"]
    names = [p.name for p in DEFAULT_POLICIES]
    assert names[0] == "baseline" and not DEFAULT_POLICIES[0].lending
    assert {"lowpower-2m", "lowpower-10m", "lowpower-30m", "idle-10m", "predictive-2m"} <= set(names)
    for name in ("default", "bursty"):  # both embedded scenarios use the default set
        assert scenario_argument(name).policies == DEFAULT_POLICIES


def test_the_recommended_policy_is_what_a_cluster_runs_by_default() -> None:
    """The agent's defaults (maxInactiveTime, agent.lending) and the scheduler's default node
    strategy (annotation absent) are the recommended policy's, and the chart does not override them."""
    (rec,) = (p for p in DEFAULT_POLICIES if p.recommended)
    agent = AgentConfig()
    assert rec.lending and rec.guard
    assert rec.max_inactive_time == agent.max_inactive_time
    assert policy_rules(rec.max_inactive_time, rec.lend_policy, rec.predictive, rec.guard) == agent_rules(agent)
    assert rec.strategy is Node(NodeName("n"), ()).strategy is parse_node_annotations("n", {})[1]
    values = yaml.safe_load((Path(__file__).parents[2] / "deploy/chart/spotgpu/values.yaml").read_text())
    chart = values["agent"]["config"]
    assert parse_duration(chart["maxInactiveTime"], "maxInactiveTime") == agent.max_inactive_time
    assert chart["lending"]["policy"] == agent.lending.policy.value
    assert not set(chart["lending"]) - {"policy", "unguardedPolicy"}  # predictive: the defaults


def test_a_newer_recommendation_is_one_appended_entry() -> None:
    newer = _policy_set(*DEFAULT_POLICIES, PolicySpec("newer-1m", max_inactive_time=60.0, recommended=True))  # type: ignore[arg-type]
    assert [p.name for p in newer if p.recommended] == ["newer-1m"]
    assert [dataclasses.replace(p, recommended=False) for p in newer[:-1]] == [
        dataclasses.replace(p, recommended=False) for p in DEFAULT_POLICIES
    ]


def _two_policies(**extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "t",
        "duration": "2h",
        "cluster": {"nodes": 2, "gpusPerNode": 8},
        "owners": [
            {
                "name": "dev",
                "source": "inline",
                "nodes": 1,
                "gpusPerOwner": 8,
                "inline": {"owners": [{"active": [{"start": "0s", "end": "10m"}]}]},
            }
        ],
        "spotJobs": [
            {
                "name": "s",
                "source": "inline",
                "inline": {"jobs": [{"arrival": "1m", "duration": "30m", "gpus": 8}] * 8},
            }
        ],
        "policies": [
            {"name": "baseline", "lending": False, "strategy": "idle"},
            {"name": "lend", "maxInactiveTime": "2m", "recommended": True},
        ],
    }
    data.update(extra)
    return data


def test_scenario_marks_at_most_one_recommended_policy() -> None:
    s = parse_scenario(_two_policies())
    assert [p.recommended for p in s.policies] == [False, True]
    both = _two_policies(policies=[{"name": "a", "recommended": True}, {"name": "b", "recommended": True}])
    with pytest.raises(ConfigError, match=r"^policies: at most one policy may be recommended, got \['a', 'b'\]"):
        parse_scenario(both)
    with pytest.raises(ConfigError, match=r"recommended: expected true or false"):
        parse_scenario(_two_policies(policies=[{"name": "a", "recommended": "yes"}]))


def test_summary_compares_with_the_baseline_and_marks_the_recommendation() -> None:
    summary = simulate(parse_scenario(_two_policies()), workers=1).summary()
    base, lend = summary["policies"]  # type: ignore[misc]
    assert summary["baseline_policy"] == "baseline"
    assert (base["recommended"], lend["recommended"]) == (False, True)
    assert base["spot_jobs_completed_vs_baseline"] == 0
    assert lend["spot_jobs_completed_vs_baseline"] == lend["spot_jobs_completed"] - base["spot_jobs_completed"]
    assert lend["spot_jobs_completed"] > base["spot_jobs_completed"]  # the lent node runs a second gang
    for entry in (base, lend):
        share = 100 * entry["wasted_spot_gpu_hours"] / entry["spot_gpu_hours"]
        assert entry["wasted_spot_percent"] == pytest.approx(share, abs=1e-3)
    assert any("censored" in note for note in summary["notes"])  # type: ignore[attr-defined]
    table = summary_table(summary)
    rows = {line.split()[0]: line for line in table.splitlines() if line.startswith(("baseline", "lend"))}
    assert rows["lend"].startswith("lend" + RECOMMENDED_MARK) and RECOMMENDED_MARK not in rows["baseline"]
    assert "* recommended policy" in table and "wasted/spot" in table
    assert f"lend{RECOMMENDED_MARK}" in render_html(summary)


def test_without_a_baseline_the_comparison_is_empty() -> None:
    data = _two_policies(policies=[{"name": "lend", "maxInactiveTime": "2m"}])
    summary = simulate(parse_scenario(data), workers=1).summary()
    assert summary["baseline_policy"] is None
    assert summary["policies"][0]["spot_jobs_completed_vs_baseline"] is None  # type: ignore[index]
    assert summary["policies"][0]["useful_gain_gpu_hours"] is None  # type: ignore[index]
    assert "no baseline (a policy without lending) in this run" in summary_table(summary)


def _replaying(tmp_path: Path) -> Path:
    data = {
        "name": "replay",
        "duration": "6h",
        "cluster": {"nodes": 4, "gpusPerNode": 8},
        "spotJobs": [{"name": "ef", "source": "elasticflow", "load": 2.0, "elasticflow": {"trace": str(EF_EXCERPT)}}],
        "policies": [{"name": "baseline", "lending": False}],
    }
    path = tmp_path / "replay.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_load_beyond_the_trace_says_how_often_it_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _replaying(tmp_path)
    s = scenario_argument(str(path))
    w = build_workload(s)
    (use,) = w.streams
    assert use.max_uses > 1 and use.distinct < use.jobs
    summary = scenario_summary(s, w)
    (stream,) = summary["job_streams"]  # type: ignore[misc]
    assert stream["max_uses_of_a_trace_job"] == use.max_uses
    (warning,) = summary["warnings"]  # type: ignore[misc]
    assert f"replays the same trace jobs up to {use.max_uses} times" in warning
    assert main(["simulate", "--scenario", str(path), "--json", "--no-progress", "--workers", "1"]) == 0
    captured = capsys.readouterr()
    assert f"spotgpu simulate: warning: spotJobs[0] (ef): load 2 replays the same trace jobs up to {use.max_uses}" in (
        captured.err
    )
    assert json.loads(captured.out)["scenario"]["warnings"] == [warning]


def test_the_default_scenario_replays_nothing() -> None:
    s = default_scenario()
    assert scenario_summary(s, build_workload(s))["warnings"] == []


def test_embedded_scenarios_by_name_and_files_by_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert set(EMBEDDED_SCENARIOS) == {"default", "bursty"}
    assert scenario_argument("bursty").name == "bursty"
    assert scenario_argument("default") == default_scenario()
    with pytest.raises(ConfigError, match=r"--scenario: 'nope' is not an embedded scenario \(default, bursty\)"):
        scenario_argument("nope")
    assert main(["simulate", "--scenario", "nope", "--no-progress"]) == 2
    assert "not an embedded scenario" in capsys.readouterr().err
    assert scenario_argument(str(_replaying(tmp_path))).name == "replay"


TUNING = sorted((Path(__file__).parent / "data" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", TUNING, ids=[p.stem for p in TUNING])
def test_the_tuning_scenarios_load_and_use_the_default_set(path: Path) -> None:
    """The scenarios the recommended policy was chosen on (docs/simulator.md, "The recommended
    policy") stay valid: each loads, builds its workload and runs the default policy set."""
    s = scenario_argument(str(path))
    assert s.policies == DEFAULT_POLICIES and s.name == path.stem
    w = build_workload(s)
    assert w.owners and any(j.spot for j in w.jobs) and not scenario_summary(s, w)["warnings"]
