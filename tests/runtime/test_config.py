"""``runtime.deniedEnv``: the default names every device selector of the NVIDIA container toolkit,
the chart ships the same list, and the shell fast path's markers follow it."""

from __future__ import annotations

from pathlib import Path

import yaml

from spotgpu.runtime.config import DEFAULT_DENIED_ENV, RuntimeConfig

VALUES = Path(__file__).resolve().parents[2] / "deploy" / "chart" / "spotgpu" / "values.yaml"

TOOLKIT_SELECTORS = {
    # internal/config/image/envvars.go (the hook and the CDI modifier read them)
    "NVIDIA_VISIBLE_DEVICES": "the GPUs",
    "NVIDIA_MIG_CONFIG_DEVICES": "MIG config capability devices",
    "NVIDIA_MIG_MONITOR_DEVICES": "MIG monitor capability devices",
    "NVIDIA_IMEX_CHANNELS": "IMEX channel devices (created on the host)",
    # internal/modifier/cdi.go gatedDevices: "=enabled" adds these when any GPU is requested
    "NVIDIA_GDS": "nvidia-fs devices",
    "NVIDIA_MOFED": "InfiniBand devices",
    "NVIDIA_NVSWITCH": "NVSwitch devices",
    "NVIDIA_GDRCOPY": "gdrdrv device",
}
NOT_SELECTORS = {"NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_REQUIRE_CUDA", "NVIDIA_DISABLE_REQUIRE", "CUDA_VISIBLE_DEVICES"}


def test_the_default_denies_every_device_selector_of_the_nvidia_toolkit() -> None:
    assert set(RuntimeConfig().denied_env) == set(TOOLKIT_SELECTORS)
    assert not NOT_SELECTORS & set(DEFAULT_DENIED_ENV)
    assert len(set(DEFAULT_DENIED_ENV)) == len(DEFAULT_DENIED_ENV)


def test_the_chart_ships_the_default() -> None:
    values = yaml.safe_load(VALUES.read_text())
    assert tuple(values["agent"]["runtime"]["config"]["deniedEnv"]) == DEFAULT_DENIED_ENV


def test_the_fast_path_markers_follow_the_list() -> None:
    nvidia = RuntimeConfig(lower_runtime="/usr/bin/nvidia-container-runtime")
    # and a legacy CUDA image's marker: without NVIDIA_VISIBLE_DEVICES it would select every GPU
    assert nvidia.env_markers == (*(f'"{name}=' for name in DEFAULT_DENIED_ENV), '"CUDA_VERSION=')
    assert RuntimeConfig(lower_runtime="runc").env_markers == ()  # runc turns no env into devices
    extra = RuntimeConfig(lower_runtime="runc", env_selects_devices=True, denied_env=("DOCKER_RESOURCE_GPU",))
    assert extra.env_markers == ('"DOCKER_RESOURCE_GPU=',)
