"""Device-sync providers: one module per kind of ``container-devices-from`` source.

Pure; each provider turns one source into concrete devices using the kubelet's device view it
is given (:data:`~spotgpu.runtime.sync.PodView`). The registry maps each
:class:`~spotgpu.core.codec.SyncKind` to its provider; :func:`default_providers` returns them
all (the Devices modifier merges their results, see :func:`spotgpu.runtime.sync.resolve`).
"""

from __future__ import annotations

from spotgpu.core.codec import SyncKind
from spotgpu.core.registry import Registry
from spotgpu.runtime.providers.container_sync import ContainerSync
from spotgpu.runtime.providers.direct import Direct
from spotgpu.runtime.providers.pod_sync import PodSync
from spotgpu.runtime.sync import Provider

PROVIDERS: Registry[type[Provider]] = Registry("device-sync provider")
PROVIDERS.register(SyncKind.CONTAINER, ContainerSync)
PROVIDERS.register(SyncKind.POD, PodSync)
PROVIDERS.register(SyncKind.DIRECT, Direct)


def default_providers() -> dict[SyncKind, Provider]:
    """One instance of every registered provider, keyed by the source kind it resolves."""
    return {SyncKind(name): PROVIDERS.get(name)() for name in PROVIDERS.names()}


__all__ = ["PROVIDERS", "ContainerSync", "Direct", "PodSync", "default_providers"]
