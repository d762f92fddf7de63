"""Trace CSV files: float seconds, and every malformed row an error naming file:line (and the
scenario file), never a raw Python exception."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from spotgpu.cli import main
from spotgpu.core.configfile import ConfigError
from spotgpu.sim.scenario import build_workload, load_scenario
from spotgpu.sim.workloads.base import WorkloadError, csv_rows
from spotgpu.sim.workloads.elasticflow import _parse as parse_elasticflow
from spotgpu.sim.workloads.elasticflow import load_trace
from spotgpu.sim.workloads.helios import _parse_rows, _read_csv

EF_HEADER = "submission_time,duration,num_gpu"
HELIOS_HEADER = "time,total_gpu_num,idle_gpu_num"


def test_elasticflow_accepts_float_seconds(tmp_path: Path) -> None:
    path = tmp_path / "cluster01.csv"
    path.write_text(f"{EF_HEADER}\n10.5,600.25,1\n20,1e3,4.0\n")
    rows = load_trace(str(path), tmp_path)
    assert [(r.submission, r.duration, r.gpus, r.row) for r in rows] == [(10.5, 600.25, 1, 0), (20.0, 1000.0, 4, 1)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"{EF_HEADER}\n10,600\n", r":2: 2 of the header's 3 fields; no num_gpu"),
        (f"{EF_HEADER}\n10,600,1,9\n", r":2: more fields than the header's 3"),
        (f"{EF_HEADER}\n10,600,1\n10,x,1\n", r":3: duration: 'x' is not a number of seconds"),
        (f"{EF_HEADER}\n10,nan,1\n", r":2: duration: 'nan' is not a number of seconds"),
        (f"{EF_HEADER}\n10,60,1.5\n", r":2: num_gpu: '1.5' is not an integer"),
        (f"{EF_HEADER}\n10,60,\n", r":2: num_gpu: '' is not an integer"),
        (f'{EF_HEADER}\n10,60,"1\n', r":2: not valid CSV \(in the record from this line on\)"),
        ("submission_time,num_gpu\n1,1\n", r": missing column\(s\) duration"),
    ],
    ids=["short", "long", "not-a-number", "nan", "fractional-gpus", "empty", "open-quote", "no-column"],
)
def test_elasticflow_malformed_rows_name_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "cluster01.csv"
    path.write_text(text)
    with pytest.raises(WorkloadError, match=re.escape(str(path)) + ".*" + message):
        load_trace(str(path), tmp_path)


FIELD = st.one_of(
    st.integers(-5, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "x", "1e999", "-0", '"', '"a,b"', "\x00", "2020-05-01 00:00:00", "\u00e9", "1_0"]),
    st.text(max_size=8),
)
ROW = st.lists(FIELD, min_size=0, max_size=6).map(",".join)


def _check(text: str, parse: object) -> None:
    """``parse`` either succeeds or raises WorkloadError naming ``trace.csv:<line>`` (or the header)."""
    lines = text.count("\n") + 2
    try:
        parse(text)  # type: ignore[operator]
    except WorkloadError as exc:
        match = re.match(r"^trace\.csv(?::(\d+))?: ", str(exc))
        assert match is not None, str(exc)
        if match.group(1) is not None:
            assert 1 <= int(match.group(1)) <= lines, str(exc)


@settings(max_examples=300, deadline=None)
@given(st.lists(ROW, min_size=1, max_size=5), st.booleans())
def test_any_elasticflow_rows_parse_or_name_their_line(rows: list[str], excerpt: bool) -> None:
    header = f"cluster,row,{EF_HEADER}" if excerpt else EF_HEADER
    text = "\n".join([header, "10,600,1" if not excerpt else "c,0,10,600,1", *rows]) + "\n"
    _check(text, lambda t: parse_elasticflow(t, "trace.csv", None if excerpt else "c"))


@settings(max_examples=300, deadline=None)
@given(st.lists(ROW, min_size=1, max_size=5))
def test_any_helios_rows_parse_or_name_their_line(rows: list[str]) -> None:
    text = "\n".join([HELIOS_HEADER, "2020-05-01 00:00:00,8,1", *rows]) + "\n"

    def parse(t: str) -> None:
        for team, records in _read_csv(t, "trace.csv").items():
            _parse_rows(records, "trace.csv", team)

    _check(text, parse)


def test_csv_rows_skips_blank_lines_and_counts_physical_lines() -> None:
    text = 'a,b\n1,2\n\n"x\ny",3\n4,5\n'
    assert [(line, dict(r)) for line, r in csv_rows(text, "f", ("a", "b"))] == [
        (2, {"a": "1", "b": "2"}),
        (5, {"a": "x\ny", "b": "3"}),
        (6, {"a": "4", "b": "5"}),
    ]


def _scenario_with_trace(tmp_path: Path, trace_text: str) -> Path:
    trace = tmp_path / "cluster07.csv"
    trace.write_text(trace_text)
    scenario = tmp_path / "s.yaml"
    data = {
        "name": "t",
        "duration": "1h",
        "cluster": {"nodes": 1, "gpusPerNode": 8},
        "spotJobs": [{"name": "itp", "source": "elasticflow", "scale": 1, "elasticflow": {"trace": "cluster07.csv"}}],
    }
    scenario.write_text(yaml.safe_dump(data))
    return scenario


def test_trace_errors_name_the_scenario_file_and_the_trace_line(tmp_path: Path) -> None:
    scenario = _scenario_with_trace(tmp_path, f"{EF_HEADER}\n10,600,1\n20,600\n")
    s = load_scenario(scenario)
    with pytest.raises(ConfigError) as info:
        build_workload(s)
    message = str(info.value)
    assert message.startswith(f"{scenario}: spotJobs[0] (itp): {tmp_path / 'cluster07.csv'}:3: ")
    assert "no num_gpu" in message


def test_cli_reports_a_bad_trace_row_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = _scenario_with_trace(tmp_path, f"{EF_HEADER}\n10,six hundred,1\n")
    assert main(["simulate", "--scenario", str(scenario), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{scenario}: spotJobs[0] (itp): " in err
    assert "cluster07.csv:2: duration: 'six hundred' is not a number of seconds" in err
    assert "Traceback" not in err
