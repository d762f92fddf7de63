"""ContainerSync: devices held by one named container (``ns/pod/container``).

Pure. The source's devices come from the kubelet's view of its pod; the named IDs must be among
them (an empty list takes all it holds of that resource).
"""

from __future__ import annotations

from spotgpu.core.codec import SyncKind, SyncSource
from spotgpu.core.refs import ContainerRef
from spotgpu.runtime.sync import PodView, Provider, RefusalReason, ResolvedDevice, SyncRefused, pick


class ContainerSync(Provider):
    kind = SyncKind.CONTAINER

    def resolve(self, source: SyncSource, pods: PodView) -> list[ResolvedDevice]:
        ref = source.ref
        assert isinstance(ref, ContainerRef) and ref.namespace is not None
        pod = pods(ref.namespace, ref.pod)
        container = pod.container(ref.name) if pod is not None else None
        if container is None:
            where = "has no such container" if pod is not None else "is not an active pod on this node"
            raise SyncRefused(
                RefusalReason.SOURCE_NOT_FOUND,
                f"source {ref} not found: pod {ref.namespace}/{ref.pod} {where} (kubelet pod-resources)",
            )
        found: list[ResolvedDevice] = []
        for resource, wanted in source.resources:
            held = [(d, ref, container.numa_of(resource, d)) for d in container.ids(resource)]
            found += pick(source, resource, wanted, held)
        return found


__all__ = ["ContainerSync"]
