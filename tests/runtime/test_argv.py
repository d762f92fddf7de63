"""runc command-line parsing, in Python (:mod:`spotgpu.runtime.argv`) and in the shell fast path.

The property tests build command lines from runc's grammar (global flags with and without
values, the command, create's flags in ``X v`` and ``X=v`` forms, the container ID, ``--``),
with tricky values (``create``, ``-b``, empty, spaces), so the expected command and bundle are
known by construction. The shell script rendered by :func:`render_shim` must take the same
decision as the Python parser on every generated command line; it runs for real (``/bin/sh``)
with stand-ins for the lower runtime and the Python interpreter that print their arguments.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotgpu.runtime.argv import RuncArgs, parse
from spotgpu.runtime.shim import render_shim

TRICKY = st.sampled_from(["create", "-b", "--bundle", "kill", "/tmp/a b", "x=y", "", "-", "--", "b1"])


@pytest.mark.parametrize(
    ("argv", "command", "bundle", "malformed"),
    [
        (
            [
                "--root",
                "/run/containerd/runc/k8s.io",
                "--log",
                "/b/log.json",
                "--log-format",
                "json",
                "create",
                "--bundle",
                "/b",
                "--pid-file",
                "/b/init.pid",
                "id1",
            ],
            "create",
            "/b",
            False,
        ),
        (["create", "-b=/x", "id", "--bundle", "/y"], "create", "/y", False),
        (["create", "--bundle=/x", "id"], "create", "/x", False),
        (["create", "id"], "create", ".", False),
        (["create", "-b", "", "id"], "create", ".", False),
        (["--root", "create", "state", "x"], "state", ".", False),
        (["state", "create"], "state", ".", False),
        (["create", "--console-socket", "--bundle", "id"], "create", ".", False),
        (["create", "id", "--", "--bundle", "/x"], "create", ".", False),
        (["--", "create", "-b", "/z", "id"], "create", "/z", False),
        (["create", "--bundle"], "create", ".", True),
        (["--log"], None, ".", True),
        (["--version"], None, ".", False),
        (["-"], "-", ".", False),
        (["--debug=true", "-systemd-cgroup", "create", "--b", "/q", "id"], "create", "/q", False),
        (["kill", "--all", "id", "9"], "kill", ".", False),
    ],
)
def test_parse_table(argv: list[str], command: str | None, bundle: str, malformed: bool) -> None:
    args = parse(argv)
    assert (args.command, args.bundle, args.malformed) == (command, bundle, malformed)
    assert args.is_create == (command == "create" and not malformed)


def test_log_flags_and_container_id() -> None:
    args = parse(
        [
            "--log=/b/log.json",
            "--log-format",
            "json",
            "create",
            "--no-pivot",
            "--bundle",
            "/b",
            "cid",
            "--pid-file",
            "/p",
        ]
    )
    assert (args.log_path, args.log_format, args.container_id) == ("/b/log.json", "json", "cid")
    assert args.config_path == "/b/config.json"
    assert parse(["create", "x"]) == RuncArgs("create", ".", None, None, container_id="x")


# --- generated command lines -------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    argv: list[str]
    command: str | None
    bundle: str
    malformed: bool


GLOBAL_BOOL = st.sampled_from(["--debug", "--systemd-cgroup", "-debug", "--debug=false", "--help=0", "---x"])
GLOBAL_VALUE = st.sampled_from(["--log", "-log", "--log-format", "--root", "-root", "--criu", "--rootless"])
CREATE_VALUE = st.sampled_from(["--console-socket", "--pid-file", "-pid-file", "--preserve-fds", "--pidfd-socket"])
CREATE_BOOL = st.sampled_from(["--no-pivot", "--no-new-keyring", "-no-pivot", "--detach"])
BUNDLE_FLAG = st.sampled_from(["--bundle", "-bundle", "-b", "--b"])


@st.composite
def lines(draw: st.DrawFn) -> Line:
    argv: list[str] = []
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            argv.append(draw(GLOBAL_BOOL))
        elif draw(st.booleans()):
            argv.append(f"{draw(GLOBAL_VALUE)}={draw(TRICKY)}")
        else:
            argv += [draw(GLOBAL_VALUE), draw(TRICKY)]
    shape = draw(st.sampled_from(["command", "dashdash", "none", "dangling"]))
    if shape == "none":
        return Line(argv, None, ".", False)
    if shape == "dangling":
        return Line([*argv, draw(GLOBAL_VALUE)], None, ".", True)
    command = draw(st.sampled_from(["create", "create", "create", "kill", "state", "delete", "start", "-"]))
    argv += ["--", command] if shape == "dashdash" else [command]
    bundle = "."
    seen_id = False
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["bundle", "bundle=", "value", "value=", "bool", "id"]))
        value = draw(TRICKY)
        if kind == "bundle":
            argv += [draw(BUNDLE_FLAG), value]
            bundle = value or "."
        elif kind == "bundle=":
            argv.append(f"{draw(BUNDLE_FLAG)}={value}")
            bundle = value or "."
        elif kind == "value":
            argv += [draw(CREATE_VALUE), value]
        elif kind == "value=":
            argv.append(f"{draw(CREATE_VALUE)}={value}")
        elif kind == "bool":
            argv.append(draw(CREATE_BOOL))
        elif not seen_id:
            argv.append(draw(st.sampled_from(["cid", "0123abcd", "b1"])))
            seen_id = True
    malformed = False
    ending = draw(st.sampled_from(["", "", "dashdash", "dangling"]))
    if ending == "dashdash":
        argv += ["--", draw(BUNDLE_FLAG), "/after-dashdash"]
    elif ending == "dangling":
        argv.append(draw(BUNDLE_FLAG) if draw(st.booleans()) else draw(CREATE_VALUE))
        malformed = command == "create"
    return Line(argv, command, bundle if command == "create" else ".", malformed)


@given(lines())
def test_generated_command_lines_parse_as_built(line: Line) -> None:
    args = parse(line.argv)
    assert args.command == line.command
    assert args.malformed == line.malformed
    if line.command == "create" and not line.malformed:
        assert args.bundle == line.bundle


@given(st.lists(st.text(max_size=12), max_size=12))
def test_any_argv_parses_without_error(argv: list[str]) -> None:
    args = parse(argv)
    assert args.is_create == (args.command == "create" and not args.malformed)
    assert args.bundle != ""


# --- the shell fast path takes the same decision ---------------------------------------------------


@pytest.fixture(scope="module")
def shim_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shim whose lower runtime and Python are stand-ins printing their arguments.

    Bundles under the working directory: ``b1`` asks for a sync; ``b2``, ``.`` (the working
    directory itself) and ``/tmp/a b`` do not exist or ask nothing.
    """
    root = tmp_path_factory.mktemp("shim")
    lower, python = root / "lower", root / "python"
    lower.write_text('#!/bin/sh\necho LOWER\nfor a do echo "[$a]"; done\n')
    python.write_text('#!/bin/sh\necho PY\nshift 4\nfor a do echo "[$a]"; done\n')
    for script in (lower, python):
        script.chmod(0o755)
    work = root / "work"
    (work / "b1").mkdir(parents=True)
    (work / "b2").mkdir()
    (work / "b1" / "config.json").write_text('{"annotations":{"platform.k8s.io/container-devices-from":"{}"}}')
    (work / "b2" / "config.json").write_text('{"annotations":{"other":"x"}}')
    (work / "config.json").write_text('{"process":{"env":["A=1"]}}')
    (root / "spotgpu-runtime").write_text(
        render_shim(
            lower=str(lower),
            python=str(python),
            lib=str(root / "lib"),
            agent_socket=str(root / "agent.sock"),
            timeout=5.0,
            listener=str(root / "absent.sock"),
            owner_markers=("NVIDIA_VISIBLE_DEVICES",),
        )
    )
    (root / "spotgpu-runtime").chmod(0o755)
    return root


def run_shim(
    shim_dir: Path, argv: list[str], env: dict[str, str] | None = None, script: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(script or shim_dir / "spotgpu-runtime"), *argv],
        cwd=shim_dir / "work",
        capture_output=True,
        text=True,
        env=env if env is not None else {"PATH": "/usr/bin:/bin"},
        check=check,
        timeout=10,
    )


def expected_target(argv: list[str], work: Path) -> str:
    args = parse(argv)
    if not args.is_create:
        return "LOWER"
    config = work / args.config_path
    return "PY" if config.is_file() and "container-devices-from" in config.read_text() else "LOWER"


@settings(max_examples=250, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines())
def test_shell_and_python_agree(shim_dir: Path, line: Line) -> None:
    out = run_shim(shim_dir, line.argv).stdout.splitlines()
    assert out[0] == expected_target(line.argv, shim_dir / "work")
    assert out[1:] == [f"[{a}]" for a in line.argv]  # the same arguments, in order


def test_shell_passes_the_environment_unchanged(shim_dir: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "LANG": "de_DE.UTF-8", "WEIRD": "a b\nc", "LC_ALL": "fr_FR"}
    lower = shim_dir / "env-lower"
    lower.write_text("#!/bin/sh\nexec env -0\n")
    lower.chmod(0o755)
    text = (shim_dir / "spotgpu-runtime").read_text().replace(str(shim_dir / "lower"), str(lower))
    (shim_dir / "env-shim").write_text(text)
    (shim_dir / "env-shim").chmod(0o755)
    for argv in (["kill", "cid", "9"], ["create", "--bundle", "b2", "cid"]):
        proc = subprocess.run(
            [str(shim_dir / "env-shim"), *argv], cwd=shim_dir / "work", env=env, capture_output=True, check=True
        )
        got = dict(item.split("=", 1) for item in proc.stdout.decode().split("\0") if item)
        assert got.get("PWD", str(shim_dir / "work")) == str(shim_dir / "work")
        got.pop("PWD", None)  # dash exports PWD like every POSIX shell
        assert got == env


def owner_bundle(shim_dir: Path, name: str) -> None:
    """A bundle whose spec has an owner marker (the vendor plugin's env) and no annotation."""
    owner = shim_dir / "work" / name
    owner.mkdir(exist_ok=True)
    (owner / "config.json").write_text('{"process":{"env":["NVIDIA_VISIBLE_DEVICES=GPU-1"]}}')


def test_shell_grep_only_for_owner_markers_while_the_listener_exists(shim_dir: Path) -> None:
    import socket

    owner_bundle(shim_dir, "owner")
    assert run_shim(shim_dir, ["create", "-b", "owner", "x"]).stdout.startswith("LOWER")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(shim_dir / "absent.sock"))
        try:
            assert run_shim(shim_dir, ["create", "-b", "owner", "x"]).stdout.startswith("PY")
        finally:
            os.unlink(shim_dir / "absent.sock")


def test_an_owner_never_depends_on_the_host_interpreter(shim_dir: Path) -> None:
    """Without an executable python, an owner candidate goes to runc unchanged; a sync cannot."""
    import socket

    text = (shim_dir / "spotgpu-runtime").read_text().replace(str(shim_dir / "python"), "/nonexistent/python3")
    script = shim_dir / "no-python-shim"
    script.write_text(text)
    script.chmod(0o755)
    owner_bundle(shim_dir, "owner2")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(shim_dir / "absent.sock"))
        try:
            assert run_shim(shim_dir, ["create", "-b", "owner2", "x"], script=script).stdout.startswith("LOWER")
            sync = run_shim(shim_dir, ["create", "-b", "b1", "x"], script=script, check=False)
            assert sync.returncode != 0 and "LOWER" not in sync.stdout
        finally:
            os.unlink(shim_dir / "absent.sock")


@given(st.sampled_from([".", "/", "b", "b/", "/run/x/bundle", "/run/x/bundle/", "a b/c", "../up"]))
def test_config_path_is_os_path_join(bundle: str) -> None:
    """The wrapper joins paths without importing ``os`` (1 ms); it must agree with os.path.join."""
    assert RuncArgs("create", bundle, None, None).config_path == os.path.join(bundle, "config.json")
