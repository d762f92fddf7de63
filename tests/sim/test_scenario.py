"""Scenario files: the embedded default, validation errors that name the key, the workload layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from spotgpu.core.configfile import ConfigError
from spotgpu.core.types import NodeStrategy, SpotPriority
from spotgpu.sim import defaults
from spotgpu.sim.inputs import scenario_summary
from spotgpu.sim.scenario import DEFAULT_POLICIES, build_workload, default_scenario, load_scenario, parse_scenario


def minimal(**extra: Any) -> dict[str, Any]:
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
                "inline": {"owners": [{"active": [{"start": "0s", "end": "1h"}]}]},
            }
        ],
        "spotJobs": [
            {"name": "s", "source": "inline", "inline": {"jobs": [{"arrival": "1m", "duration": "30m", "gpus": 12}]}}
        ],
    }
    data.update(extra)
    return data


def test_default_scenario_loads_and_builds() -> None:
    s = default_scenario()
    assert s.name == "default"
    assert s.cluster.nodes == 64
    assert [p.name for p in s.policies] == [
        "baseline",
        "lowpower-2m",
        "lowpower-10m",
        "lowpower-30m",
        "idle-10m",
        "predictive-2m",
        "auto-predictive",
    ]
    w = build_workload(s)
    summary = scenario_summary(s, w)
    assert summary["owner_gpus"] == 384 and summary["unallocated_gpus"] == 128
    assert 0.3 < summary["spot_offered_load"] < 0.5  # type: ignore[operator]
    assert summary["schedule_period_s"] == 1.0
    assert all(j.spot == (j.priority is not None) for j in w.jobs)


def test_default_scenario_resizes_with_shares_and_loads() -> None:
    s = default_scenario().resized(nodes=128, duration=86400.0, seed=3)
    w = build_workload(s)
    summary = scenario_summary(s, w)
    assert summary["owner_gpus"] == 768 and summary["seed"] == 3 and summary["simulated_hours"] == 24
    assert 0.3 < summary["spot_offered_load"] < 0.5  # type: ignore[operator]


def test_workload_layout_places_owners_on_consecutive_nodes_and_splits_jobs_into_pods() -> None:
    s = parse_scenario(minimal())
    w = build_workload(s)
    assert [(o.node, o.first_gpu, o.trace.gpus) for o in w.owners] == [(0, 0, 8)]
    assert w.spare_nodes == 1
    (job,) = w.jobs
    assert job.name == "s-00000" and job.pod_gpus == (8, 4) and job.gpus == 12
    assert job.priority is SpotPriority.SPOTHIGH  # 30 min < 1 h: duration rule


def test_no_policies_means_the_default_set() -> None:
    s = parse_scenario(minimal())
    assert s.policies == DEFAULT_POLICIES
    assert s.policies[0].lending is False
    assert {p.strategy for p in s.policies[1:]} == {NodeStrategy.IDLE, NodeStrategy.LOWPOWER, NodeStrategy.AUTO}


def test_automatic_schedule_period_grows_with_the_cluster() -> None:
    assert defaults.schedule_period(64) == 1.0
    assert defaults.schedule_period(5000) == 40.0
    s = parse_scenario(minimal(latencies={"schedulePeriod": "5s"}))
    assert s.latencies.period(5000) == 5.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"durration": "1h"}, r"^durration: unknown key; did you mean 'duration'\?"),
        ({"duration": "soon"}, r"^duration: 'soon' is not a duration"),
        ({"cluster": {"nodes": 0}}, r"^cluster: nodes: must be at least 1"),
        ({"latencies": {"detectInterval": 0}}, r"^latencies: detectInterval: must be greater than zero"),
        ({"latencies": {"killFirstTask": "fast"}}, r"^latencies.killFirstTask: 'fast' is not a duration"),
        ({"policies": [{"name": "Bad Name"}]}, r"^policies\[0\]: name: 'Bad Name' must be"),
        ({"policies": [{"name": "a", "strategy": "greedy"}]}, r"^policies\[0\].strategy: 'greedy' is not one of"),
        ({"policies": [{"name": "a"}, {"name": "a"}]}, r"^policies: names must be unique"),
        ({"scheduler": {"nodeOrder": "random"}}, r"^scheduler.nodeOrder: 'random' is not one of"),
        ({"checkpointInterval": -1}, r"^checkpointInterval: duration must be finite and not negative"),
    ],
    ids=["typo", "duration", "nodes", "detect", "kill", "policy-name", "strategy", "dup-policy", "scheduler", "ckpt"],
)
def test_top_level_errors_name_the_key(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_scenario(minimal(**change))


def _owner(**fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": "dev",
        "source": "inline",
        "nodes": 1,
        "gpusPerOwner": 8,
        "inline": {"owners": [{}]},
    }
    entry.update(fields)
    return entry


@pytest.mark.parametrize(
    ("owner", "message"),
    [
        ({"source": "telepathy"}, r"^owners\[0\].source: 'telepathy' is not one of bursty, devmachine, helios, inline"),
        ({"helios": {}}, r"^owners\[0\].helios: a section for source 'helios', but source is 'inline'"),
        ({"share": 0.5}, r"^owners\[0\]: give exactly one of 'nodes'"),
        ({"nodes": 3}, r"^owners: the groups need 3 nodes \(3\) but the cluster has 2 \(cluster.nodes\)"),
        ({"gpusPerOwner": 3}, r"^owners\[0\].gpusPerOwner: 3 must divide cluster.gpusPerNode \(8\)"),
        ({"name": "Dev"}, r"^owners\[0\].name: 'Dev' must be"),
        (
            {"inline": {"owners": [{"active": [{"start": "2h", "end": "1h"}]}]}},
            r"^owners\[0\].inline.owners\[0\].active\[0\]: end",
        ),
        ({"colour": "red"}, r"^owners\[0\].colour: unknown key"),
    ],
    ids=["source", "other-section", "nodes-and-share", "too-many-nodes", "divide", "name", "span", "unknown"],
)
def test_owner_group_errors_name_the_key(owner: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_scenario(minimal(owners=[_owner(**owner)]))


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        ({"load": 0.3, "scale": 2}, r"^spotJobs\[0\]: give at most one of 'load' and 'scale'"),
        ({"load": 0}, r"^spotJobs\[0\].load: must be within"),
        ({"priority": {"rule": "coin"}}, r"^spotJobs\[0\].priority.rule: 'coin' is not one of"),
        ({"elasticflow": {"start": "nope"}}, r"^spotJobs\[0\].elasticflow: a section for source 'elasticflow'"),
        ({"inline": {"jobs": [{"arrival": 0, "duration": "1h", "gpus": 0}]}}, r"^spotJobs\[0\].inline.jobs\[0\]: gpus"),
    ],
    ids=["load-and-scale", "load-zero", "rule", "wrong-section", "gpus"],
)
def test_job_stream_errors_name_the_key(stream: dict[str, Any], message: str) -> None:
    entry: dict[str, Any] = {"name": "s", "source": "inline", "inline": {"jobs": []}}
    entry.update(stream)
    with pytest.raises(ConfigError, match=message):
        parse_scenario(minimal(spotJobs=[entry]))


def test_reserved_streams_have_no_spot_priority() -> None:
    entry = {"name": "r", "source": "inline", "priority": {"rule": "fixed"}, "inline": {"jobs": []}}
    with pytest.raises(ConfigError, match=r"^reservedJobs\[0\].priority: reserved jobs have no spot priority"):
        parse_scenario(minimal(reservedJobs=[entry]))


def test_source_failures_name_the_group(tmp_path: Path) -> None:
    data = minimal(owners=[_owner(source="helios", inline=None, helios={"trace": "missing.csv", "teams": ["x"]})])
    del data["owners"][0]["inline"]
    s = parse_scenario(data, tmp_path)
    with pytest.raises(ConfigError, match=r"^owners\[0\] \(dev\): .*missing.csv: cannot read Helios trace"):
        build_workload(s)


def test_load_scenario_names_the_file_and_resolves_traces_next_to_it(tmp_path: Path) -> None:
    trace = Path(__file__).parent / "data" / "elasticflow-cluster10-first40.csv"
    (tmp_path / "cluster10.csv").write_text(trace.read_text())
    data = minimal(
        spotJobs=[{"name": "s", "source": "elasticflow", "elasticflow": {"trace": "cluster10.csv", "start": 2870000}}]
    )
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    s = load_scenario(path)
    assert s.base_dir == tmp_path
    jobs = build_workload(s).jobs
    assert [j.origin for j in jobs[:2]] == ["elasticflow:cluster10:6", "elasticflow:cluster10:7"]
    path.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match=r"scenario\.yaml: not valid YAML"):
        load_scenario(path)
    path.write_text(yaml.safe_dump(minimal(seed="x")))
    with pytest.raises(ConfigError, match=r"scenario.yaml: seed: expected an integer"):
        load_scenario(path)
    with pytest.raises(ConfigError, match="cannot read scenario"):
        load_scenario(tmp_path / "nope.yaml")
