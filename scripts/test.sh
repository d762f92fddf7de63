#!/usr/bin/env bash
# The README's test command. On a fresh machine (root, Debian 12, Python >= 3.11) it installs
# everything the tests need and runs every quality gate; on a prepared one it skips what is
# already there. Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/core -x`).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the real-component tests use: runc, containerd (+ ctr), a static busybox
# for container root filesystems, gcc/libc6-dev for the guard's static test program.
missing=()
for pkg in runc containerd busybox-static gcc libc6-dev; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        echo "== installing Debian packages: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "== not root: cannot install ${missing[*]}; tests that need them will be skipped" >&2
    fi
fi

# containerd 2.2.7 for the CRI and NRI tests: $SPOTGPU_CONTAINERD22, by default ../shared/bin/
# containerd-2.2.7 next to the repository. As root (CI) it is required, so those tests can never
# be skipped there: they fail instead of skipping when it is missing.
if [ "$(id -u)" -eq 0 ]; then
    export SPOTGPU_CONTAINERD22="${SPOTGPU_CONTAINERD22:-$(cd .. && pwd)/shared/bin/containerd-2.2.7}"
    if [ ! -e "$SPOTGPU_CONTAINERD22/containerd" ]; then
        echo "== containerd 2.2.7 not found in $SPOTGPU_CONTAINERD22 (set SPOTGPU_CONTAINERD22): the CRI/NRI tests need it" >&2
        exit 1
    fi
    export SPOTGPU_REQUIRE_CONTAINERD22=1
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "== creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
echo "== installing spotgpu with its test extra"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

echo "== generated protobuf stubs are fresh"
.venv/bin/python scripts/gen_protos.py --check
echo "== ruff"
.venv/bin/ruff check src tests scripts
.venv/bin/ruff format --check src tests scripts
echo "== mypy (strict)"
.venv/bin/mypy
echo "== import contracts"
.venv/bin/lint-imports --no-cache  # the cache keys on mtimes and can miss a quick edit; the check takes well under a second
echo "== pytest"
.venv/bin/python -m pytest "$@"
