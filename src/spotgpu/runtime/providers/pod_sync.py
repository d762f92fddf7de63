"""PodSync: devices held by any container of one named pod (``ns/pod``).

Pure. Each device is attributed to the container of the pod that holds it, so the owner rule
can be checked per device; an empty list takes every device of that resource the pod holds.
"""

from __future__ import annotations

from spotgpu.core.codec import SyncKind, SyncSource
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.runtime.sync import PodView, Provider, RefusalReason, ResolvedDevice, SyncRefused, pick


class PodSync(Provider):
    kind = SyncKind.POD

    def resolve(self, source: SyncSource, pods: PodView) -> list[ResolvedDevice]:
        ref = source.ref
        assert isinstance(ref, PodRef) and ref.namespace is not None
        pod = pods(ref.namespace, ref.name)
        if pod is None:
            raise SyncRefused(
                RefusalReason.SOURCE_NOT_FOUND,
                f"source pod {ref} is not an active pod on this node (kubelet pod-resources)",
            )
        found: list[ResolvedDevice] = []
        for resource, wanted in source.resources:
            held = [
                (d, ContainerRef(ref.namespace, ref.name, c.name), c.numa_of(resource, d))
                for c in pod.containers
                for d in c.ids(resource)
            ]
            found += pick(source, resource, wanted, held)
        return found


__all__ = ["PodSync"]
