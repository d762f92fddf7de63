"""Writing a simulation's files: ``summary.json``, ``report.html`` (with the PNG plots in it) and the plots.

Side effects: :func:`write_outputs` creates the output folder and writes files into it (the
plots through matplotlib's Agg backend, imported only there so that ``--json`` stays fast). The
terminal table is :mod:`spotgpu.sim.table`'s, the page :mod:`spotgpu.sim.page`'s (both pure).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from spotgpu.sim.model import CATEGORY_NAMES, Category
from spotgpu.sim.page import render_html

if TYPE_CHECKING:
    from spotgpu.sim.runner import SimulationResult
    from spotgpu.sim.simulation import PolicyRun

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


# --- files -------------------------------------------------------------------------------------


def write_outputs(result: SimulationResult, out: Path) -> list[Path]:
    """Write summary.json, the PNG plots and report.html into ``out``; return the files written."""
    out.mkdir(parents=True, exist_ok=True)
    summary = result.summary()
    written = []
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    written.append(path)
    entries = cast(list[dict[str, Any]], summary["policies"])
    plots = write_plots(result.runs, entries, result.scenario.duration, out)
    written.extend(plots)
    path = out / "report.html"
    path.write_text(render_html(summary, {p.name: p.read_bytes() for p in plots}))
    written.append(path)
    return written


def write_plots(runs: Sequence[PolicyRun], entries: Sequence[dict[str, Any]], horizon: float, out: Path) -> list[Path]:
    """The PNG plots of :data:`spotgpu.sim.page.PLOTS`; ``entries`` are the summary's policy entries."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = (
        ("allocation.png", _plot_allocation(plt, runs, horizon)),
        ("reclaimed.png", _plot_gain(plt, entries)),
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


def _plot_gain(plt: Any, entries: Sequence[dict[str, Any]]) -> Any:
    """Useful gain over the baseline, reclaimed and wasted GPU-hours per policy."""
    fig, ax = plt.subplots(figsize=(max(5.0, 1.5 * len(entries)), 3.8))
    x = range(len(entries))
    width = 0.27
    bars = (
        ("useful_gain_gpu_hours", "useful gain over the baseline (the win)", "#1f77b4"),
        ("reclaimed_gpu_hours", "reclaimed (spot on lent GPUs, wasted included)", "#2e8b57"),
        ("wasted_spot_gpu_hours", "wasted (lost to evictions)", "#d62728"),
    )
    for k, (key, label, color) in enumerate(bars):
        values = [float(e.get(key) or 0.0) for e in entries]
        ax.bar([i + (k - 1) * width for i in x], values, width, label=label, color=color)
    ax.set_xticks(list(x), [str(e["name"]) for e in entries], rotation=20, ha="right", fontsize=9)
    ax.set_ylabel("GPU-hours")
    ax.axhline(0, color="#444", linewidth=0.6)
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)
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
        label = f"{run.policy.name}: {len(run.metrics.jobs.spot_waits_censored)} never started"
        _cdf(ax1, [w / 60 for w in waits], label, f"C{i}")
        _cdf(ax2, [j / 3600 for j in run.metrics.jobs.spot_jcts], run.policy.name, f"C{i}")
    ax1.set_xscale("symlog", linthresh=1.0)
    ax1.set_xlabel("spot queueing delay, unstarted jobs censored at the end (minutes, log above 1)")
    ax2.set_xlabel("spot job completion time (hours)")
    for ax in (ax1, ax2):
        ax.set_ylabel("fraction of jobs")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
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


__all__ = ["CATEGORY_COLORS", "write_outputs", "write_plots"]
