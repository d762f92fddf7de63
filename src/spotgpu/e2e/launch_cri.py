"""The node end-to-end run's default launcher: pods through the real CRI, as a kubelet runs them.

Side effects: a private containerd with its CRI plugin (Debian's 1.6 or 2.2.7), configured from
the shipped snippets of ``deploy/containerd/`` (:mod:`spotgpu.testing.cri_containerd`), the pause
and busybox images (the owner's GPU client inside) imported into it, and pods created and
removed through the kubelet CRI double (:class:`spotgpu.testing.cri.KubeletCri`): RunPodSandbox
with the RuntimeClass handler, the device manager's Allocate (the vendor plugin for the owner,
the agent's plugin for a spot pod's twin) mapped into the ContainerConfig, CreateContainer,
StartContainer; at clean-up StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox.

Modes: ``wrapper``: pods name the ``spotgpu`` handler (deploy/containerd/spotgpu-runtime*.toml,
BinaryName = the installed fast path); ``nri`` (containerd 2.x): pods use the default runc
handler, containerd is left as deploy/containerd/nri-v3.toml says (NRI on), and the agent's NRI
plugin adjusts every container.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE
from spotgpu.core.refs import ContainerRef
from spotgpu.e2e.launch import Mount
from spotgpu.e2e.model import IMAGE, OWNER, SPOT_CONTAINER, gpu_id
from spotgpu.testing.cri import ContainerSpec, CriError, KubeletCri, PodSpec, RunningPod
from spotgpu.testing.cri_containerd import CriContainerd, CriSettings, binaries
from spotgpu.testing.cri_rig import HANDLER, snippets
from spotgpu.testing.images import busybox_image, pause_image

log = logging.getLogger(__name__)

DELETE_ATTEMPTS: Final = 5
"""Tries of a pod's deletion before the harness gives up on it (its processes then leak)."""

if TYPE_CHECKING:
    from spotgpu.e2e.node import Node


class CriLauncher:
    """Pods through the kubelet CRI double and containerd's CRI plugin (module docstring)."""

    def __init__(self, node: Node) -> None:
        settings = node.settings
        if settings.mode == "nri" and settings.containerd == "1.6":
            raise ValueError("containerd 1.6 has no NRI: use --mode wrapper, or --containerd 2.2")
        self.node = node
        self.mode = settings.mode
        self.containerd = CriContainerd(
            node.paths.base / "ctd",
            binaries(settings.containerd),  # type: ignore[arg-type]
            CriSettings(snippets=snippets(settings.containerd, settings.mode), nri=settings.mode == "nri"),
        )
        self.cri: KubeletCri | None = None
        self._pods: dict[str, RunningPod] = {}

    @property
    def handler(self) -> str:
        return HANDLER if self.mode == "wrapper" else ""

    @property
    def nri_socket(self) -> Path | None:
        return self.containerd.nri_socket if self.mode == "nri" else None

    def prepare(self, client: Path) -> None:
        folder = self.node.paths.base / "images"
        self.containerd.images = (pause_image(folder), busybox_image(folder, [(client, "/bin/e2eclient")], name=IMAGE))

    def start(self) -> None:
        if self.node.shim is not None and self.mode == "wrapper":
            self.containerd.settings = dataclasses.replace(
                self.containerd.settings, spotgpu_runtime=str(self.node.shim)
            )
        self.containerd.start()
        self.cri = KubeletCri(
            self.containerd.address,
            kubelet=self.node.kubelet,
            pod_resources=self.node.pod_resources,
            cgroup_root=self.node.cgroup_root,
            log_root=self.node.paths.logs / "pods",
        )

    def _run(self, ref: ContainerRef, uid: str, container: ContainerSpec) -> str:
        assert self.cri is not None and ref.namespace is not None
        pod = self.cri.run_pod(PodSpec(ref.namespace, ref.pod, uid=uid, runtime_handler=self.handler))
        try:
            cid = self.cri.run_container(pod, container)
        except CriError:
            with contextlib.suppress(CriError):
                self.cri.delete_pod(pod)
            raise
        self._pods[cid] = pod
        return cid

    def run_owner(self, uid: str, io_dir: Path) -> str:
        gpus = [gpu_id(i) for i in range(self.node.settings.gpus)]
        container = ContainerSpec(
            OWNER.name,
            args=["/bin/sh", "-c", "exec /bin/e2eclient </e2e/cmd >/e2e/out 2>&1"],
            image=IMAGE,
            mounts=[("/e2e", str(io_dir), False)],
            devices={NVIDIA_GPU_RESOURCE: gpus},
        )
        return self._run(OWNER, uid, container)

    def start_spot(
        self, ref: ContainerRef, uid: str, twin: str, args: Sequence[str], mounts: Sequence[Mount] = ()
    ) -> str:
        container = ContainerSpec(
            SPOT_CONTAINER, args=list(args), image=IMAGE, mounts=list(mounts), devices={SPOT_GPU_RESOURCE: [twin]}
        )
        return self._run(ref, uid, container)

    def run_plain(self, ref: ContainerRef, uid: str, args: Sequence[str], mounts: Sequence[Mount]) -> str:
        return self._run(ref, uid, ContainerSpec(ref.name, args=list(args), image=IMAGE, mounts=list(mounts)))

    def remove(self, cid: str) -> float | None:
        assert self.cri is not None
        pod = self._pods.pop(cid, None)
        finished: float | None = None
        with contextlib.suppress(CriError):
            at = self.cri.status(cid).status.finished_at
            finished = at / 1e9 if at > 0 else None
        if pod is not None:
            self._delete(pod)
        return finished

    def _delete(self, pod: RunningPod) -> None:
        """Delete the pod as the kubelet does: it keeps trying (a sandbox whose stop failed once,
        say while its container's exit was still being handled, is stopped on the next try)."""
        assert self.cri is not None
        for attempt in range(DELETE_ATTEMPTS):
            try:
                self.cri.delete_pod(pod)
                return
            except CriError as exc:
                log.warning("deleting pod %s/%s failed (try %d): %s", pod.spec.namespace, pod.spec.name, attempt, exc)
                time.sleep(0.2 * (attempt + 1))
        self.cri.release(pod)

    def close(self) -> None:
        if self.cri is not None:
            self.cri.delete_all()
            self.cri.close()
            self.cri = None
        self.containerd.stop()


__all__ = ["CriLauncher"]
