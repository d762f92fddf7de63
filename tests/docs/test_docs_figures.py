"""Every figure in README.md and docs/*.md that cites a result file is in that file.

The citation convention (docs/results/README.md says the same): a paragraph, a list item, a
table row or a code block *cites* a result file when it names it, as ``docs/results/NAME.json``,
``NAME.json`` or ``NAME`` (the file name without ``.json``, or without its ``-YYYY-MM-DD`` date
when that is unique). A table row also cites what its table's header row and the paragraph
before the table cite; a code block what the paragraph before it cites. In
a unit that cites files, every number must be a value of one of them as printed: within half
a unit of its last printed digit, as is or converted to the unit printed after it (``%`` of a
fraction, ``min`` or ``h`` of seconds, ``s`` of milliseconds, ``MB`` of kB); signs are ignored (a ``+103`` is
the file's ``103``). Not figures: numbers in `code spans` (commands, keys, settings), in link
targets, dates, versions, numbers glued to letters (``p99``, ``x8``) and whole numbers up to 10
(counts of things: 2 cores, 7 policies). Numbers inside a file's strings count as its values
(its command, its sources' text).

Also: no document cites a file that is not in the repository, and every result file was
measured on committed code (``git.dirty: false``), but for the node-level runs listed in
AWAITING_REMEASURE, which are re-measured on a clean tree (the list may only shrink); a unit
that cites only such files is not checked until they are.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DATED = re.compile(r"-\d{4}-\d{2}-\d{2}$")
NUMBER = re.compile(r"(?<![\w.,/:#])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?![\w]|\.\d|,\d{3})")
NOT_FIGURES = (
    re.compile(r"`[^`]*`"),  # code spans
    re.compile(r"\]\([^)]*\)"),  # link targets
    re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),  # dates
    re.compile(r"\b\d+(?:\.\d+){2,}\b"),  # versions
    re.compile(r"\b[0-9a-f]{7,40}\b"),  # revisions
)
UNIT = re.compile(r"(?:\s*(?:-|to)\s*[\d.,]+)?\s*(%|min\b|h\b|s\b|ms\b|MB\b|GB\b|GiB\b)")
"""The unit printed after a number (or after the range it starts: ``1.9-3.8%``)."""
SCALES = {
    "%": (1.0, 100.0),
    "min": (1.0, 1 / 60),
    "h": (1.0, 1 / 3600),
    "s": (1.0, 1 / 1000),
    "MB": (1.0, 1 / 1024, 1 / 1000),
    "GB": (1.0, 1 / 1024**2, 1 / 1000**2),
    "GiB": (1.0, 1 / 1024**2, 1 / 1024**3),
}
"""How a file's value may be printed with that unit: as is, or from a fraction, seconds,
milliseconds, kB or bytes."""

AWAITING_REMEASURE = frozenset(
    {
        "bench-agent-2026-12-01.json",
        "bench-guard-2026-12-01.json",
        "bench-runtime-2026-12-01.json",
        "bench-runtime-cri-16-wrapper-2026-12-01.json",
        "bench-runtime-cri-22-nri-2026-12-01.json",
        "bench-runtime-cri-22-wrapper-2026-12-01.json",
        "bench-runtime-runs40-2026-12-01.json",
        "bench-scheduler-2026-12-01.json",
        "node-e2e-32-load2-2026-12-01.json",
        "node-e2e-32-load2-boost-2026-12-01.json",
        "node-e2e-32-load2-mntns-2026-12-01.json",
        "node-e2e-8-load2-2026-12-01.json",
        "node-e2e-8-load2-boost-2026-12-01.json",
        "node-e2e-8-load2-mntns-2026-12-01.json",
        "node-e2e-8-quiet-boost-2026-12-01.json",
        "node-e2e-containerd16-faults-2026-12-01.json",
        "node-e2e-containerd22-nri-faults-2026-12-01.json",
        "node-e2e-containerd22-nri-load2-mntns-2026-12-01.json",
        "node-e2e-containerd22-wrapper-2026-12-01.json",
        "exit-stacks-2026-12-01.json",
        "return-path-analysis-2026-12-01.json",
        "return-path-trace-2026-12-01.json",
        "return-path-trace-mntns-2026-12-01.json",
        "return-path-trace-unpinned-2026-12-01.json",
    }
)
"""Node-level result files measured on uncommitted code or without a revision (the traces):
the lead re-measures them on a clean tree; remove a name when its file is clean."""


def result_names() -> dict[str, Path]:
    """Every name a document may cite a result file by."""
    names: dict[str, Path] = {}
    undated: dict[str, list[Path]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        names[path.name] = names[path.stem] = path
        undated.setdefault(DATED.sub("", path.stem), []).append(path)
    for name, paths in undated.items():
        if len(paths) == 1:
            names.setdefault(name, paths[0])
    return names


NAMES = result_names()


@dataclass(frozen=True, slots=True)
class Unit:
    """A paragraph, list item, table row or code block of ``doc`` starting at ``line``, and the
    result files it inherits (a table's header, the paragraph before a table or code block)."""

    doc: str
    line: int
    text: str
    inherited: tuple[Path, ...] = ()


def cited(text: str) -> tuple[Path, ...]:
    found = []
    for token in re.findall(r"[\w./<>-]+", text):
        name = token.rstrip(".,;:").rsplit("/", 1)[-1]
        path = NAMES.get(name) or NAMES.get(name.removesuffix(".json"))
        if path is not None and path not in found:
            found.append(path)
    return tuple(found)


def units(path: Path) -> Iterator[Unit]:
    """The document's paragraphs, list items, table rows and code blocks, with what they inherit."""
    doc = path.relative_to(ROOT).as_posix()
    lines = path.read_text().splitlines()
    paragraph: list[str] = []
    start, before, table_head, i = 0, "", (), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
            if paragraph:
                before = " ".join(paragraph)
                yield Unit(doc, start + 1, before)
                paragraph = []
            yield Unit(doc, i + 1, "\n".join(lines[i + 1 : end]), cited(before))
            i = end + 1
            continue
        if line.startswith("|"):
            if paragraph:
                before = " ".join(paragraph)
                yield Unit(doc, start + 1, before)
                paragraph = []
            if not (i > 0 and lines[i - 1].startswith("|")):
                table_head = cited(line) + cited(before)
            if not re.fullmatch(r"[|\s:-]+", line):
                yield Unit(doc, i + 1, line, table_head)
        elif not line.strip() or line.startswith("#") or re.match(r"\s*([*-]|\d+\.) ", line):
            if paragraph:
                before = " ".join(paragraph)
                yield Unit(doc, start + 1, before)
            paragraph, start = ([line] if line.strip() and not line.startswith("#") else []), i
        else:
            if not paragraph:
                start = i
            paragraph.append(line)
        i += 1
    if paragraph:
        yield Unit(doc, start + 1, " ".join(paragraph))


def _numbers(value: Any) -> Iterator[float]:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield float(value)
    elif isinstance(value, str):
        for whole, frac in NUMBER.findall(value):
            yield float(whole.replace(",", "") + ("." + frac if frac else ""))
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)


_VALUES: dict[tuple[Path, float], list[float]] = {}


def values(path: Path, scale: float) -> list[float]:
    """The file's values x ``scale``, without sign, sorted."""
    key = (path, scale)
    if key not in _VALUES:
        _VALUES[key] = sorted({abs(v * scale) for v in _numbers(json.loads(path.read_text()))})
    return _VALUES[key]


def backed(number: str, files: tuple[Path, ...], scales: tuple[float, ...]) -> bool:
    """Some value rounds to ``number`` at its printed decimals (half a last digit either way)."""
    printed = float(number)
    half = 0.5 * 10.0 ** -len(number.partition(".")[2]) * (1 + 1e-9)
    for path in files:
        for scale in scales:
            vs = values(path, scale)
            k = bisect.bisect_left(vs, printed - half)
            if k < len(vs) and vs[k] <= printed + half:
                return True
    return False


def figures(text: str) -> Iterator[tuple[str, str]]:
    """(number as printed without separators, the unit after it or "")."""
    for pattern in NOT_FIGURES:
        text = pattern.sub(" ", text)
    for token in re.findall(r"[\w./<>-]*\.json", text):
        text = text.replace(token, " ")
    for match in NUMBER.finditer(text):
        whole, frac = match.groups()
        number = whole.replace(",", "") + ("." + frac if frac else "")
        if not frac and int(number) <= 10:
            continue
        unit = UNIT.match(text, match.end())
        yield number, unit.group(1) if unit else ""


def sources(unit: Unit) -> tuple[Path, ...]:
    return tuple(dict.fromkeys(cited(unit.text) + unit.inherited))


def unbacked(unit: Unit) -> list[str]:
    """The figures of ``unit`` no cited file backs; none checked when it cites only files that are
    to be re-measured (their figures are rewritten from the new files)."""
    files = sources(unit)
    if all(p.name in AWAITING_REMEASURE for p in files):
        return []
    return [
        f"{number}{suffix}"
        for number, suffix in figures(unit.text)
        if not backed(number, files, SCALES.get(suffix, (1.0,)))
    ]


def test_every_figure_that_cites_a_result_file_is_in_it() -> None:
    problems = []
    for doc in DOCS:
        for unit in units(doc):
            missing = unbacked(unit)
            if missing:
                names = ", ".join(p.name for p in sources(unit))
                problems.append(f"{unit.doc}:{unit.line}: {', '.join(missing)} not in {names}")
    assert not problems, "\n".join(problems)


def test_documents_cite_only_files_in_the_repository() -> None:
    problems = []
    for doc in DOCS:
        text = doc.read_text()
        for match in re.finditer(r"docs/results/([\w.-]+\.(?:json|yaml))", text):
            if not (RESULTS / match.group(1)).exists():
                problems.append(f"{doc.name}: {match.group(0)} does not exist")
        for outside in re.findall(r"(?<![\w.])(?:/|\.\./)[\w./-]*\.json\b", text):
            if not outside.startswith(("/run/", "/etc/", "/var/")):  # where a node keeps its state
                problems.append(f"{doc.name}: cites {outside}, outside the repository")
    assert not problems, "\n".join(problems)


def _dirty(path: Path) -> bool:
    doc = json.loads(path.read_text())
    git = doc.get("git") or (doc.get("environment") or {}).get("git")
    return not isinstance(git, dict) or git.get("dirty") is not False


def test_result_files_were_measured_on_committed_code() -> None:
    dirty = {p.name for p in RESULTS.glob("*.json") if _dirty(p)}
    assert dirty <= AWAITING_REMEASURE, sorted(dirty - AWAITING_REMEASURE)
    assert not (AWAITING_REMEASURE - dirty) & {p.name for p in RESULTS.glob("*.json")}, "clean now: drop from the list"


@pytest.mark.parametrize(
    ("text", "numbers"),
    [
        ("hold p99 3.5 ms (x8, 2 cores) on 2026-12-01, `--nodes 5000`", [("3.5", "ms")]),
        (
            "reclaims 5,203 GPU-h, -0.33% and +103 jobs; 1.9-3.8% less, 19.5 h",
            [("5203", ""), ("0.33", "%"), ("103", ""), ("1.9", "%"), ("3.8", "%"), ("19.5", "h")],
        ),
        ("containerd 1.6.20, revision 524e3a9, [file](docs/results/a-2026-12-01.json)", []),
    ],
)
def test_what_counts_as_a_figure(text: str, numbers: list[tuple[str, str]]) -> None:
    assert list(figures(text)) == numbers
