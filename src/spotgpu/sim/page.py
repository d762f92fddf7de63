"""``report.html``: one self-contained page a platform team reads in a browser.

Pure: :func:`render_html` turns a summary (and the plots' PNG bytes, embedded as data URIs)
into HTML; :mod:`spotgpu.sim.report` writes it. The page needs nothing outside itself: it says
what every column and policy means, how to read the plots, and where the latency model's
figures come from, so a reader with only the installed package (no source tree) can follow it.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping
from typing import Any, Final

from spotgpu.sim.table import COLUMNS, DEFINITIONS, describe_policy, duration, headline, notes, row, scenario_line

PLOTS: Final = (
    ("allocation.png", "GPU allocation over time, per policy: what every GPU was doing (stacked)"),
    ("reclaimed.png", "Useful gain, reclaimed and wasted GPU-hours per policy"),
    ("evictions.png", "Spot gang evictions by reason"),
    ("spot_cdf.png", "Spot queueing delay (jobs never started counted at the end) and completion time, as CDFs"),
    ("owner_hold.png", "How long an owner's first GPU call is held on return (modelled)"),
)

HOW_TO_READ: Final = (
    "Each policy replays the same owners and the same spot and reserved jobs; only the lending policy and the "
    "scheduler's node strategy differ. The baseline lends nothing: spot work runs only on unallocated GPUs.",
    "Read the useful gain first: the spot GPU-hours that did useful work beyond what the baseline got, after "
    'subtracting the work lost to evictions. "of best" puts each policy against the best one of this run.',
    "Then the cost: wasted GPU-hours and evictions (spot work lost when an owner comes back or reserved work "
    "preempts it), the spot waits, and the owners' hold, the delay an owner's first GPU call sees on return.",
    "Reclaimed GPU-hours count spot work on lent GPUs, wasted work included, and work that would otherwise have "
    "run on unallocated GPUs: a policy that puts lent GPUs first reclaims more without serving more.",
)

PROVENANCE: Final = (
    "The owner holds, kill and start-up times are not measured in this run: each occurrence is drawn with the "
    "run's seeded generator from a table of benchmark quantiles (linear between rows, no tail beyond the highest "
    "row). The benchmarks ran spotgpu's node agent, return guard and runtime on a 2-vCPU machine with "
    "containerd and runc and stand-in devices (no GPU); a real GPU's driver calls are not in these figures."
)

_SECONDS_SUFFIXES: Final = ("_s_p50", "_s_p99", "_time_s")


def _figure(key: str, value: object) -> str:
    """A summary value as a reader wants it: no ``None``/``True``, no six decimals, seconds in words."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_figure(k, v)}" for k, v in value.items()) or "none"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if key.endswith(_SECONDS_SUFFIXES):
            return duration(value)
        if key.endswith("_rate"):
            return f"{value:.1%}"
        if key.endswith("_share_of_best"):
            return f"{value:.0%}"
        if key.endswith(("_ms_p50", "_ms_p99", "_ms_max")):
            return f"{value:.2f}"
        return f"{value:,.1f}"
    return str(value)


def _latencies(latencies: Mapping[str, Any]) -> str:
    e = html.escape
    rows = []
    for key, table in latencies.items():
        if isinstance(table, dict):
            points = ", ".join(f"p{q * 100:g} {ms:g} ms" for q, ms in table.get("quantiles_ms", ()))
            source = str(table.get("source", ""))
        else:
            points, source = _figure(key, table), ""
        rows.append(f"<tr><td>{e(key)}</td><td>{e(points)}</td><td class=l>{e(source)}</td></tr>")
    head = "<tr><th>latency</th><th>quantiles</th><th>measured by (result files: spotgpu's source repository)</th></tr>"
    return "<table>" + head + "".join(rows) + "</table>"


def _img(name: str, title: str, images: Mapping[str, bytes] | None) -> str:
    e = html.escape
    src = name
    if images is not None and name in images:
        src = "data:image/png;base64," + base64.b64encode(images[name]).decode("ascii")
    return f'<figure><img src="{src}" alt="{e(title)}"><figcaption>{e(title)}</figcaption></figure>'


def _all_figures(policies: list[dict[str, Any]]) -> str:
    e = html.escape
    keys = [k for k in policies[0] if k not in {"name", "gpu_hours_by_category"}] if policies else []
    names = "".join(f"<th>{e(str(p['name']))}</th>" for p in policies)
    rows = [f"<tr><th></th>{names}</tr>"]
    for key in keys:
        cells = "".join(f"<td>{e(_figure(key, p.get(key)))}</td>" for p in policies)
        rows.append(f"<tr><th>{e(key)}</th>{cells}</tr>")
    categories = list(policies[0].get("gpu_hours_by_category", {})) if policies else []
    for name in categories:
        cells = "".join(f"<td>{_figure(name, p['gpu_hours_by_category'].get(name))}</td>" for p in policies)
        rows.append(f"<tr><th>GPU-hours {e(name.replace('_', ' '))}</th>{cells}</tr>")
    return "<div class=wide><table>" + "".join(rows) + "</table></div>"


STYLE: Final = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1240px; color: #222; padding: 0 1em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.82em; }
.wide { overflow-x: auto; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.4em; text-align: right; }
td { white-space: nowrap; } td.l { white-space: normal; }
th { background: #f4f4f4; } td:first-child, th:first-child, td.l { text-align: left; }
tr.rec td { background: #eef7ee; font-weight: 600; }
.lead { font-size: 1.1em; background: #eef7ee; border-left: 4px solid #2e8b57; padding: 0.5em 1em; }
figure { display: inline-block; margin: 0.5em; vertical-align: top; } img { max-width: 100%; }
dt { font-weight: 600; } dd { margin: 0 0 0.4em 1.5em; }
footer { font-size: 0.8em; color: #555; border-top: 1px solid #ccc; margin-top: 2em; }
"""


def _policies(summary: dict[str, Any]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(title)}</th>" for title, _, _ in COLUMNS)
    body = "".join(
        f"<tr{' class=rec' if p.get('recommended') else ''}>" + "".join(f"<td>{e(c)}</td>" for c in row(p)) + "</tr>"
        for p in summary["policies"]
    )
    described = "".join(f"<dt>{e(str(p['name']))}</dt><dd>{e(describe_policy(p))}</dd>" for p in summary["policies"])
    return f"<div class=wide><table><tr>{head}</tr>{body}</table></div><h3>The policies</h3><dl>{described}</dl>"


def render_html(summary: dict[str, Any], images: Mapping[str, bytes] | None = None) -> str:
    """The page; ``images`` (file name -> PNG bytes) are embedded, else referenced next to the page."""
    e = html.escape
    sc = summary["scenario"]
    lead = headline(summary)
    groups = ", ".join(f"{g['name']} ({g['source']}, {g['nodes']} nodes)" for g in sc["owner_groups"])
    attribution = "".join(
        f"<li>{e(a['data'])}: {e(a['source'])}; {e(a['license'])}. Cite: {e(a['cite'])}.</li>"
        for a in summary["attribution"]
    )
    definitions = "".join(f"<dt>{e(t)}</dt><dd>{e(m)}</dd>" for t, m in DEFINITIONS)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>spotgpu simulate: {e(sc["name"])}</title>
<style>{STYLE}</style></head><body>
<h1>spotgpu simulate: {e(sc["name"])}</h1>
<p>{e(sc["description"])}</p>
{f'<p class="lead">{e(lead)}.</p>' if lead else ""}
<p>{e(scenario_line(sc))}. Owners: {e(groups)}; {sc["unallocated_gpus"]} GPUs unallocated; seed {sc["seed"]};
checkpoint interval {e(duration(float(sc["checkpoint_interval_s"])))}. Wall time {summary["wall_seconds"]:.1f} s.</p>
<h2>How to read this</h2>
{"".join(f"<p>{e(p)}</p>" for p in HOW_TO_READ)}
<h2>Policies</h2>
{_policies(summary)}
<h3>Columns</h3><dl>{definitions}</dl>
<ul>{"".join(f"<li>{e(line)}</li>" for line in notes(summary, lead=False, definitions=False))}</ul>
<h2 id="plots">Plots</h2>
{"".join(_img(name, title, images) for name, title in PLOTS)}
<h2>Where the latencies come from</h2>
<p>{e(PROVENANCE)}</p>
<p>{e(str(sc.get("latency_model", "")))}</p>
{_latencies(sc.get("latencies", {}))}
<h2>All figures</h2>
{_all_figures(summary["policies"])}
<footer><p>Trace data:</p><ul>{attribution}</ul>
<p>spotgpu {e(str(summary["spotgpu_version"]))}; the figures above are in summary.json next to this page.</p></footer>
</body></html>
"""


__all__ = ["HOW_TO_READ", "PLOTS", "PROVENANCE", "render_html"]
