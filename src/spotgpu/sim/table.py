"""The simulator's summary in words: the terminal table, its notes, policy descriptions, durations.

Pure: no I/O. The page (:mod:`spotgpu.sim.page`) shows the same columns, notes and descriptions,
so the terminal and the browser read alike.
"""

from __future__ import annotations

from typing import Any, Final

from spotgpu.sim.metrics import MIN_GAIN_GPU_HOURS

RECOMMENDED_MARK: Final = " *"

COLUMNS: Final = (
    ("policy", "name", "{}"),
    ("useful gain GPU-h", "useful_gain_gpu_hours", "{:+.1f}"),
    ("of best", "useful_gain_share_of_best", "{:.0%}"),
    ("wasted GPU-h", "wasted_spot_gpu_hours", "{:.1f}"),
    ("wasted/spot", "wasted_spot_percent", "{:.1f}%"),
    ("spot GPU-h", "spot_gpu_hours", "{:.1f}"),
    ("reclaimed GPU-h", "reclaimed_gpu_hours", "{:.1f}"),
    ("evictions", "evictions_total", "{}"),
    ("spot done", "spot_jobs_completed", "{}"),
    ("vs base", "spot_jobs_completed_vs_baseline", "{:+d}"),
    ("wait p50", "spot_wait_s_p50", "duration"),
    ("wait p99", "spot_wait_s_p99", "duration"),
    ("JCT p50", "spot_jct_s_p50", "duration"),
    ("hold p99 ms", "owner_hold_ms_p99", "{:.2f}"),
    ("hold max ms", "owner_hold_ms_max", "{:.2f}"),
    ("busy", "gpu_busy_rate", "{:.1%}"),
)
"""(title, summary key, format): the useful gain leads; ``duration`` cells are seconds in words."""

DEFINITIONS: Final = (
    (
        "useful gain GPU-h",
        "what lending wins: useful spot GPU-hours (spot GPU-hours minus those lost to evictions) minus the "
        "baseline's, the same workload without lending",
    ),
    ("of best", "the useful gain as a share of the largest useful gain in this run"),
    ("wasted GPU-h", "spot GPU-hours lost to evictions (work since the last checkpoint, on every pod of the gang)"),
    ("wasted/spot", "wasted spot GPU-hours / all spot GPU-hours"),
    (
        "reclaimed GPU-h",
        "spot GPU-hours on lent GPUs of idle owners; wasted work included, and including work that would "
        "otherwise have run on unallocated GPUs, so it is not the win",
    ),
    ("vs base", "spot jobs completed minus the baseline's"),
    ("wait p50/p99", "spot queueing delay over every submitted spot job (those never started: censored at the end)"),
    ("JCT p50", "spot job completion time (arrival to completion), median over completed jobs"),
    ("hold p99/max ms", "how long an owner's first GPU call is held on return while its GPUs are lent"),
    ("busy", "GPU-time doing work (active owners, reserved and spot jobs) over all GPU-time"),
)
"""What each column means (the report's "how to read this", the terminal's notes)."""

STRATEGY_WORDS: Final = {
    "auto": "spot work on unallocated GPUs first, lent GPUs only for spot work that would otherwise wait",
    "idle": "spot work on unallocated GPUs first, lent GPUs when they score better",
    "lowpower": "spot work on lent GPUs first",
}


def duration(seconds: float) -> str:
    """Seconds in words a reader takes in at a glance: ``0.2 s``, ``45 s``, ``12 min``, ``19.5 h``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def cell(fmt: str, value: object) -> str:
    """One table cell: ``-`` for a missing figure."""
    if value is None:
        return "-"
    if fmt == "duration" and isinstance(value, int | float):
        return duration(float(value))
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def row(entry: dict[str, Any]) -> list[str]:
    """A policy's cells in :data:`COLUMNS` order, the recommended one marked."""
    cells = [cell(fmt, entry.get(key)) for _, key, fmt in COLUMNS]
    if entry.get("recommended"):
        cells[0] += RECOMMENDED_MARK
    return cells


def describe_policy(entry: dict[str, Any]) -> str:
    """What a policy does, from its settings in the summary."""
    if not entry.get("lending"):
        return "no lending: spot work only on unallocated GPUs (classic spot); the comparison's baseline"
    wait = duration(float(entry.get("max_inactive_time_s") or 0.0))
    if entry.get("lend_policy") == "predictive":
        when = f"lends an owner's GPUs after {wait} idle when its learned idle periods promise enough time"
    else:
        when = f"lends an owner's GPUs after {wait} idle (timer)"
    guard = "" if entry.get("guard", True) else "; no return guard (return seen at the next poll)"
    words = STRATEGY_WORDS.get(str(entry.get("strategy")), str(entry.get("strategy")))
    mark = "; recommended (what a cluster runs by default)" if entry.get("recommended") else ""
    return f"{when}; {words}{guard}{mark}"


def headline(summary: dict[str, Any]) -> str | None:
    """One sentence: the recommended policy's gain against the best one's, and their waste."""
    entries = [p for p in summary["policies"] if isinstance(p.get("useful_gain_gpu_hours"), float)]
    if not entries or summary.get("baseline_policy") is None:
        return None
    best = max(entries, key=lambda p: p["useful_gain_gpu_hours"])
    if best["useful_gain_gpu_hours"] < MIN_GAIN_GPU_HOURS:
        return "no policy gains a useful spot GPU-hour over not lending in this run"
    text = (
        f"best useful gain: {best['name']} {best['useful_gain_gpu_hours']:+,.0f} GPU-h over "
        f"{summary['baseline_policy']} ({best['wasted_spot_gpu_hours']:,.0f} GPU-h wasted)"
    )
    chosen = next((p for p in entries if p.get("recommended")), None)
    if chosen is not None and chosen is not best:
        share = chosen.get("useful_gain_share_of_best") or 0.0
        waste = chosen["wasted_spot_gpu_hours"] / best["wasted_spot_gpu_hours"] if best["wasted_spot_gpu_hours"] else 0
        text += (
            f"; the recommended {chosen['name']} {chosen['useful_gain_gpu_hours']:+,.0f} GPU-h, {share:.0%} of "
            f"the best, with {waste:.0%} of its waste ({chosen['wasted_spot_gpu_hours']:,.0f} GPU-h)"
        )
    return text


def notes(summary: dict[str, Any], *, lead: bool = True, definitions: bool = True) -> list[str]:
    """The lines under the table: the headline, definitions, censoring, the latency model, warnings
    (the page shows the headline and the definitions on their own: ``lead``/``definitions`` off)."""
    policies = summary["policies"]
    out = []
    line = headline(summary) if lead else None
    if line is not None:
        out.append(line)
    if any(p.get("recommended") for p in policies):
        out.append("* recommended policy")
    base = summary.get("baseline_policy")
    if base is None:
        out.append("no baseline (a policy without lending) in this run: useful gain and vs base are empty")
    if definitions:
        out.extend(f"{title}: {meaning}" for title, meaning in DEFINITIONS)
    censored = ", ".join(f"{p['name']} {p.get('spot_wait_censored', 0)}" for p in policies)
    out.append(
        f"spot jobs never started, censored at the end of the run (wait = end - submit, a lower bound), of "
        f"{summary['scenario']['spot_jobs']} submitted: {censored}"
    )
    out.append(
        "owner holds are model output: each latency is drawn from seeded distributions over benchmark quantiles "
        "measured on stand-in devices (no GPU); summary.json scenario.latencies lists every table and its source"
    )
    out.extend(f"warning: {w}" for w in summary["scenario"].get("warnings", ()))
    return out


def scenario_line(sc: dict[str, Any]) -> str:
    return (
        f"scenario {sc['name']}: {sc['nodes']} nodes, {sc['gpus']} GPUs ({sc['owner_gpus']} held by "
        f"{sc['owners']} owners, active {sc['owner_active_fraction']:.0%} of the time), "
        f"{sc['simulated_hours']:g} h simulated, {sc['spot_jobs']} spot jobs "
        f"(offered load {sc['spot_offered_load']:.0%}), {sc['reserved_jobs']} reserved jobs"
    )


def summary_table(summary: dict[str, Any]) -> str:
    """A plain-text table of the policies, with the scenario in one line above it."""
    rows = [[title for title, _, _ in COLUMNS]]
    rows.extend(row(entry) for entry in summary["policies"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = [scenario_line(summary["scenario"])]
    for n, cells in enumerate(rows):
        lines.append(
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.extend(notes(summary))
    evictions = ", ".join(
        f"{e['name']}: {', '.join(f'{r} {n}' for r, n in e['evictions'].items()) or 'none'}"
        for e in summary["policies"]
    )
    lines.append(f"evictions by reason: {evictions}")
    lines.append(f"wall time {summary['wall_seconds']:.1f} s")
    return "\n".join(lines)


__all__ = [
    "COLUMNS",
    "DEFINITIONS",
    "RECOMMENDED_MARK",
    "STRATEGY_WORDS",
    "cell",
    "describe_policy",
    "duration",
    "headline",
    "notes",
    "row",
    "scenario_line",
    "summary_table",
]
