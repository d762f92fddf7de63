"""What a platform team reads: the useful gain over the baseline leads the table, the summary and
the page; the page explains itself (policies, columns, latency provenance) without the source
tree, and shows no raw ``None``/``True`` or six-decimal figures."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.sim.metrics import MIN_GAIN_GPU_HOURS, share_of_best, useful_gain_gpu_hours
from spotgpu.sim.page import render_html
from spotgpu.sim.report import write_outputs
from spotgpu.sim.runner import simulate
from spotgpu.sim.scenario import default_scenario
from spotgpu.sim.table import COLUMNS, duration, summary_table


@pytest.fixture(scope="module")
def result() -> Any:
    return simulate(default_scenario().resized(nodes=16, duration=12 * 3600.0), workers=1)


def test_useful_gain_is_useful_spot_work_over_the_baseline(result: Any) -> None:
    summary = result.summary()
    entries = {p["name"]: p for p in summary["policies"]}
    base = entries[summary["baseline_policy"]]
    assert base["useful_gain_gpu_hours"] == 0.0
    gains = []
    for entry in entries.values():
        useful = entry["spot_gpu_hours"] - entry["wasted_spot_gpu_hours"]
        base_useful = base["spot_gpu_hours"] - base["wasted_spot_gpu_hours"]
        assert entry["useful_gain_gpu_hours"] == pytest.approx(useful - base_useful, abs=1e-5)
        gains.append(entry["useful_gain_gpu_hours"])
    best = max(gains)
    assert best > 0  # lending serves more useful spot work than not lending here
    for entry in entries.values():
        assert entry["useful_gain_share_of_best"] == pytest.approx(entry["useful_gain_gpu_hours"] / best, abs=1e-4)
    assert any(n.startswith("useful_gain_gpu_hours: ") for n in summary["notes"])


@given(st.floats(0, 1e6), st.floats(0, 1e6))
def test_useful_gain_and_share_arithmetic(useful: float, baseline: float) -> None:
    gain = useful_gain_gpu_hours(useful, baseline)
    assert gain == pytest.approx(useful - baseline, abs=1e-6)
    assert useful_gain_gpu_hours(baseline, baseline) == 0.0
    assert share_of_best(gain, 0.0) is None
    assert share_of_best(gain, MIN_GAIN_GPU_HOURS / 2) is None  # sampling noise is no gain to compare with
    if gain >= MIN_GAIN_GPU_HOURS:
        assert share_of_best(gain, gain) == 1.0


def test_the_table_leads_with_the_gain_and_defines_reclaimed(result: Any) -> None:
    assert [title for title, _, _ in COLUMNS[:3]] == ["policy", "useful gain GPU-h", "of best"]
    table = summary_table(result.summary())
    assert "best useful gain: " in table
    assert "reclaimed GPU-h: spot GPU-hours on lent GPUs" in table and "not the win" in table
    assert "stand-in devices" in table


def test_durations_read_in_words() -> None:
    assert [duration(s) for s in (0.153, 45, 189, 70_260)] == ["0.2 s", "45 s", "3 min", "19.5 h"]


def test_the_page_explains_itself_and_needs_no_source_tree(result: Any, tmp_path: Path) -> None:
    write_outputs(result, tmp_path)
    page = (tmp_path / "report.html").read_text()
    for text in ("How to read this", "useful gain GPU-h", "no lending: spot work only on unallocated GPUs",
                 "lends an owner&#x27;s GPUs after 10 min idle", "stand-in devices", "Where the latencies come from",
                 "guardSignal", "p99"):  # fmt: skip
        assert text in page, text
    images = re.findall(r'<img src="([^"]+)"', page)
    assert len(images) == 5 and all(src.startswith("data:image/png;base64,") for src in images)
    all_figures = page.split("<h2>All figures</h2>", 1)[1]
    for raw in (">None<", ">True<", ">False<"):
        assert raw not in all_figures
    assert not re.search(r">-?\d+\.\d{3,}<", all_figures)  # no six-decimal cells
    assert "docs/simulator.md" not in page and "defaults.py" not in page and "/sim/" not in page
    assert re.search(r"<td>\d+(\.\d)? h</td>", page)  # waits in hours, not 70,260 s


def test_the_page_without_a_baseline_leaves_the_gain_empty() -> None:
    summary = simulate(default_scenario().resized(nodes=8, duration=3600.0), workers=1).summary()
    summary["policies"] = [p for p in summary["policies"] if p["lending"]]
    summary["baseline_policy"] = None
    for entry in summary["policies"]:
        entry["useful_gain_gpu_hours"] = entry["useful_gain_share_of_best"] = None
    page = render_html(summary)
    assert "no baseline (a policy without lending) in this run" in page
    assert "best useful gain" not in page


def test_the_plots_legends_show_the_censored_waits_and_the_gain(result: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from spotgpu.sim import report

    waits = report._plot_spot_cdfs(plt, result.runs).axes[0].get_legend()
    assert waits is not None
    assert any(t.get_text().startswith("baseline: ") and "never started" in t.get_text() for t in waits.get_texts())
    gain = report._plot_gain(plt, result.summary()["policies"]).axes[0].get_legend()
    assert gain is not None and "useful gain over the baseline (the win)" in [t.get_text() for t in gain.get_texts()]
    plt.close("all")
