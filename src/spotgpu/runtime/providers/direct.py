"""Direct: device IDs given outright (``"direct": {"<resource>": ["<id>", ...]}``).

Pure. No source to look up; the IDs are taken as given and the authorization step applies the
twin rule and requires that no container holds them (see :mod:`spotgpu.runtime.sync`).
"""

from __future__ import annotations

from spotgpu.core.codec import SyncKind, SyncSource
from spotgpu.runtime.sync import PodView, Provider, ResolvedDevice


class Direct(Provider):
    kind = SyncKind.DIRECT

    def resolve(self, source: SyncSource, pods: PodView) -> list[ResolvedDevice]:
        return [ResolvedDevice(resource, d, None) for resource, ids in source.resources for d in ids]


__all__ = ["Direct"]
