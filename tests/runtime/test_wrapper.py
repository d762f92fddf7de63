"""The per-call wrapper against a real runtime service on a unix socket (engine on fakes).

Checks the plumbing: the atomic rewrite of ``config.json``, byte-identical specs and a runc-style
error line on refusal, the failure policy when the agent is unreachable (fail a sync, never an
owner), the exec of the lower runtime with the same arguments and environment, and that the
wrapper stays light (stdlib only, no ``json``/gRPC/``typing`` imports, Python 3.8 grammar).
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotgpu.core import keys
from spotgpu.runtime import protocol
from spotgpu.runtime.service import RuntimeService
from spotgpu.runtime.shim import WRAPPER_FILES, package_root
from spotgpu.runtime.wrapper import SYNC_MARKERS, WRITTEN_MARKERS, decide, log_line

from .fakes import OWNER, FakeGuard, cri, engine, make_spec, spot_spec

FROM_OWNER = {"_/dev-box/main": {"nvidia.com/gpu": ["GPU-a"]}}


@pytest.fixture
def agent(tmp_path: Path) -> Any:
    with RuntimeService(tmp_path / "agent.sock", engine(guard=FakeGuard())) as service:
        yield service


def bundle_with(tmp_path: Path, spec: dict[str, Any], mode: int = 0o640) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir(parents=True, exist_ok=True)
    config = bundle / "config.json"
    config.write_text(json.dumps(spec))
    config.chmod(mode)
    return bundle


def create_argv(bundle: Path, log: Path | None = None) -> list[str]:
    head = ["--root", "/run/x", "--log", str(log), "--log-format", "json"] if log else []
    return [*head, "create", "--bundle", str(bundle), "--pid-file", str(bundle / "init.pid"), "cid-1"]


def test_modified_spec_is_written_atomically_and_runc_follows(agent: RuntimeService, tmp_path: Path) -> None:
    bundle = bundle_with(tmp_path, spot_spec(FROM_OWNER))
    args, code = decide(create_argv(bundle), agent_socket=str(agent.socket_path))
    assert code is None and args.is_create
    written = json.loads((bundle / "config.json").read_text())
    assert "NVIDIA_VISIBLE_DEVICES=GPU-a" in written["process"]["env"]
    assert (bundle / "config.json").stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in bundle.iterdir()) == ["config.json"]  # no temporary file left


def test_refused_sync_leaves_the_spec_byte_identical_and_reports_like_runc(
    agent: RuntimeService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = bundle_with(tmp_path, spot_spec({"_/dev-box/main": {"nvidia.com/gpu": ["GPU-b"]}}))
    before = (bundle / "config.json").read_bytes()
    log = tmp_path / "log.json"
    _, code = decide(create_argv(bundle, log), agent_socket=str(agent.socket_path))
    assert code == 1
    assert (bundle / "config.json").read_bytes() == before
    (line,) = log.read_text().splitlines()
    entry = json.loads(line)
    assert entry["level"] == "error"
    assert entry["msg"].startswith("spotgpu-runtime: container cid-1: container team-a/spot-job/worker")
    assert "twin-not-allocated" in entry["msg"] and "spot-GPU-b" in entry["msg"]
    assert "twin-not-allocated" in capsys.readouterr().err


def test_unreachable_agent_fails_a_sync_but_never_an_owner(tmp_path: Path) -> None:
    absent = str(tmp_path / "no-agent.sock")
    listener = tmp_path / "guard.sock"
    sync = bundle_with(tmp_path, spot_spec(FROM_OWNER))
    before = (sync / "config.json").read_bytes()
    log = tmp_path / "log.json"
    _, code = decide(create_argv(sync, log), agent_socket=absent)
    assert code == 1 and (sync / "config.json").read_bytes() == before
    assert "spotgpu agent unreachable" in json.loads(log.read_text())["msg"]
    owner = make_spec({**cri(OWNER)})
    owner["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=GPU-a")
    owner_bundle = bundle_with(tmp_path / "o", owner)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(listener))
        _, code = decide(
            create_argv(owner_bundle, log),
            agent_socket=absent,
            listener=str(listener),
            owner_markers=("NVIDIA_VISIBLE_DEVICES",),
        )
    assert code is None
    assert json.loads(log.read_text().splitlines()[-1])["level"] == "warning"


def test_specs_without_markers_never_reach_the_agent(tmp_path: Path) -> None:
    """No agent socket exists; a plain create and every other verb go straight to runc."""
    bundle = bundle_with(tmp_path, make_spec(cri(OWNER)))
    absent = str(tmp_path / "absent.sock")
    assert decide(create_argv(bundle), agent_socket=absent)[1] is None
    assert decide(["kill", "cid", "9"], agent_socket=absent)[1] is None
    assert decide(["create", "--bundle", str(tmp_path / "missing"), "x"], agent_socket=absent)[1] is None


def test_owner_markers_count_only_while_the_listener_exists(agent: RuntimeService, tmp_path: Path) -> None:
    owner = make_spec(cri(OWNER))
    owner["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=GPU-a")
    bundle = bundle_with(tmp_path, owner)
    markers = ("NVIDIA_VISIBLE_DEVICES",)
    decide(
        create_argv(bundle), agent_socket=str(agent.socket_path), listener=str(tmp_path / "none"), owner_markers=markers
    )
    assert "seccomp" not in json.loads((bundle / "config.json").read_text())["linux"]
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "g.sock"))
        decide(
            create_argv(bundle),
            agent_socket=str(agent.socket_path),
            listener=str(tmp_path / "g.sock"),
            owner_markers=markers,
        )
    written = json.loads((bundle / "config.json").read_text())
    assert written["annotations"][keys.GUARDED] == OWNER.format()
    assert written["linux"]["seccomp"]["listenerPath"] == "/run/test/guard.sock"


def test_a_malformed_agent_answer_fails_the_sync(tmp_path: Path) -> None:
    path = tmp_path / "bad.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            while conn.recv(65536):
                pass
            conn.sendall(b"5:hello,")

    thread = threading.Thread(target=answer)
    thread.start()
    bundle = bundle_with(tmp_path, spot_spec(FROM_OWNER))
    log = tmp_path / "log.json"
    try:
        _, code = decide(create_argv(bundle, log), agent_socket=str(path))
    finally:
        thread.join(5)
        server.close()
    assert code == 1 and "malformed answer" in log.read_text()


def test_log_lines_match_runc_formats() -> None:
    entry = json.loads(log_line("error", 'bad "quote"\n\tand \\ \x01', "json", now=0))
    assert entry == {"level": "error", "msg": 'bad "quote"\n\tand \\ \x01', "time": "1970-01-01T00:00:00Z"}
    assert log_line("warning", "x y", None, now=0) == 'time="1970-01-01T00:00:00Z" level=warning msg="x y"\n'


def test_sync_markers_are_the_annotation_keys() -> None:
    assert (keys.DEVICES_FROM_PREFIX.encode(), keys.CONTAINER_ENV_PREFIX.encode()) == SYNC_MARKERS
    assert tuple(k.encode() for k in keys.RUNTIME_WRITTEN) == WRITTEN_MARKERS


@settings(max_examples=25)
@given(st.integers(min_value=0, max_value=64), st.sampled_from([*SYNC_MARKERS, *WRITTEN_MARKERS]))
def test_markers_past_the_read_window_are_found_wherever_they_fall(offset: int, marker: bytes) -> None:
    """A marker beyond the first MAX_SPEC_BYTES is found, also when it straddles two reads."""
    import tempfile

    from spotgpu.runtime import protocol
    from spotgpu.runtime.wrapper import _CHUNK, _read_spec

    with tempfile.NamedTemporaryFile() as f:
        f.write(b" " * (protocol.MAX_SPEC_BYTES + _CHUNK - offset) + marker + b" " * 8)
        f.flush()
        read = _read_spec(f.name, (*SYNC_MARKERS, *WRITTEN_MARKERS))
    assert read is not None
    head, found = read
    assert len(head) == protocol.MAX_SPEC_BYTES + 1 and found == {marker}


# --- the wrapper as the host runs it -----------------------------------------------------------


def test_wrapper_execs_the_lower_runtime_with_the_same_argv_and_env(agent: RuntimeService, tmp_path: Path) -> None:
    bundle = bundle_with(tmp_path, spot_spec(FROM_OWNER))
    out = tmp_path / "lower.out"
    lower = tmp_path / "lower"
    lower.write_text(f'#!/bin/sh\nfor a do echo "[$a]"; done > {out}\nenv >> {out}\n')
    lower.chmod(0o755)
    code = (
        f"import sys;sys.path.insert(0,{str(package_root())!r});from spotgpu.runtime.wrapper import main;"
        f"sys.exit(main(lower={str(lower)!r},agent_socket={str(agent.socket_path)!r}))"
    )
    argv = create_argv(bundle)
    env = {"PATH": "/usr/bin:/bin", "MARKER": "kept as is"}
    subprocess.run([sys.executable, "-I", "-S", "-c", code, *argv], env=env, check=True, timeout=30)
    lines = out.read_text().splitlines()
    assert lines[: len(argv)] == [f"[{a}]" for a in argv]
    assert "MARKER=kept as is" in lines
    assert "NVIDIA_VISIBLE_DEVICES=GPU-a" in (bundle / "config.json").read_text()


def test_the_wrapper_imports_nothing_heavy() -> None:
    """What the wrapper costs on every create it handles is its imports: stdlib essentials only."""
    code = (
        f"import sys;sys.path.insert(0,{str(package_root())!r});before=set(sys.modules);"
        "import spotgpu.runtime.wrapper;print(' '.join(sorted(set(sys.modules)-before)))"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    heavy = {"json", "re", "enum", "typing", "dataclasses", "socket", "selectors", "inspect", "ast", "collections"}
    heavy |= {"grpc", "google", "yaml", "spotgpu.core", "spotgpu.runtime.engine", "spotgpu.runtime.modifiers"}
    assert not loaded & heavy, loaded & heavy
    assert len(loaded) <= 15, sorted(loaded)  # os and its helpers (``-S`` skips site), time, ours


@pytest.mark.parametrize("relative", WRAPPER_FILES)
def test_wrapper_modules_parse_as_python_3_8(relative: str) -> None:
    source = (package_root() / relative).read_text()
    ast.parse(source, filename=relative, feature_version=(3, 8))
    assert _runtime_imports(ast.parse(source)) <= {"__future__", "posix", "os", "sys", "time", "_socket", "spotgpu"}


def _runtime_imports(tree: ast.AST) -> set[str]:
    """Top-level names of the modules imported when the code runs (``if TYPE_CHECKING:`` skipped)."""
    found: set[str] = set()
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            continue
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add((node.module or "").split(".")[0])
        else:
            found |= _runtime_imports(node)
    return found


def test_protocol_answers_round_trip() -> None:
    for status in protocol.STATUSES:
        assert protocol.parse_response(protocol.response(status, b"body,with:colons")) == (status, b"body,with:colons")
    assert protocol.parse_request(protocol.request("id", "/b", b"{}")) == ("id", "/b", b"{}")
    os.environ.get("PATH")  # keep os imported for readers: the wrapper's own dependency


@pytest.mark.parametrize("relative", [True, False])
def test_write_atomically_replaces_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relative: bool) -> None:
    from spotgpu.runtime.wrapper import write_atomically

    target = tmp_path / "config.json"
    target.write_bytes(b"old")
    target.chmod(0o604)
    monkeypatch.chdir(tmp_path)
    write_atomically("config.json" if relative else str(target), b"new")
    assert target.read_bytes() == b"new" and target.stat().st_mode & 0o777 == 0o604
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    with pytest.raises(FileNotFoundError):
        write_atomically(str(tmp_path / "absent" / "config.json"), b"x")
