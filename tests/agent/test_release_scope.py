"""Who may hold an owner's GPUs at its release (:func:`spotgpu.agent.model.release_scope`), and
every container of a victim pod being a victim (init, native sidecar and ephemeral containers,
from the pod's statuses as the API reports them)."""

from __future__ import annotations

import dataclasses

from spotgpu.agent.model import build_mapping, plan_eviction, victim_container_ids
from spotgpu.core import keys
from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import EvictionReason
from spotgpu.kube.objects import pod_info
from spotgpu.ports.node import RuntimeContainer
from spotgpu.testing.fakes import fake_devices

from .helpers import OWNER, cri_labels, gpu_alloc, pod, spot_alloc

OTHER = ContainerRef("team-b", "trainer", "main")
SPOT = PodRef("spot", "job-1")
SPOT_ON_OTHER = PodRef("spot", "job-2")
CPU = PodRef("spot", "cpu-pod")


def _plan(exempt: tuple[str, ...] = ()) -> object:
    devices = fake_devices(4)
    ids = [d.id for d in devices]
    pods = {
        p.ref: p
        for p in (
            pod(OWNER.pod_ref, (("main", "o" * 64),)),
            pod(OTHER.pod_ref),
            pod(SPOT),
            pod(SPOT_ON_OTHER),
            pod(CPU),
        )
    }
    allocations = [
        gpu_alloc(OWNER, ids[:2]), gpu_alloc(OTHER, ids[2:]),
        spot_alloc(SPOT, "worker", ids[:1]), spot_alloc(SPOT_ON_OTHER, "worker", ids[2:3]),
    ]  # fmt: skip
    snapshot = build_mapping(
        devices, allocations, pods, gpu_resource=NVIDIA_GPU_RESOURCE, spot_resource=SPOT_GPU_RESOURCE
    ).snapshot
    sandbox = RuntimeContainer("s" * 64, {**cri_labels(SPOT, ""), keys.LABEL_CRI_KIND: keys.CRI_TYPE_SANDBOX})
    return plan_eviction(
        snapshot, OWNER, ids[:2], pods, [sandbox], reason=EvictionReason.OWNER_BACK, at=0.0, exempt_namespaces=exempt
    )


def test_the_scope_names_the_owner_the_victims_and_the_pods_that_hold_other_gpus() -> None:
    plan = _plan()
    scope = plan.scope  # type: ignore[attr-defined]
    assert scope.owner_pods == {"uid-devbox"} and scope.owner_containers == {"o" * 64}
    assert scope.victim_pods == {"uid-job-1"}
    assert scope.gpu_pods == {"uid-trainer", "uid-job-2"}  # another owner, a spot pod of a GPU still lent
    assert "uid-cpu-pod" in scope.known_pods and "uid-cpu-pod" not in scope.gpu_pods
    assert scope.exempt_pods == frozenset()
    assert _plan(("spot",)).scope.exempt_pods == {"uid-job-1", "uid-job-2", "uid-cpu-pod"}  # type: ignore[attr-defined]


def test_init_sidecar_and_ephemeral_containers_are_victims() -> None:
    obj = {
        "metadata": {"name": "job-1", "namespace": "spot", "uid": "u1"},
        "spec": {"nodeName": "n", "containers": [{"name": "worker"}], "initContainers": [{"name": "side"}]},
        "status": {
            "containerStatuses": [{"name": "worker", "containerID": "containerd://" + "a" * 64}],
            "initContainerStatuses": [
                {"name": "setup", "containerID": "containerd://" + "b" * 64},
                {"name": "side", "containerID": "containerd://" + "c" * 64},
            ],
            "ephemeralContainerStatuses": [{"name": "debug", "containerID": "containerd://" + "d" * 64}],
        },
    }
    info = pod_info(obj)
    assert victim_container_ids(SPOT, info, []) == tuple(c * 64 for c in "abcd")
    labelled = RuntimeContainer("e" * 64, cri_labels(SPOT, "not-yet-reported"))
    assert "e" * 64 in victim_container_ids(SPOT, dataclasses.replace(info), [labelled])
