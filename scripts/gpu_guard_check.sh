#!/usr/bin/env bash
# The return guard on a real NVIDIA GPU (issue 6): run as root on a GPU node with the driver,
# nvidia-smi and libcuda installed (PyTorch optional). Prints one JSON object:
#   nvidia_smi / cuda_init / torch_init: notifications the guard's rule catches per start
#     (target <= 4) and the NVIDIA ioctls the same start issues in total;
#   steady_state: a CUDA driver API loop timed with and without the rule (paired, same run),
#     and the notifications it caught (must stay at those of its own cuInit).
# Usage: sudo bash scripts/gpu_guard_check.sh [--iterations N] [--trials K] > guard-gpu.json
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
    echo "run as root (the check installs seccomp filters and answers them)" >&2
    exit 2
fi
if ! ls /dev/nvidiactl >/dev/null 2>&1; then
    echo "no /dev/nvidiactl: this is not an NVIDIA GPU node" >&2
    exit 2
fi
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
exec "$PY" -m spotgpu.guard.gpucheck all "$@"
