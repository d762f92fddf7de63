"""What every spec loses before any modifier runs: forged "written by us" annotations, and the
device-selecting env of containers that hold no GPU.

Pure; the only side effect is one pod-resources question through the context's lookup (cached
per ``create``, shared with the guard rule), asked only when the spec carries a denied env name.
Run by :meth:`spotgpu.runtime.engine.SpecEngine.modify` on every spec, sandboxes included, before
the configurable chain: these rules cannot be configured away.

1. **Written keys** (:data:`~spotgpu.core.keys.RUNTIME_WRITTEN`: ``synced-devices``,
   ``spotgpu.io/guarded``, ``spotgpu.io/guard-skipped``, the CDI names) are removed. The modifiers
   write them again where they apply, so each one says what *we* decided for this very spec; one
   set through a pod-annotation allow-list never survives (the shell fast path sends every
   ``create`` that carries one here).
2. **Denied env** (``runtime.deniedEnv``: ``NVIDIA_VISIBLE_DEVICES`` and the toolkit's other
   selectors, :data:`~spotgpu.runtime.config.DEFAULT_DENIED_ENV`, which nvidia-container-runtime
   turns into device nodes) is *neutralized* in ``process.env`` of every
   container that is not an allocated holder of a ``runtime.gpuResources`` device: every spot
   container (its devices come only from the checked sync, whose plugin env is set afterwards),
   every container holding no GPU, sandboxes and containers outside Kubernetes. Each entry keeps
   its place and gets the value that selects nothing (:data:`NEUTRAL`: ``NVIDIA_VISIBLE_DEVICES=void``,
   the MIG selectors and any name an operator adds: empty). Neutralized, not removed: with the
   variable unset, nvidia-container-toolkit gives a legacy CUDA image (``CUDA_VERSION`` set, no
   ``NVIDIA_REQUIRE_CUDA``) *every* GPU, and containerd 2.2.7 ignores an NRI adjustment's env
   removal (:mod:`spotgpu.nri.adjust`), while it applies a changed value; ``void`` (or empty)
   means "no GPU" to the toolkit in every image. Not refused: CUDA base images set
   ``NVIDIA_VISIBLE_DEVICES=all`` in their image env, and refusing would fail every such pod. A
   holder (the kubelet allocated it GPUs) keeps its env, which its device plugin wrote. A
   pod-resources failure is raised (the create is retried): we never let a device selector
   through on a guess. An entry that already selects nothing needs no lookup. A legacy CUDA
   image env (``CUDA_VERSION``, no ``NVIDIA_REQUIRE_CUDA``) that does not set
   ``NVIDIA_VISIBLE_DEVICES`` (which then means "all") gets ``NVIDIA_VISIBLE_DEVICES=void``
   added, by the same rule (:func:`selects_all_when_unset`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from spotgpu.core import keys
from spotgpu.core.errors import PermanentError, SpotgpuError, TemporaryError
from spotgpu.runtime.modifiers.base import ModifyContext
from spotgpu.runtime.spec import ContainerKind, Spec, set_annotation

NEUTRAL: Final[Mapping[str, str]] = MappingProxyType(
    {"NVIDIA_VISIBLE_DEVICES": "void", "NVIDIA_MIG_CONFIG_DEVICES": "", "NVIDIA_MIG_MONITOR_DEVICES": ""}
)
"""The value of each device selector that selects nothing (nvidia-container-toolkit: ``void`` or
empty is no GPU; an empty MIG selector is as if unset); a denied name not listed here gets the
empty value."""


VISIBLE: Final = "NVIDIA_VISIBLE_DEVICES"


def neutral_entry(name: str) -> str:
    """The ``NAME=value`` env entry that makes the denied ``name`` select nothing."""
    return f"{name}={NEUTRAL.get(name, '')}"


def strip_written(spec: Spec) -> list[str]:
    """Remove every runtime-written annotation; the keys removed."""
    raw = spec.get("annotations")
    found = [k for k in keys.RUNTIME_WRITTEN if isinstance(raw, dict) and k in raw]
    for key in found:
        set_annotation(spec, key, None)
    return found


def _env(spec: Spec) -> list[Any]:
    process = spec.get("process")
    env = process.get("env") if isinstance(process, dict) else None
    return env if isinstance(env, list) else []


def _denied_entries(spec: Spec, denied: frozenset[str]) -> list[str]:
    return [
        e
        for e in _env(spec)
        if isinstance(e, str) and (name := e.split("=", 1)[0]) in denied and e != neutral_entry(name)
    ]


def selects_all_when_unset(spec: Spec, denied: frozenset[str]) -> bool:
    """A legacy CUDA image env (``CUDA_VERSION`` set, ``NVIDIA_REQUIRE_CUDA`` empty or unset)
    without ``NVIDIA_VISIBLE_DEVICES``: nvidia-container-toolkit selects every GPU for it."""
    if VISIBLE not in denied:
        return False
    env = dict(e.split("=", 1) for e in _env(spec) if isinstance(e, str) and "=" in e)
    names = {str(e).split("=", 1)[0] for e in _env(spec)}
    return bool(env.get("CUDA_VERSION")) and not env.get("NVIDIA_REQUIRE_CUDA") and VISIBLE not in names


def holds_gpus(ctx: ModifyContext) -> bool:
    """The kubelet allocated this Kubernetes container devices of ``runtime.gpuResources`` and it
    syncs nothing (a GPU owner); raises the lookup's error when pod-resources cannot say."""
    ref = ctx.identity.ref
    if ctx.identity.kind is not ContainerKind.CONTAINER or ref is None or ctx.devices_from is not None:
        return False
    pod = ctx.lookup.pod(ref.namespace or "", ref.pod)
    held = pod.container(ref.name) if pod is not None else None
    return held is not None and any(held.ids(r) for r in ctx.config.gpu_resources)


def sanitize(spec: Spec, ctx: ModifyContext) -> None:
    """Apply both rules of the module docstring to ``spec`` in place; notes go to ``ctx.notes``."""
    removed = strip_written(spec)
    if removed:
        ctx.notes.append(f"removed annotation(s) only spotgpu-runtime may write: {', '.join(removed)}")
    denied = frozenset(ctx.config.denied_env)
    entries = _denied_entries(spec, denied)
    legacy = selects_all_when_unset(spec, denied)
    if not entries and not legacy:
        return
    try:
        keep = holds_gpus(ctx)
    except SpotgpuError as exc:
        text = (
            "cannot tell whether this container holds GPUs, and its env selects devices "
            f"({', '.join(sorted({e.split('=', 1)[0] for e in entries}) or ['CUDA_VERSION: all when unset'])}): {exc}"
        )
        raise (TemporaryError(text) if isinstance(exc, TemporaryError) else PermanentError(text)) from exc
    if keep:
        return
    env = spec["process"]["env"]
    env[:] = [neutral_entry(e.split("=", 1)[0]) if e in entries else e for e in env]
    names = sorted({e.split("=", 1)[0] for e in entries})
    if legacy:
        env.append(neutral_entry(VISIBLE))
        names.append(VISIBLE)
    ctx.notes.append(
        f"neutralized device-selecting env {', '.join(neutral_entry(n) for n in names)} (runtime.deniedEnv): "
        "not a GPU holder"
    )


__all__ = ["NEUTRAL", "VISIBLE", "holds_gpus", "neutral_entry", "sanitize", "selects_all_when_unset", "strip_written"]
