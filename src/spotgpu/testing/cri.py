"""A kubelet double that runs pods through a real CRI runtime (containerd's CRI plugin).

No kubelet can run on a test machine. :class:`KubeletCri` does what the kubelet does on a node
for the pods spotgpu cares about, over the real CRI gRPC API (our ``cri_runtime_v1.proto``, the
method paths and field numbers of k8s.io/cri-api) on the runtime's unix socket:

* **pod start**: ``RunPodSandbox`` with the RuntimeClass handler (``runtime_handler``), the pod's
  labels and annotations, the kubelet's labels (``io.kubernetes.pod.*``), host network (no CNI),
  a cgroupfs-style ``cgroup_parent`` (``/<root>/pod<uid>``), an empty hostname;
* **device manager**: for every extended resource the container requests, ``Allocate`` on the
  resource's device plugin through :class:`~spotgpu.testing.kubelet.KubeletDouble` (admission:
  healthy, unallocated devices, or the exact IDs given), and the answers mapped into the
  ``ContainerConfig`` exactly as the kubelet maps them (:func:`device_options`, then
  :func:`container_config`): envs -> ``envs`` (before the container's own), mounts -> ``mounts``,
  device specs -> ``devices``, annotations -> ``annotations``, CDI devices -> ``CDI_devices``;
  the grant is recorded in pod-resources when a double for it is given;
* ``CreateContainer`` (with the sandbox config), ``StartContainer``, ``ContainerStatus``,
  ``ExecSync``, ``StopContainer``, ``RemoveContainer``; **pod deletion**: every container stopped
  and removed, ``StopPodSandbox``, ``RemovePodSandbox``, devices released, pod-resources row gone.

What it does not do: restart policies, probes, volumes, image pulls (images are imported
beforehand, :mod:`spotgpu.testing.images`), CNI. Side effects: gRPC calls that create and
remove real pods and containers; a log folder per pod.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import grpc

from spotgpu.adapters.proto import cri_runtime_v1_pb2 as cri
from spotgpu.adapters.proto import cri_runtime_v1_pb2_grpc as cri_grpc
from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2 as dp
from spotgpu.core import keys
from spotgpu.testing.images import BUSYBOX_IMAGE
from spotgpu.testing.kubelet import KubeletDouble
from spotgpu.testing.podresources import ContainerDevices, ContainerResources, PodResources, PodResourcesDouble

Seccomp = Literal["Unconfined", "RuntimeDefault"]
CALL_TIMEOUT: Final = 60.0


@dataclass(frozen=True, slots=True)
class PodSpec:
    """The parts of a Pod the kubelet turns into a sandbox."""

    namespace: str
    name: str
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    runtime_handler: str = ""
    """The RuntimeClass's handler ("" = the runtime's default)."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """The parts of a Pod's container the kubelet turns into a ContainerConfig."""

    name: str
    args: Sequence[str] = ("sleep", "1000000")
    image: str = BUSYBOX_IMAGE
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[tuple[str, str, bool]] = ()
    """Volumes: (container path, host path, read-only)."""
    resources: Mapping[str, int] = field(default_factory=dict)
    """Extended resources and their counts (``nvidia.com/gpu: 2``)."""
    devices: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Exact device IDs per resource (instead of the device manager's choice)."""
    seccomp: Seccomp = "Unconfined"
    """The kubelet's default (seccompDefault off) is Unconfined."""


@dataclass(frozen=True, slots=True)
class DeviceOptions:
    """The device manager's ``DeviceRunContainerOptions``: every Allocate answer merged."""

    envs: tuple[tuple[str, str], ...] = ()
    mounts: tuple[tuple[str, str, bool], ...] = ()
    devices: tuple[tuple[str, str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    cdi_devices: tuple[str, ...] = ()
    granted: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(resource, device IDs) as allocated."""


@dataclass(slots=True)
class RunningPod:
    spec: PodSpec
    sandbox_id: str
    config: cri.PodSandboxConfig
    containers: dict[str, str] = field(default_factory=dict)
    """Container name -> ID."""
    grants: dict[str, DeviceOptions] = field(default_factory=dict)


def device_options(
    responses: Sequence[dp.ContainerAllocateResponse], granted: Sequence[tuple[str, Sequence[str]]] = ()
) -> DeviceOptions:
    """Merge Allocate answers as the kubelet's device manager does: envs (a later answer wins),
    mounts and devices unique by container path (a second one at the same path is dropped),
    annotations (a later answer wins), CDI device names unique, in answer order."""
    envs: dict[str, str] = {}
    mounts: dict[str, tuple[str, str, bool]] = {}
    devices: dict[str, tuple[str, str, str]] = {}
    annotations: dict[str, str] = {}
    cdi: dict[str, None] = {}
    for answer in responses:
        envs.update(answer.envs)
        for m in answer.mounts:
            mounts.setdefault(m.container_path, (m.container_path, m.host_path, m.read_only))
        for d in answer.devices:
            devices.setdefault(d.container_path, (d.container_path, d.host_path, d.permissions))
        annotations.update(answer.annotations)
        cdi.update((c.name, None) for c in answer.cdi_devices)
    return DeviceOptions(
        tuple(envs.items()),
        tuple(mounts.values()),
        tuple(devices.values()),
        tuple(sorted(annotations.items())),
        tuple(cdi),
        tuple((r, tuple(ids)) for r, ids in granted),
    )


def _security(seccomp: Seccomp) -> cri.SecurityProfile:
    kind = cri.SecurityProfile.Unconfined if seccomp == "Unconfined" else cri.SecurityProfile.RuntimeDefault
    return cri.SecurityProfile(profile_type=kind)


def sandbox_config(pod: PodSpec, cgroup_root: str, log_root: Path) -> cri.PodSandboxConfig:
    """The kubelet's PodSandboxConfig for a host-network pod (no hostname: runc cannot set one
    without a UTS namespace)."""
    labels = {
        **pod.labels,
        keys.LABEL_POD_NAME: pod.name,
        keys.LABEL_POD_NAMESPACE: pod.namespace,
        keys.LABEL_POD_UID: pod.uid,
    }
    return cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace, attempt=0),
        log_directory=str(log_root / f"{pod.namespace}_{pod.name}_{pod.uid}"),
        labels=labels,
        annotations=dict(pod.annotations),
        linux=cri.LinuxPodSandboxConfig(
            cgroup_parent=f"/{cgroup_root}/pod{pod.uid}",
            security_context=cri.LinuxSandboxSecurityContext(
                namespace_options=cri.NamespaceOption(network=cri.NODE, pid=cri.POD, ipc=cri.POD),
                seccomp=_security("Unconfined"),
            ),
        ),
    )


def container_config(pod: PodSpec, container: ContainerSpec, options: DeviceOptions) -> cri.ContainerConfig:
    """The kubelet's ContainerConfig: the device options mapped as the kubelet maps them."""
    annotations = {
        "io.kubernetes.container.hash": format(abs(hash((container.name, tuple(container.args)))) % 2**32, "x"),
        "io.kubernetes.container.restartCount": "0",
        **dict(options.annotations),
    }
    return cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name=container.name, attempt=0),
        image=cri.ImageSpec(image=container.image),
        args=list(container.args),
        envs=[cri.KeyValue(key=k, value=v) for k, v in [*options.envs, *container.env.items()]],
        mounts=[
            cri.Mount(container_path=c, host_path=h, readonly=ro) for c, h, ro in [*container.mounts, *options.mounts]
        ],
        devices=[cri.Device(container_path=c, host_path=h, permissions=p) for c, h, p in options.devices],
        labels={
            keys.LABEL_CONTAINER_NAME: container.name,
            keys.LABEL_POD_NAME: pod.name,
            keys.LABEL_POD_NAMESPACE: pod.namespace,
            keys.LABEL_POD_UID: pod.uid,
        },
        annotations=annotations,
        log_path=f"{container.name}/0.log",
        linux=cri.LinuxContainerConfig(
            security_context=cri.LinuxContainerSecurityContext(
                namespace_options=cri.NamespaceOption(network=cri.NODE, pid=cri.CONTAINER, ipc=cri.POD),
                seccomp=_security(container.seccomp),
            )
        ),
        CDI_devices=[cri.CDIDevice(name=n) for n in options.cdi_devices],
    )


class CriError(RuntimeError):
    """A CRI call failed; ``code`` and ``details`` are the gRPC status."""

    def __init__(self, method: str, exc: grpc.RpcError) -> None:
        self.code = exc.code()
        self.details = exc.details() or ""
        super().__init__(f"{method}: {self.code.name}: {self.details}")


class KubeletCri:
    """The kubelet's CRI side (module docstring). ``kubelet``: the device manager double whose
    registered plugins answer Allocate; ``pod_resources``: where grants are recorded."""

    def __init__(
        self,
        address: str,
        *,
        kubelet: KubeletDouble | None = None,
        pod_resources: PodResourcesDouble | None = None,
        cgroup_root: str = "spotgpu-cri",
        log_root: Path,
    ) -> None:
        self.address = address
        self.kubelet = kubelet
        self.pod_resources = pod_resources
        self.cgroup_root = cgroup_root
        self.log_root = log_root
        self._channel = grpc.insecure_channel(f"unix://{address}")
        self.stub = cri_grpc.RuntimeServiceStub(self._channel)
        self.pods: dict[tuple[str, str], RunningPod] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: Any, timeout: float = CALL_TIMEOUT) -> Any:
        try:
            return getattr(self.stub, method)(request, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise CriError(method, exc) from None

    def version(self) -> cri.VersionResponse:
        answer: cri.VersionResponse = self._call("Version", cri.VersionRequest(version="v1"))
        return answer

    # -- pods ------------------------------------------------------------------------------
    def run_pod(self, pod: PodSpec) -> RunningPod:
        config = sandbox_config(pod, self.cgroup_root, self.log_root)
        Path(config.log_directory).mkdir(parents=True, exist_ok=True)
        answer = self._call(
            "RunPodSandbox", cri.RunPodSandboxRequest(config=config, runtime_handler=pod.runtime_handler)
        )
        running = RunningPod(pod, answer.pod_sandbox_id, config)
        with self._lock:
            self.pods[(pod.namespace, pod.name)] = running
        return running

    def admit(self, pod: RunningPod, container: ContainerSpec) -> DeviceOptions:
        """The device manager's part: Allocate for every requested resource, merged."""
        responses: list[dp.ContainerAllocateResponse] = []
        granted: list[tuple[str, tuple[str, ...]]] = []
        wanted = {**container.resources, **{r: len(i) for r, i in container.devices.items()}}
        try:
            for resource, count in sorted(wanted.items()):
                if self.kubelet is None:
                    raise RuntimeError(f"{container.name} requests {resource}, and no device manager double is set")
                exact = tuple(container.devices.get(resource, ()))
                admission = self.kubelet.admit(resource, count, must_include=exact)
                granted.append((resource, admission.devices))
                responses.append(admission.response)
        except Exception:
            for resource, ids in granted:
                self.kubelet.release(resource, ids)  # type: ignore[union-attr]
            raise
        options = device_options(responses, granted)
        pod.grants[container.name] = options
        self._record(pod)
        return options

    def _record(self, pod: RunningPod) -> None:
        if self.pod_resources is None:
            return
        containers = tuple(
            ContainerResources(name, tuple(ContainerDevices(r, ids, (0,)) for r, ids in options.granted))
            for name, options in pod.grants.items()
        )
        self.pod_resources.upsert_pod(PodResources(pod.spec.namespace, pod.spec.name, containers))

    def create_container(self, pod: RunningPod, container: ContainerSpec, *, timeout: float = CALL_TIMEOUT) -> str:
        """Admission (devices), then ``CreateContainer``; the container's ID."""
        options = pod.grants.get(container.name) or self.admit(pod, container)
        config = container_config(pod.spec, container, options)
        request = cri.CreateContainerRequest(pod_sandbox_id=pod.sandbox_id, config=config, sandbox_config=pod.config)
        answer = self._call("CreateContainer", request, timeout)
        pod.containers[container.name] = answer.container_id
        return str(answer.container_id)

    def start_container(self, container_id: str, *, timeout: float = CALL_TIMEOUT) -> None:
        self._call("StartContainer", cri.StartContainerRequest(container_id=container_id), timeout)

    def run_container(self, pod: RunningPod, container: ContainerSpec) -> str:
        cid = self.create_container(pod, container)
        self.start_container(cid)
        return cid

    def stop_container(self, container_id: str, timeout: int = 0) -> None:
        self._call("StopContainer", cri.StopContainerRequest(container_id=container_id, timeout=timeout))

    def remove_container(self, container_id: str) -> None:
        self._call("RemoveContainer", cri.RemoveContainerRequest(container_id=container_id))

    def status(self, container_id: str, *, verbose: bool = False) -> cri.ContainerStatusResponse:
        request = cri.ContainerStatusRequest(container_id=container_id, verbose=verbose)
        answer: cri.ContainerStatusResponse = self._call("ContainerStatus", request)
        return answer

    def runtime_spec(self, container_id: str) -> dict[str, Any]:
        """The OCI spec containerd stored for the container (verbose status ``info``)."""
        info = json.loads(self.status(container_id, verbose=True).info["info"])
        spec: dict[str, Any] = info["runtimeSpec"]
        return spec

    def exec_sync(self, container_id: str, cmd: Sequence[str], timeout: int = 10) -> cri.ExecSyncResponse:
        request = cri.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=timeout)
        answer: cri.ExecSyncResponse = self._call("ExecSync", request, timeout + 30)
        return answer

    def delete_pod(self, pod: RunningPod, *, grace: int = 0) -> None:
        """Stop and remove the containers and the sandbox; release the pod's devices."""
        for cid in pod.containers.values():
            for method in ("stop", "remove"):
                try:
                    if method == "stop":
                        self.stop_container(cid, grace)
                    else:
                        self.remove_container(cid)
                except CriError as exc:
                    if exc.code != grpc.StatusCode.NOT_FOUND:  # already gone: what the kubelet wants
                        raise
        pod.containers.clear()
        self._call("StopPodSandbox", cri.StopPodSandboxRequest(pod_sandbox_id=pod.sandbox_id))
        self._call("RemovePodSandbox", cri.RemovePodSandboxRequest(pod_sandbox_id=pod.sandbox_id))
        self.release(pod)

    def remove_container_of(self, pod: RunningPod, name: str) -> None:
        """Stop and remove one container of a running pod; its devices are free again (the
        kubelet does this when a pod's container is replaced, e.g. by a new attempt)."""
        cid = pod.containers.pop(name, None)
        if cid is not None:
            self.stop_container(cid)
            self.remove_container(cid)
        options = pod.grants.pop(name, None)
        if options is not None and self.kubelet is not None:
            for resource, ids in options.granted:
                self.kubelet.release(resource, ids)
        self._record(pod)

    def delete_all(self) -> None:
        """Delete every pod this double started (best effort: a runtime that is gone is fine)."""
        for pod in list(self.pods.values()):
            try:
                self.delete_pod(pod)
            except CriError:
                self.release(pod)

    def release(self, pod: RunningPod) -> None:
        """The pod is gone: its devices may be allocated again, pod-resources forgets it."""
        for options in pod.grants.values():
            for resource, ids in options.granted:
                if self.kubelet is not None:
                    self.kubelet.release(resource, ids)
        pod.grants.clear()
        with self._lock:
            self.pods.pop((pod.spec.namespace, pod.spec.name), None)
        if self.pod_resources is not None:
            self.pod_resources.remove_pod(pod.spec.namespace, pod.spec.name)

    def wait_exited(self, container_id: str, timeout: float = 20.0) -> cri.ContainerStatus:
        """Poll ContainerStatus until the container exited; its status."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(container_id).status
            if status.state == cri.CONTAINER_EXITED or time.monotonic() > deadline:
                return status
            time.sleep(0.05)


__all__ = [
    "ContainerSpec",
    "CriError",
    "DeviceOptions",
    "KubeletCri",
    "PodSpec",
    "RunningPod",
    "container_config",
    "device_options",
    "sandbox_config",
]
