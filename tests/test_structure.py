"""The package's structure as the import contracts state it, checked by running it.

* Every production module imports, and every production subcommand starts, with the test and
  measurement packages unimportable: the production image leaves them out (deploy/Dockerfile).
  The production modules are the sources of the import-linter contracts that forbid
  ``spotgpu.testing`` (pyproject.toml), so the contract and this test name the same modules.
* The scheduler's modules import nothing outside the standard library but ``spotgpu.core``:
  the import-linter contract lists third-party packages by name; this catches any other.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import grimp

from spotgpu.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
TEST_SUPPORT = ("spotgpu.testing", "spotgpu.e2e", "spotgpu.bench")


def _production_contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    test_only = {*TEST_SUPPORT, *(f"{m}.**" for m in TEST_SUPPORT), *(c.module for c in COMMANDS.values() if c.needs)}
    found = [
        c
        for c in contracts
        if c["type"] == "forbidden" and set(TEST_SUPPORT) <= set(c["forbidden_modules"]) <= test_only
    ]
    assert len(found) == 2, "one contract for the production packages, one for the entry-point modules"
    return found


def _production_modules() -> tuple[list[str], list[str]]:
    """(packages, single modules) that production code consists of, from the contracts."""
    packages: list[str] = []
    modules: list[str] = []
    for contract in _production_contracts():
        (packages if contract.get("as_packages", True) else modules).extend(contract["source_modules"])
    return packages, modules


# Runs in a fresh interpreter: a meta-path finder makes the test support unimportable, then every
# production module is imported and every production entry point started with --help.
_CHECK = r"""
import contextlib, importlib, importlib.abc, io, json, pkgutil, sys

BLOCKED = tuple(sys.argv[1].split(","))

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in BLOCKED or name.startswith(tuple(b + "." for b in BLOCKED)):
            raise ModuleNotFoundError(f"blocked: {name}", name=name)
        return None

sys.meta_path.insert(0, Blocked())
packages, modules, commands = json.loads(sys.argv[2])
imported, failed = [], {}
for package in packages:
    found = pkgutil.walk_packages(importlib.import_module(package).__path__, package + ".")
    modules.extend([package, *(m.name for m in found)])
for name in modules:
    if name.endswith(".__main__"):  # runs the CLI when imported: started through main() below
        continue
    try:
        importlib.import_module(name)
        imported.append(name)
    except BaseException as exc:
        failed[name] = repr(exc)

from spotgpu.cli import main
from spotgpu.runtime.main import main as runtime_main

exits = {}
for command in commands:
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            exits[command] = main([command, "--help"])
        except SystemExit as exc:
            exits[command] = exc.code
with contextlib.redirect_stdout(io.StringIO()):
    exits["spotgpu-runtime"] = runtime_main(["--help"])
err = io.StringIO()
with contextlib.redirect_stderr(err):
    refused = {"bench": main(["bench", "scheduler"]), "node-e2e": main(["node-e2e"])}
leaked = sorted(m for m in sys.modules if m in BLOCKED or m.startswith(tuple(b + "." for b in BLOCKED)))
print(json.dumps({"imported": imported, "failed": failed, "exits": exits, "refused": refused,
                  "refusal": err.getvalue(), "leaked": leaked}))
"""


def test_production_runs_without_test_support() -> None:
    packages, modules = _production_modules()
    production_commands = sorted(n for n, c in COMMANDS.items() if not c.needs)
    assert {COMMANDS[n].module for n in production_commands} <= set(modules), (
        "a production subcommand's module is missing from the contract"
    )
    assert {COMMANDS[n].module for n in COMMANDS if COMMANDS[n].needs}.isdisjoint(modules)
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK, ",".join(TEST_SUPPORT), json.dumps([packages, modules, production_commands])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["failed"] == {}
    assert {"spotgpu.agent.build", "spotgpu.kube.scheduler_loop", "spotgpu.guard.holder"} <= set(result["imported"])
    assert len(result["imported"]) > 150  # every module of the production packages, not just their __init__
    assert result["exits"] == {**dict.fromkeys(production_commands, 0), "spotgpu-runtime": 0}
    assert result["refused"] == {"bench": 2, "node-e2e": 2}
    assert "not part of this installation" in result["refusal"] and "spotgpu.testing" in result["refusal"]
    assert result["leaked"] == []


def test_scheduler_imports_only_the_core_and_the_standard_library() -> None:
    graph = grimp.build_graph("spotgpu", include_external_packages=True)
    scheduler = {"spotgpu.scheduler"} | graph.find_descendants("spotgpu.scheduler")
    imported = set().union(*(graph.find_modules_directly_imported_by(m) for m in scheduler)) - scheduler
    outside = sorted(
        m for m in imported if not m.startswith("spotgpu.core") and m.split(".")[0] not in sys.stdlib_module_names
    )
    assert outside == []


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
SIZE_EXEMPT = {"spotgpu/testing/kubeapi.py"}
"""The HTTP Kubernetes API double (a protocol double, one module by design); generated stubs
(``adapters/proto``) are skipped too."""


def _sources() -> list[Path]:
    src = ROOT / "src"
    return [
        p
        for p in sorted((src / "spotgpu").rglob("*.py"))
        if "proto" not in p.relative_to(src).parts and str(p.relative_to(src)) not in SIZE_EXEMPT
    ]


def test_modules_and_functions_stay_small() -> None:
    """Issue 17's bounds: no module over 600 lines, no function over 80 (docstrings included)."""
    big_modules, big_functions = [], []
    for path in _sources():
        text = path.read_text()
        if (n := len(text.splitlines())) > MAX_MODULE_LINES:
            big_modules.append(f"{path.relative_to(ROOT)}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.end_lineno is None:
                continue
            if (length := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                big_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert not big_modules, big_modules
    assert not big_functions, big_functions


REEXPORTS_PENDING = frozenset({"spotgpu/e2e/node.py", "spotgpu/guard/holder.py"})
"""Modules whose re-exports still have importers elsewhere (issue 24: being reworked)."""


def test_only_package_inits_re_export_names() -> None:
    """Each public name has one import path: no module but a package's ``__init__`` lists in
    ``__all__`` a name it imports from elsewhere."""
    found = []
    for path in sorted((ROOT / "src" / "spotgpu").rglob("*.py")):
        relative = str(path.relative_to(ROOT / "src"))
        if path.name == "__init__.py" or "_pb2" in path.name or relative in REEXPORTS_PENDING:
            continue
        tree = ast.parse(path.read_text())
        imported = {
            a.asname or a.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module != "__future__"
            for a in node.names
        }
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                assert isinstance(node, ast.Assign) and isinstance(node.value, ast.List | ast.Tuple)
                names = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
                found += [f"{relative}: {n}" for n in names if n in imported]
    assert not found, found
