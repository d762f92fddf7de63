"""The modifier interface, the per-call context they share, and the chain that runs them.

Pure; modifiers change the spec ``dict`` they are given and read the node only through the
context's :class:`~spotgpu.ports.lookup.NodeLookup` and
:class:`~spotgpu.ports.lookup.HostPort`. A chain runs its modifiers in order and stops at
the first error; the engine gives it a copy of the spec, so a failed chain leaves nothing behind.

Contract for every modifier: running it twice on its own output with the same lookups changes
nothing (the chain is idempotent), and it never touches spec fields outside its own concern.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from spotgpu.core.codec import DevicesFrom, SyncKind
from spotgpu.core.ids import DeviceID, ResourceName
from spotgpu.core.mapping_cache import Owner
from spotgpu.core.refs import ContainerRef
from spotgpu.ports.lookup import Allocation, HostPort, MountSpec, NodeLookup, PodAssignment
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.spec import ContainerIdentity, Spec
from spotgpu.runtime.sync import Provider, SyncPlan, SyncPolicy


class CachedLookup:
    """A :class:`NodeLookup` that asks each question once per ``create`` (the chain repeats them)."""

    def __init__(self, inner: NodeLookup) -> None:
        self._inner = inner
        self._pods: dict[tuple[str, str], PodAssignment | None] = {}
        self._numa: dict[ResourceName, Mapping[DeviceID, tuple[int, ...]]] = {}

    def pod(self, namespace: str, name: str) -> PodAssignment | None:
        key = (namespace, name)
        if key not in self._pods:
            self._pods[key] = self._inner.pod(namespace, name)
        return self._pods[key]

    def device_owner(self, device: DeviceID) -> Owner | None:
        return self._inner.device_owner(device)

    def device_lendable(self, device: DeviceID) -> bool | None:
        return self._inner.device_lendable(device)

    def allocate(self, resource: ResourceName, devices: Sequence[DeviceID]) -> Allocation:
        return self._inner.allocate(resource, devices)

    def device_numa(self, resource: ResourceName) -> Mapping[DeviceID, tuple[int, ...]]:
        if resource not in self._numa:
            self._numa[resource] = self._inner.device_numa(resource)
        return self._numa[resource]


@dataclass(frozen=True, slots=True)
class GuardFunctions:
    """The return guard's two entry points (:mod:`spotgpu.guard.rule`), injectable for tests."""

    apply: Callable[..., None]
    """``apply_guard_rule(spec, *, listener_path, owner)``: in place, idempotent, raises
    a ValidationError subclass when the spec's seccomp config conflicts."""
    ready: Callable[[str], bool]
    """``listener_ready(listener_path)``: something accepts connections there."""


def load_guard_functions() -> GuardFunctions | None:
    """The guard's functions, or None when the guard package is not installed."""
    try:
        from spotgpu.guard.rule import apply_guard_rule, listener_ready
    except ImportError:
        return None
    return GuardFunctions(apply_guard_rule, listener_ready)


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What the Devices modifier synced: the plan and each resource's Allocate answer."""

    plan: SyncPlan
    allocations: tuple[tuple[ResourceName, tuple[DeviceID, ...], Allocation], ...]

    @property
    def mounts(self) -> tuple[MountSpec, ...]:
        return tuple(m for _, _, a in self.allocations for m in a.mounts)

    @property
    def env_names(self) -> frozenset[str]:
        return frozenset(k for _, _, a in self.allocations for k, _ in a.envs)


@dataclass(slots=True)
class ModifyContext:
    """Everything one ``create`` knows; built by the engine, shared along the chain."""

    identity: ContainerIdentity
    config: RuntimeConfig
    lookup: NodeLookup
    host: HostPort
    providers: Mapping[SyncKind, Provider]
    devices_from: DevicesFrom | None
    """The parsed request that applies to this container (None: no sync asked)."""
    guard: GuardFunctions | None = None
    sync: SyncResult | None = None
    """Set by the Devices modifier when it synced devices."""
    notes: list[str] = field(default_factory=list)
    """Decisions worth logging (a skipped guard, an unknown NUMA topology)."""

    @property
    def policy(self) -> SyncPolicy:
        return SyncPolicy(
            self.config.spot_resource,
            frozenset(self.config.gpu_resources),
            frozenset(self.config.cross_namespace_sources),
        )

    @property
    def target(self) -> ContainerRef | None:
        return self.identity.ref


class SpecModifier(Protocol):
    """One concern of the spec (devices, mounts, env, CPU set, seccomp guard)."""

    name: str

    def modify(self, spec: Spec, ctx: ModifyContext) -> None:
        """Change ``spec`` in place; raise a :class:`~spotgpu.core.errors.SpotgpuError` to refuse."""
        ...


class Chain:
    """Modifiers run in order; the first error stops the chain (a chain is itself a modifier)."""

    name = "chain"

    def __init__(self, modifiers: Sequence[SpecModifier]) -> None:
        self.modifiers = tuple(modifiers)

    def modify(self, spec: Spec, ctx: ModifyContext) -> None:
        for modifier in self.modifiers:
            modifier.modify(spec, ctx)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.modifiers)


def mount_entry(mount: MountSpec) -> dict[str, Any]:
    """The OCI ``mounts`` entry containerd's CRI makes of a device plugin mount."""
    return {
        "destination": mount.container_path,
        "type": "bind",
        "source": mount.host_path,
        "options": ["rbind", "rprivate", "ro" if mount.read_only else "rw"],
    }


__all__ = [
    "CachedLookup",
    "Chain",
    "GuardFunctions",
    "ModifyContext",
    "SpecModifier",
    "SyncResult",
    "load_guard_functions",
    "mount_entry",
]
