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
   turns into device nodes) is *stripped* from ``process.env`` of every
   container that is not an allocated holder of a ``runtime.gpuResources`` device: every spot
   container (its devices come only from the checked sync, whose plugin env is set afterwards),
   every container holding no GPU, sandboxes and containers outside Kubernetes. Stripped, not
   refused: CUDA base images set ``NVIDIA_VISIBLE_DEVICES=all`` in their image env, and refusing
   would fail every such pod. A holder (the kubelet allocated it GPUs) keeps its env, which its
   device plugin wrote. A pod-resources failure is raised (the create is retried): we never let
   a device selector through on a guess.
"""

from __future__ import annotations

from spotgpu.core import keys
from spotgpu.core.errors import PermanentError, SpotgpuError, TemporaryError
from spotgpu.runtime.modifiers.base import ModifyContext
from spotgpu.runtime.spec import ContainerKind, Spec, set_annotation


def strip_written(spec: Spec) -> list[str]:
    """Remove every runtime-written annotation; the keys removed."""
    raw = spec.get("annotations")
    found = [k for k in keys.RUNTIME_WRITTEN if isinstance(raw, dict) and k in raw]
    for key in found:
        set_annotation(spec, key, None)
    return found


def _denied_entries(spec: Spec, denied: frozenset[str]) -> list[str]:
    process = spec.get("process")
    env = process.get("env") if isinstance(process, dict) else None
    if not isinstance(env, list):
        return []
    return [e for e in env if isinstance(e, str) and e.split("=", 1)[0] in denied]


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
    if not entries:
        return
    try:
        keep = holds_gpus(ctx)
    except SpotgpuError as exc:
        text = (
            "cannot tell whether this container holds GPUs, and its env sets a device selector "
            f"({', '.join(sorted({e.split('=', 1)[0] for e in entries}))}): {exc}"
        )
        raise (TemporaryError(text) if isinstance(exc, TemporaryError) else PermanentError(text)) from exc
    if keep:
        return
    env = spec["process"]["env"]
    env[:] = [e for e in env if e not in entries]
    names = sorted({e.split("=", 1)[0] for e in entries})
    ctx.notes.append(f"stripped device-selecting env {', '.join(names)} (runtime.deniedEnv): not a GPU holder")


__all__ = ["holds_gpus", "sanitize", "strip_written"]
