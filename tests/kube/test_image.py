"""The image's supply chain, read from deploy/Dockerfile and deploy/requirements.lock: the base
image by digest (and a build without one refused), every dependency at a locked version with
hashes, the plotting extra left out, the licence inside.

No Docker engine runs here, so the image itself is not built: the Dockerfile's digest guard is run
with sh as the build would run it, and the lock is checked against pyproject.toml.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()
LOCK = ROOT / "deploy" / "requirements.lock"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def locked() -> dict[str, tuple[Version, list[str]]]:
    """name -> (version, hashes) of every pin in the lock."""
    out: dict[str, tuple[Version, list[str]]] = {}
    name = ""
    for line in LOCK.read_text().splitlines():
        pin = re.match(r"^([A-Za-z0-9_.-]+)==([^ \\]+)", line)
        if pin:
            name = canonicalize_name(pin[1])
            out[name] = (Version(pin[2]), [])
        hashed = re.search(r"--hash=sha256:([0-9a-f]{64})", line)
        if hashed:
            out[name][1].append(hashed[1])
    return out


def test_the_base_image_is_pinned_by_digest() -> None:
    (default,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.M)
    assert DIGEST.search(default), default
    stages = re.findall(r"^FROM (\S+)", DOCKERFILE, re.M)
    assert stages and all(s == "${PYTHON_IMAGE}" for s in stages)


def _digest_guard() -> str:
    (guard,) = re.findall(r'^RUN (case "\$PYTHON_IMAGE" in .*?esac)$', DOCKERFILE, re.M | re.S)
    return guard.replace("\\\n", "\n")


@pytest.mark.parametrize(
    ("image", "ok"),
    [
        ("python:3.11.10-slim-bookworm@sha256:" + "a" * 64, True),
        ("registry.example.com/python@sha256:" + "0" * 64, True),
        ("python:3.11-slim-bookworm", False),
        ("python:3.11-slim-bookworm@sha256:abc", False),
        ("python@sha256:" + "a" * 65, False),
    ],
)
def test_a_build_without_a_base_digest_fails_loudly(image: str, ok: bool) -> None:
    guard = ["sh", "-c", _digest_guard()]
    run = subprocess.run(guard, env={"PYTHON_IMAGE": image}, capture_output=True, text=True, timeout=30, check=False)
    assert (run.returncode == 0) is ok, run.stderr
    if not ok:
        assert "pin the base image by digest" in run.stderr


def test_every_runtime_dependency_is_locked_with_hashes() -> None:
    pins = locked()
    for spec in PYPROJECT["project"]["dependencies"] + PYPROJECT["build-system"]["requires"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in deploy/requirements.lock (regenerate it: see its header)"
        version, _ = pins[name]
        assert req.specifier.contains(version, prereleases=True), f"{name}=={version} does not satisfy {spec}"
    for name, (_, hashes) in pins.items():
        assert hashes, f"{name} has no hash"
    assert "--require-hashes --no-deps -r requirements.lock" in DOCKERFILE
    # spotgpu itself from the source, no index: nothing unlocked is fetched
    assert "--no-deps --no-build-isolation --no-index ." in DOCKERFILE


def test_plotting_is_an_extra_the_image_leaves_out() -> None:
    runtime = {canonicalize_name(Requirement(s).name) for s in PYPROJECT["project"]["dependencies"]}
    assert "matplotlib" not in runtime
    assert [Requirement(s).name for s in PYPROJECT["project"]["optional-dependencies"]["plot"]] == ["matplotlib"]
    assert not {"matplotlib", "numpy", "pillow", "contourpy", "kiwisolver", "fonttools"} & set(locked())
    assert '! /opt/spotgpu/bin/python -c "import matplotlib"' in DOCKERFILE


def test_the_licence_is_in_the_image() -> None:
    assert (ROOT / "LICENSE").is_file()
    assert "COPY LICENSE /usr/share/doc/spotgpu/LICENSE" in DOCKERFILE
    assert re.search(r"^COPY pyproject.toml README.md LICENSE ", DOCKERFILE, re.M)  # and in the wheel's metadata
