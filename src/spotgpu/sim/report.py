"""Presenting a simulation: the terminal table, ``summary.json``, ``report.html`` and PNG plots.

Side effects: :func:`write_outputs` creates the output folder and writes files into it (the
plots through matplotlib's Agg backend, imported only there so that ``--json`` stays fast).
:func:`summary_table` is pure.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from spotgpu.sim.model import CATEGORY_NAMES, Category

if TYPE_CHECKING:
    from spotgpu.sim.runner import SimulationResult
    from spotgpu.sim.simulation import PolicyRun

PLOTS: Final = (
    ("allocation.png", "GPU allocation over time"),
    ("reclaimed.png", "Reclaimed and wasted GPU-hours per policy"),
    ("evictions.png", "Evictions by reason"),
    ("spot_cdf.png", "Spot queueing delay and completion time (CDF)"),
    ("owner_hold.png", "Owner-visible hold on return"),
)

COLUMNS: Final = (
    ("policy", "name", "{}"),
    ("reclaimed GPU-h", "reclaimed_gpu_hours", "{:.1f}"),
    ("spot GPU-h", "spot_gpu_hours", "{:.1f}"),
    ("wasted GPU-h", "wasted_spot_gpu_hours", "{:.1f}"),
    ("wasted/spot", "wasted_spot_percent", "{:.1f}%"),
    ("evictions", "evictions_total", "{}"),
    ("spot done", "spot_jobs_completed", "{}"),
    ("vs base", "spot_jobs_completed_vs_baseline", "{:+d}"),
    ("wait p50 s", "spot_wait_s_p50", "{:.0f}"),
    ("wait p99 s", "spot_wait_s_p99", "{:.0f}"),
    ("JCT p50 h", "spot_jct_s_p50", "{:.2f}"),
    ("hold p99 ms", "owner_hold_ms_p99", "{:.2f}"),
    ("hold max ms", "owner_hold_ms_max", "{:.2f}"),
    ("busy", "gpu_busy_rate", "{:.1%}"),
)

CATEGORY_COLORS: Final = {
    Category.FREE: "#e8e8e8",
    Category.SHADOW_IDLE: "#c9c9c9",
    Category.SPOT_UNALLOCATED: "#8fbcd4",
    Category.RESERVED: "#6a5acd",
    Category.OWNER_ACTIVE: "#2f4f4f",
    Category.OWNER_IDLE: "#f4d58d",
    Category.SPOT_LENT: "#2e8b57",
    Category.SPOT_EXPOSED: "#d62728",
}


RECOMMENDED_MARK: Final = " *"


def _cell(fmt: str, value: object, key: str) -> str:
    if key == "spot_jct_s_p50" and isinstance(value, int | float):
        value = value / 3600
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def _row(entry: dict[str, Any]) -> list[str]:
    cells = [_cell(fmt, entry.get(key), key) for _, key, fmt in COLUMNS]
    if entry.get("recommended"):
        cells[0] += RECOMMENDED_MARK
    return cells


def notes(summary: dict[str, Any]) -> list[str]:
    """The lines under the table: the recommendation, censoring, the latency model, warnings."""
    policies = summary["policies"]
    out = []
    if any(p.get("recommended") for p in policies):
        out.append("* recommended policy")
    base = summary.get("baseline_policy")
    out.append(
        "wasted/spot: wasted spot GPU-hours / all spot GPU-hours; vs base: spot jobs completed minus "
        + (f"{base}'s" if base else "a baseline's (none in this run)")
    )
    censored = ", ".join(f"{p['name']} {p.get('spot_wait_censored', 0)}" for p in policies)
    out.append(
        f"spot waits: over all {summary['scenario']['spot_jobs']} submitted spot jobs; those never started are "
        f"censored at the end (wait = end - submit): {censored}"
    )
    out.append(
        "latencies: drawn per event from seeded distributions over the benchmarks' quantiles "
        "(spotgpu/sim/defaults.py; summary scenario.latencies), so owner holds are model output"
    )
    out.extend(f"warning: {w}" for w in summary["scenario"].get("warnings", ()))
    return out


def summary_table(summary: dict[str, Any]) -> str:
    """A plain-text table of the policies, with the scenario in one line above it."""
    rows = [[title for title, _, _ in COLUMNS]]
    for entry in summary["policies"]:
        rows.append(_row(entry))
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = []
    sc = summary["scenario"]
    lines.append(
        f"scenario {sc['name']}: {sc['nodes']} nodes, {sc['gpus']} GPUs ({sc['owner_gpus']} held by "
        f"{sc['owners']} owners, active {sc['owner_active_fraction']:.0%} of the time), "
        f"{sc['simulated_hours']:g} h simulated, {sc['spot_jobs']} spot jobs "
        f"(offered load {sc['spot_offered_load']:.0%}), {sc['reserved_jobs']} reserved jobs"
    )
    for n, row in enumerate(rows):
        lines.append(
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    evictions = ", ".join(
        f"{e['name']}: {', '.join(f'{r} {n}' for r, n in e['evictions'].items()) or 'none'}"
        for e in summary["policies"]
    )
    lines.extend(notes(summary))
    lines.append(f"evictions by reason: {evictions}")
    lines.append(f"wall time {summary['wall_seconds']:.1f} s")
    return "\n".join(lines)


# --- files -------------------------------------------------------------------------------------


def write_outputs(result: SimulationResult, out: Path) -> list[Path]:
    """Write summary.json, the PNG plots and report.html into ``out``; return the files written."""
    out.mkdir(parents=True, exist_ok=True)
    summary = result.summary()
    written = []
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    written.append(path)
    written.extend(write_plots(result.runs, result.scenario.duration, out))
    path = out / "report.html"
    path.write_text(render_html(summary))
    written.append(path)
    return written


def write_plots(runs: Sequence[PolicyRun], horizon: float, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = (
        ("allocation.png", _plot_allocation(plt, runs, horizon)),
        ("reclaimed.png", _plot_reclaimed(plt, runs)),
        ("evictions.png", _plot_evictions(plt, runs)),
        ("spot_cdf.png", _plot_spot_cdfs(plt, runs)),
        ("owner_hold.png", _plot_holds(plt, runs)),
    )
    written = [_save(fig, out / name) for name, fig in plots]
    plt.close("all")
    return written


def _plot_allocation(plt: Any, runs: Sequence[PolicyRun], horizon: float) -> Any:
    """GPU allocation over time: one stacked-area panel per policy."""
    cols = min(3, len(runs))
    rows = math.ceil(len(runs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.2 * rows), squeeze=False, sharey=True)
    for ax, run in zip(axes.flat, runs, strict=False):
        samples = run.metrics.time.samples
        hours = [t / 3600 for t, _ in samples]
        series = [[counts[c] for _, counts in samples] for c in Category]
        ax.stackplot(
            hours,
            series,
            labels=[CATEGORY_NAMES[c].replace("_", " ") for c in Category],
            colors=[CATEGORY_COLORS[c] for c in Category],
            linewidth=0,
        )
        ax.set_title(run.policy.name, fontsize=10)
        ax.set_xlim(0, horizon / 3600)
        ax.set_xlabel("hours")
    for ax in axes.flat[len(runs) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("GPUs")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="center right", fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    return fig


def _plot_reclaimed(plt: Any, runs: Sequence[PolicyRun]) -> Any:
    """Reclaimed vs wasted GPU-hours per policy."""
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(runs)), 3.6))
    x = range(len(runs))
    width = 0.38
    reclaimed = [float(r.summary["reclaimed_gpu_hours"]) for r in runs]  # type: ignore[arg-type]
    wasted = [float(r.summary["wasted_spot_gpu_hours"]) for r in runs]  # type: ignore[arg-type]
    ax.bar([i - width / 2 for i in x], reclaimed, width, label="reclaimed (spot on lent GPUs)", color="#2e8b57")
    ax.bar([i + width / 2 for i in x], wasted, width, label="wasted (lost to evictions)", color="#d62728")
    ax.set_xticks(list(x), [r.policy.name for r in runs], rotation=20, ha="right", fontsize=9)
    ax.set_ylabel("GPU-hours")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _plot_evictions(plt: Any, runs: Sequence[PolicyRun]) -> Any:
    """Gang evictions by reason (stacked) per policy."""
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(runs)), 3.6))
    x = range(len(runs))
    reasons = sorted({reason for r in runs for reason in r.metrics.returns.evictions})
    bottom = [0.0] * len(runs)
    palette = ["#ff7f0e", "#1f77b4", "#9467bd", "#8c564b"]
    for k, reason in enumerate(reasons):
        values = [float(r.metrics.returns.evictions.get(reason, 0)) for r in runs]
        ax.bar(list(x), values, 0.6, bottom=bottom, label=reason, color=palette[k % len(palette)])
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xticks(list(x), [r.policy.name for r in runs], rotation=20, ha="right", fontsize=9)
    ax.set_ylabel("gang evictions")
    if reasons:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _plot_spot_cdfs(plt: Any, runs: Sequence[PolicyRun]) -> Any:
    """Spot queueing delay (censored waits included) and completion time, as CDFs."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, run in enumerate(runs):
        waits = run.metrics.jobs.spot_waits + run.metrics.jobs.spot_waits_censored
        label = f"{run.policy.name}, {len(run.metrics.jobs.spot_waits_censored)} censored"
        _cdf(ax1, [w / 60 for w in waits], label, f"C{i}")
        _cdf(ax2, [j / 3600 for j in run.metrics.jobs.spot_jcts], run.policy.name, f"C{i}")
    ax1.set_xscale("symlog", linthresh=1.0)
    ax1.set_xlabel("spot queueing delay, unstarted jobs censored at the end (minutes, log above 1)")
    ax2.set_xlabel("spot job completion time (hours)")
    for ax in (ax1, ax2):
        ax.set_ylabel("fraction of jobs")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _plot_holds(plt: Any, runs: Sequence[PolicyRun]) -> Any:
    """The owner-hold distribution per policy."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    any_hold = False
    for i, run in enumerate(runs):
        if run.metrics.returns.holds_ms:
            any_hold = True
            _cdf(ax, run.metrics.returns.holds_ms, run.policy.name, f"C{i}")
    ax.set_xlabel("owner's first GPU call held on return (ms)")
    ax.set_ylabel("fraction of returns")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    if any_hold:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no owner came back to a lent GPU", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    return fig


def _cdf(ax: Any, values: Sequence[float], label: str, color: str) -> None:
    if not values:
        return
    data = sorted(values)
    n = len(data)
    ax.step(data, [(i + 1) / n for i in range(n)], where="post", label=f"{label} (n={n})", color=color)


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path


def render_html(summary: dict[str, Any]) -> str:
    """A self-contained page (the PNGs are referenced next to it)."""
    e = html.escape
    sc = summary["scenario"]
    head = [title for title, _, _ in COLUMNS]
    body = []
    for entry in summary["policies"]:
        body.append("<tr>" + "".join(f"<td>{e(cell)}</td>" for cell in _row(entry)) + "</tr>")
    detail_keys = (
        [k for k in summary["policies"][0] if k not in {"gpu_hours_by_category", "evictions"}]
        if summary["policies"]
        else []
    )
    detail = []
    for key in detail_keys:
        cells = "".join(f"<td>{e(str(p.get(key)))}</td>" for p in summary["policies"])
        detail.append(f"<tr><th>{e(key)}</th>{cells}</tr>")
    plots = "".join(
        f'<figure><img src="{name}" alt="{e(title)}"><figcaption>{e(title)}</figcaption></figure>'
        for name, title in PLOTS
    )
    attribution = "".join(
        f"<li>{e(a['data'])}: {e(a['source'])}; {e(a['license'])}. Cite: {e(a['cite'])}.</li>"
        for a in summary["attribution"]
    )
    groups = ", ".join(f"{g['name']} ({g['source']}, {g['nodes']} nodes)" for g in sc["owner_groups"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>spotgpu simulate: {e(sc["name"])}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
th {{ background: #f4f4f4; }} td:first-child, th:first-child {{ text-align: left; }}
figure {{ display: inline-block; margin: 0.5em; }} img {{ max-width: 100%; }}
footer {{ font-size: 0.8em; color: #555; border-top: 1px solid #ccc; margin-top: 2em; }}
</style></head><body>
<h1>spotgpu simulate: {e(sc["name"])}</h1>
<p>{e(sc["description"])}</p>
<p>{sc["nodes"]} nodes, {sc["gpus"]} GPUs; owners: {e(groups)}; {sc["owner_gpus"]} GPUs held by {sc["owners"]} owners,
active {sc["owner_active_fraction"]:.0%} of the time; {sc["unallocated_gpus"]} unallocated.
{sc["spot_jobs"]} spot jobs (offered load {sc["spot_offered_load"]:.0%}), {sc["reserved_jobs"]} reserved jobs
(offered load {sc["reserved_offered_load"]:.0%}); {sc["simulated_hours"]:g} h simulated, seed {sc["seed"]},
checkpoint interval {sc["checkpoint_interval_s"]:g} s. Wall time {summary["wall_seconds"]:.1f} s.</p>
<h2>Policies</h2>
<table><tr>{"".join(f"<th>{e(h)}</th>" for h in head)}</tr>{"".join(body)}</table>
<ul>{"".join(f"<li>{e(line)}</li>" for line in notes(summary))}</ul>
<h2>Plots</h2>
{plots}
<h2>All figures</h2>
<table>{"".join(detail)}</table>
<footer><p>Definitions of every figure: docs/simulator.md. Trace data:</p><ul>{attribution}</ul>
<p>spotgpu {e(str(summary["spotgpu_version"]))}.</p></footer>
</body></html>
"""


__all__ = ["PLOTS", "RECOMMENDED_MARK", "notes", "render_html", "summary_table", "write_outputs", "write_plots"]
