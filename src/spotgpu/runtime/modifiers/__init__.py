"""The spec modifiers of spotgpu-runtime, one module each, and the factory that composes them.

Pure; see :mod:`.base` for the interface. Registered names (the order of
:data:`~spotgpu.runtime.config.DEFAULT_MODIFIERS` is the default chain):

* ``devices`` (:mod:`.devices`): sync another container's devices (ContainerSync, PodSync, Direct).
* ``replace-mounts`` (:mod:`.replace_mounts`): synced mounts replace the image's at the same destination.
* ``generic`` (:mod:`.generic`): env from the ``container-env`` annotation.
* ``cpuset`` (:mod:`.cpuset`): pin to the synced GPUs' NUMA node.
* ``guard-rule`` (:mod:`.guard_rule`): the return guard's seccomp rule for GPU owners.

A new modifier is one module with a class that has ``name`` and ``modify(spec, ctx)``,
registered here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from spotgpu.core.registry import Registry
from spotgpu.runtime.modifiers.base import (
    CachedLookup,
    Chain,
    GuardFunctions,
    ModifyContext,
    SpecModifier,
    SyncResult,
    load_guard_functions,
)
from spotgpu.runtime.modifiers.cpuset import CPUSet
from spotgpu.runtime.modifiers.devices import Devices
from spotgpu.runtime.modifiers.generic import Generic
from spotgpu.runtime.modifiers.guard_rule import GuardRule
from spotgpu.runtime.modifiers.replace_mounts import ReplaceMounts

MODIFIERS: Registry[Callable[[], SpecModifier]] = Registry("spec modifier")
for _factory in (Devices, ReplaceMounts, Generic, CPUSet, GuardRule):
    MODIFIERS.register(_factory.name, _factory)


def build_chain(names: Sequence[str]) -> Chain:
    """The chain of the named modifiers, in the given order (unknown names: RegistryError)."""
    return Chain([MODIFIERS.get(name)() for name in names])


__all__ = [
    "MODIFIERS",
    "CPUSet",
    "CachedLookup",
    "Chain",
    "Devices",
    "Generic",
    "GuardFunctions",
    "GuardRule",
    "ModifyContext",
    "ReplaceMounts",
    "SpecModifier",
    "SyncResult",
    "build_chain",
    "load_guard_functions",
]
