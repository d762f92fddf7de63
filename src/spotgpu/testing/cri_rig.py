"""A GPU node driven through the real CRI, with spotgpu-runtime in this process.

For tests and ``spotgpu bench runtime --cri``. Side effects (all under ``base``, undone by
:meth:`CriRig.stop`): stand-in GPU device nodes and a driver folder, a private containerd with
CRI (:mod:`spotgpu.testing.cri_containerd`, configured from the shipped snippets), the kubelet
doubles over real gRPC (device manager, pod-resources, an NVIDIA-like vendor plugin), the
``platform/spot-gpu`` device plugin (:class:`~spotgpu.adapters.deviceplugin.DevicePluginServer`,
answering Allocate as the agent does, with the owner from this rig's MappingCache), and
spotgpu-runtime's service as the agent hosts it:

* ``wrapper`` mode: the installed shell fast path is the ``spotgpu`` handler's BinaryName
  (``deploy/containerd/spotgpu-runtime*.toml``); pods name that handler (a RuntimeClass);
* ``nri`` mode (containerd 2.x): no handler; the shipped ``nri-v3.toml`` (NRI's default validator
  requires the ``spotgpu`` plugin: no container is created while it is not connected, unless
  ``nri_validator=False``); the NRI plugin (:class:`~spotgpu.nri.service.NriRuntimeService`)
  adjusts every container and re-checks synced ones at StartContainer.

The GPUs are character devices with ``/dev/null``'s numbers (1, 3); the vendor plugin exposes
them as ``/dev/nvidia<N>`` with ``NVIDIA_VISIBLE_DEVICES`` and a read-only driver mount.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal

from spotgpu.adapters.deviceplugin import DevicePluginServer, TwinDevice
from spotgpu.agent.model import TwinView, allocate_annotations
from spotgpu.core.config import AgentConfig, GuardConfig
from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE, DeviceID, real_of_twin, to_spot_id
from spotgpu.core.mapping_cache import MappingCache
from spotgpu.core.refs import ContainerRef
from spotgpu.core.types import Health
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.service import RuntimeService
from spotgpu.runtime.shim import install_shim
from spotgpu.testing.cgroups import remove_cgroup_tree
from spotgpu.testing.cri import ContainerSpec, KubeletCri, PodSpec, RunningPod
from spotgpu.testing.cri_containerd import Binaries, CriContainerd, CriSettings, snippet_dir
from spotgpu.testing.kubelet import KubeletDouble
from spotgpu.testing.podresources import PodResourcesDouble
from spotgpu.testing.vendorplugin import VendorDevice, VendorPluginDouble

Mode = Literal["wrapper", "nri"]
HANDLER: Final = "spotgpu"
"""The runtime handler of the shipped snippets (a RuntimeClass's ``handler``)."""
SPOT_SOCKET: Final = "spotgpu-spot-gpu.sock"


def snippets(version: str, mode: Mode) -> tuple[Path, ...]:
    """The shipped containerd snippets a node of ``version`` in ``mode`` merges."""
    folder = snippet_dir()
    if mode == "nri":
        if version == "1.6":
            raise ValueError("containerd 1.6 has no NRI: use wrapper mode")
        return (folder / "nri-v3.toml",)
    return (folder / ("spotgpu-runtime.toml" if version == "1.6" else "spotgpu-runtime-v3.toml"),)


class CriRig:
    """The node (module docstring); ``start()``, use, ``stop()``."""

    def __init__(
        self,
        base: Path,
        binaries: Binaries,
        mode: Mode,
        images: Sequence[Path],
        *,
        gpus: int = 2,
        cdi_dirs: Sequence[str] = (),
        vendor_cdi_only: bool = False,
        host_plugin: bool = True,
        nri_validator: bool = True,
    ) -> None:
        self.base = base
        self.mode = mode
        self.host_plugin = host_plugin
        """NRI mode: run the NRI plugin in this process (False: a test runs its own)."""
        self.version = binaries.version
        self.gpu_ids = [DeviceID(f"GPU-{i}") for i in range(gpus)]
        plugins = base / "device-plugins"
        self.kubelet = KubeletDouble(plugins)
        self.pod_resources = PodResourcesDouble(base / "pod-resources" / "kubelet.sock")
        self.driver = base / "driver"
        self.vendor = VendorPluginDouble(
            plugins,
            NVIDIA_GPU_RESOURCE,
            [
                VendorDevice(g, str(base / "dev" / f"nvidia{i}"), f"/dev/nvidia{i}", 0)
                for i, g in enumerate(self.gpu_ids)
            ],
            mounts=[("/usr/local/nvidia", str(self.driver), True)],
            cdi_only=vendor_cdi_only,
        )
        self.cache = MappingCache()
        self.lent: dict[str, bool] = {}
        """The agent's lend rule answers per GPU (spotgpu-runtime's ``lendable``); a GPU not named
        here is lent exactly when an owner of it is recorded (:meth:`owner`)."""
        self.spot_plugin = DevicePluginServer(plugins, SPOT_GPU_RESOURCE, self._spot_allocate, socket_name=SPOT_SOCKET)
        self.listener = base / "run" / "guard.sock"
        self.config = RuntimeConfig(
            lower_runtime="runc",
            agent_socket=base / "run" / "agent.sock",
            device_plugin_dir=plugins,
            pod_resources_socket=self.pod_resources.socket,
            guard_listener_path=self.listener,
            device_plugin_sockets={NVIDIA_GPU_RESOURCE: self.vendor.socket.name},
        )
        self.shim: Path | None = None
        self.service: Any = None
        self.containerd = CriContainerd(
            base / "containerd",
            binaries,
            CriSettings(
                snippets=snippets(binaries.version, mode),
                cdi_dirs=tuple(cdi_dirs),
                nri=mode == "nri",
                nri_validator=nri_validator,
            ),
            images,
        )
        self.cri: KubeletCri | None = None
        self._started: list[Any] = []

    @property
    def handler(self) -> str:
        """What pods name as their RuntimeClass handler in this mode."""
        return HANDLER if self.mode == "wrapper" else ""

    def _spot_allocate(self, twins: Sequence[str]) -> dict[str, str]:
        def view(twin: str) -> TwinView | None:
            real = real_of_twin(twin, self.gpu_ids)
            return TwinView(real, Health.HEALTHY, self.cache.get_device_owner(real)) if real is not None else None

        return allocate_annotations(twins, view, gpu_resource=NVIDIA_GPU_RESOURCE)

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> CriRig:
        (self.base / "dev").mkdir(parents=True, exist_ok=True)
        (self.base / "run").mkdir(parents=True, exist_ok=True)
        (self.driver / "lib").mkdir(parents=True, exist_ok=True)
        (self.driver / "lib" / "libfake.txt").write_text("FAKE-DRIVER-LIB\n")
        for i in range(len(self.gpu_ids)):
            node = self.base / "dev" / f"nvidia{i}"
            if not node.exists():
                os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        for part in (self.kubelet, self.pod_resources, self.vendor):
            part.start()
            self._started.append(part)
        self.vendor.register()
        self.spot_plugin.set_devices([TwinDevice(to_spot_id(g), Health.HEALTHY, 0) for g in self.gpu_ids])
        self.spot_plugin.start()
        self._started.append(self.spot_plugin)
        self.kubelet.wait_registered(SPOT_GPU_RESOURCE)
        self.service = self._runtime_service().start()
        self._started.append(self.service)
        self.containerd.settings = self._settings()
        self.containerd.start()
        self._started.append(self.containerd)
        self.cri = KubeletCri(
            self.containerd.address,
            kubelet=self.kubelet,
            pod_resources=self.pod_resources,
            cgroup_root=f"spotgpu-cri-{os.getpid()}",
            log_root=self.base / "logs",
        )
        if self.mode == "nri" and self.host_plugin and not self.service.plugin.wait_synchronized(15):
            raise RuntimeError(f"the NRI plugin did not register: {self.service.plugin.status()}")
        return self

    def _settings(self) -> CriSettings:
        settings = self.containerd.settings
        if self.shim is None:
            return settings
        return dataclasses.replace(settings, spotgpu_runtime=str(self.shim))

    def _runtime_service(self) -> Any:
        agent = AgentConfig(
            node_name="cri-rig",
            device_plugin_dir=self.config.device_plugin_dir,
            pod_resources_socket=self.config.pod_resources_socket,
            runtime_socket=self.config.agent_socket,
            guard=GuardConfig(listener_path=self.listener),
        )
        sockets = (SPOT_SOCKET,)
        if self.mode == "nri" and self.host_plugin:
            from spotgpu.nri.config import NriConfig
            from spotgpu.nri.service import NriRuntimeService

            nri = NriConfig(enabled=True, socket_path=self.containerd.nri_socket)
            return NriRuntimeService.for_agent(
                agent,
                self.config,
                nri,
                owner_of=self.cache.get_device_owner,
                own_plugin_sockets=sockets,
                lendable=self.lendable,
            )
        self.shim = install_shim(self.base / "shim", self.config.with_agent(agent))
        return RuntimeService.for_agent(
            agent, self.config, owner_of=self.cache.get_device_owner, own_plugin_sockets=sockets, lendable=self.lendable
        )

    def lendable(self, device: str) -> bool | None:
        """The agent's answer to spotgpu-runtime's lend rule: :attr:`lent`, else True for a served
        GPU with a recorded owner, None (the agent cannot say: refused) otherwise."""
        if device in self.lent:
            return self.lent[device]
        return True if device in self.gpu_ids and self.cache.get_device_owner(device) is not None else None

    def stop(self) -> None:
        if self.cri is not None:
            self.cri.delete_all()
            self.cri.close()
            self.cri = None
        while self._started:
            part = self._started.pop()
            with contextlib.suppress(Exception):
                part.close() if isinstance(part, KubeletDouble) else part.stop()
        remove_cgroup_tree(f"spotgpu-cri-{os.getpid()}")

    def __enter__(self) -> CriRig:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_cdi_spec(self, folder: Path) -> Path:
        """A CDI spec (``cdiVersion`` 0.6.0) for the vendor plugin's devices in ``folder``: kind
        ``nvidia.com/gpu``, one device per GPU with its stand-in node and ``NVIDIA_VISIBLE_DEVICES``."""
        devices = [
            {
                "name": gpu,
                "containerEdits": {
                    "deviceNodes": [{"path": f"/dev/nvidia{i}", "hostPath": str(self.base / "dev" / f"nvidia{i}")}],
                    "env": [f"NVIDIA_VISIBLE_DEVICES={gpu}"],
                },
            }
            for i, gpu in enumerate(self.gpu_ids)
        ]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "spotgpu-test-gpus.json"
        path.write_text(json.dumps({"cdiVersion": "0.6.0", "kind": NVIDIA_GPU_RESOURCE, "devices": devices}))
        return path

    def bundle_spec(self, container_id: str) -> dict[str, Any]:
        """The ``config.json`` runc ran for a started container (after spotgpu-runtime's change)."""
        tasks = self.containerd.base / "state" / "io.containerd.runtime.v2.task" / "k8s.io"
        spec: dict[str, Any] = json.loads((tasks / container_id / "config.json").read_text())
        return spec

    # -- pods ------------------------------------------------------------------------------
    def pod(self, ref: ContainerRef, **kwargs: Any) -> RunningPod:
        """Start ``ref``'s pod (sandbox) with this mode's handler."""
        assert self.cri is not None and ref.namespace is not None
        return self.cri.run_pod(PodSpec(ref.namespace, ref.pod, runtime_handler=self.handler, **kwargs))

    def owner(self, ref: ContainerRef, gpus: Sequence[str], **container: Any) -> tuple[RunningPod, str]:
        """An owner pod holding ``gpus`` (Allocate of the vendor plugin); records it as their owner."""
        pod = self.pod(ref)
        self.cache.create(ref, list(gpus))
        assert self.cri is not None
        spec = ContainerSpec(ref.name, devices={NVIDIA_GPU_RESOURCE: list(gpus)}, **container)
        return pod, self.cri.run_container(pod, spec)


__all__ = ["HANDLER", "CriRig", "Mode", "snippets"]
