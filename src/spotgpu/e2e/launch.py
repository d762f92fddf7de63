"""How the node end-to-end run starts containers: the :class:`Launcher` protocol, and the
``ctr run`` launcher (``--ctr``: the earlier harness, a baseline for benchmarks).

Side effects: a private containerd (:class:`spotgpu.testing.containerd.Containerd`), OCI specs
written as the CRI plugin would write them, ``ctr run --config`` through spotgpu-runtime's fast
path, device plugin Allocate calls and pod-resources rows (the kubelet's part).

The CRI launcher (the default) is :mod:`spotgpu.e2e.launch_cri`.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2 as dp
from spotgpu.core import keys
from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE
from spotgpu.core.refs import ContainerRef
from spotgpu.e2e.model import CONTAINERD_NAMESPACE, CTL_PATH, OWNER, container_id, gpu_id
from spotgpu.testing.containerd import Containerd, make_rootfs
from spotgpu.testing.podresources import ContainerDevices, ContainerResources, PodResources

if TYPE_CHECKING:
    from spotgpu.e2e.node import Node


Mount = tuple[str, str, bool]
"""A volume: (container path, host path, read-only)."""


class Launcher(Protocol):
    """What the node needs from whoever starts its containers."""

    @property
    def containerd(self) -> Containerd: ...

    def prepare(self, client: Path) -> None:
        """Root filesystem or images (with the owner's GPU client at ``/bin/e2eclient``)."""
        ...

    def start(self) -> None:
        """containerd (after the shim is installed) and whatever talks to it."""
        ...

    def run_owner(self, uid: str, io_dir: Path) -> str:
        """The owner's container, started (Allocate of the vendor plugin, grant, create); its ID."""
        ...

    def start_spot(
        self, ref: ContainerRef, uid: str, twin: str, args: Sequence[str], mounts: Sequence[Mount] = ()
    ) -> str:
        """A spot container on ``twin`` (Allocate of our plugin, grant, create), started; its ID."""
        ...

    def run_plain(self, ref: ContainerRef, uid: str, args: Sequence[str], mounts: Sequence[Mount]) -> str:
        """An ordinary container that holds no device (a CPU pod), started; its ID."""
        ...

    def remove(self, cid: str) -> float | None:
        """The kubelet's clean-up of a dead container (and its pod sandbox); its exit time (wall
        clock, seconds) as the runtime recorded it, None when there was none."""
        ...

    def close(self) -> None: ...


def device_specs(answer: dp.ContainerAllocateResponse) -> list[tuple[str, str]]:
    return [(d.host_path, d.container_path) for d in answer.devices]


class CtrLauncher:
    """``ctr run --config`` of specs written as containerd's CRI plugin would write them."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.containerd = Containerd(node.paths.base / "ctd")
        self.rootfs: Path | None = None
        self._spec_template: dict[str, Any] | None = None

    def prepare(self, client: Path) -> None:
        self.rootfs = make_rootfs(self.node.paths.base / "rootfs", [(client, "/bin/e2eclient")])
        (self.rootfs / "e2e").mkdir(exist_ok=True)

    def start(self) -> None:
        self.containerd.start()

    def close(self) -> None:
        self.containerd.stop()

    def _template(self) -> dict[str, Any]:
        if self._spec_template is None:
            scratch = self.node.paths.specs / "template"
            scratch.mkdir(exist_ok=True)
            subprocess.run(["runc", "spec", "--bundle", str(scratch)], check=True, capture_output=True)
            self._spec_template = json.loads((scratch / "config.json").read_text())
        return copy.deepcopy(self._spec_template)

    def _spec(
        self,
        cid: str,
        ref: ContainerRef,
        pod_uid: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        devices: Sequence[tuple[str, str]] = (),
        mounts: Sequence[tuple[str, str, bool]] = (),
    ) -> Path:
        """The OCI spec containerd's CRI plugin would write for this container."""
        assert self.rootfs is not None and ref.namespace is not None
        spec = self._template()
        spec["process"].update(
            args=list(args), env=["PATH=/bin", *(f"{k}={v}" for k, v in sorted((env or {}).items()))], terminal=False
        )
        spec["root"] = {"path": str(self.rootfs), "readonly": True}
        spec["hostname"] = ref.pod
        spec["annotations"] = {
            keys.CRI_CONTAINER_TYPE: keys.CRI_TYPE_CONTAINER,
            keys.CRI_SANDBOX_ID: container_id(self.node.run_id, ref.pod_ref.format(), "sandbox"),
            keys.CRI_SANDBOX_NAME: ref.pod,
            keys.CRI_SANDBOX_NAMESPACE: ref.namespace,
            keys.CRI_SANDBOX_UID: pod_uid,
            keys.CRI_CONTAINER_NAME: ref.name,
            **(annotations or {}),
        }
        linux = spec["linux"]
        linux["cgroupsPath"] = f"/{self.node.cgroup_root}/pod{pod_uid}/{cid}"
        for host_path, container_path in devices:
            st = os.stat(host_path)
            major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
            linux.setdefault("devices", []).append(
                {"path": container_path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666, "uid": 0,
                 "gid": 0}
            )  # fmt: skip
            linux["resources"]["devices"].append(
                {"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"}
            )
        for container_path, host_path, read_only in mounts:
            spec["mounts"].append(
                {"destination": container_path, "type": "bind", "source": host_path,
                 "options": ["rbind", "rprivate", "ro" if read_only else "rw"]}
            )  # fmt: skip
        path = self.node.paths.specs / f"{cid}.json"
        path.write_text(json.dumps(spec))
        return path

    def _run(self, cid: str, ref: ContainerRef, pod_uid: str, spec: Path) -> None:
        """``ctr run --config`` through the spotgpu-runtime fast path, with the CRI labels."""
        assert self.node.shim is not None and ref.namespace is not None
        labels = {
            keys.LABEL_POD_NAME: ref.pod,
            keys.LABEL_POD_NAMESPACE: ref.namespace,
            keys.LABEL_POD_UID: pod_uid,
            keys.LABEL_CONTAINER_NAME: ref.name,
            keys.LABEL_CRI_KIND: keys.CRI_TYPE_CONTAINER,
        }
        argv = ["run", "-d", "--null-io", "--runtime", "io.containerd.runc.v2", "--runc-binary", str(self.node.shim),
                "--config", str(spec)]  # fmt: skip
        for key, value in labels.items():
            argv += ["--label", f"{key}={value}"]
        self.containerd.ctr(*argv, cid, namespace=CONTAINERD_NAMESPACE)

    def _grant(self, ref: ContainerRef, resource: str, ids: Sequence[str]) -> None:
        devices = ContainerDevices(resource, tuple(ids), (0,))
        self.node.pod_resources.upsert_pod(
            PodResources(ref.namespace or "", ref.pod, (ContainerResources(ref.name, (devices,)),))
        )

    def run_owner(self, uid: str, io_dir: Path) -> str:
        ref, gpus = OWNER, [gpu_id(i) for i in range(self.node.settings.gpus)]
        answer = self.node.kubelet.allocate(NVIDIA_GPU_RESOURCE, gpus).container_responses[0]
        self._grant(ref, NVIDIA_GPU_RESOURCE, gpus)
        cid = container_id(self.node.run_id, OWNER.format(), "0")
        spec = self._spec(
            cid,
            ref,
            uid,
            ["/bin/sh", "-c", "exec /bin/e2eclient </e2e/cmd >/e2e/out 2>&1"],
            env=dict(answer.envs),
            annotations=dict(answer.annotations),
            devices=[*device_specs(answer), (str(self.node.paths.dev / "ctl"), CTL_PATH)],
            mounts=[*((m.container_path, m.host_path, m.read_only) for m in answer.mounts),
                    ("/e2e", str(io_dir), False)],
        )  # fmt: skip
        self._run(cid, ref, uid, spec)
        return cid

    def start_spot(
        self, ref: ContainerRef, uid: str, twin: str, args: Sequence[str], mounts: Sequence[Mount] = ()
    ) -> str:
        answer = self.node.kubelet.allocate(SPOT_GPU_RESOURCE, [twin]).container_responses[0]
        self._grant(ref, SPOT_GPU_RESOURCE, [twin])
        cid = container_id(self.node.run_id, ref.format(), uid)
        spec = self._spec(
            cid, ref, uid, args, env=dict(answer.envs), annotations=dict(answer.annotations), mounts=list(mounts)
        )
        self._run(cid, ref, uid, spec)
        return cid

    def run_plain(self, ref: ContainerRef, uid: str, args: Sequence[str], mounts: Sequence[Mount]) -> str:
        cid = container_id(self.node.run_id, ref.format(), uid)
        self._run(cid, ref, uid, self._spec(cid, ref, uid, args, mounts=list(mounts)))
        return cid

    def remove(self, cid: str) -> float | None:
        return self.node.delete_task(cid)


__all__ = ["CtrLauncher", "Launcher", "Mount", "device_specs"]
