"""One GPU node on this machine, for ``spotgpu node-e2e``: every real node component, and the
harness playing the parts that cannot run here (the kubelet, the API server, the GPUs).

Decides nothing about lending. Side effects (all under one private directory, all undone by
:meth:`Node.close`): stand-in device nodes, a static test program, a private containerd and the
containers its launcher starts (:mod:`spotgpu.e2e.launch_cri`, the default, or
:mod:`spotgpu.e2e.launch`), the kubelet-side doubles over real gRPC (:mod:`spotgpu.testing.kubelet`)
and the HTTP Kubernetes API double (:class:`spotgpu.testing.kubeapi.KubeApiServer`) in this
process, the guard's fd holder and the agent as child processes (``spotgpu guard-holder``,
``spotgpu agent --config``), the installed spotgpu-runtime fast path, cgroups.

What is real and what stands in:

* real: containerd (Debian's 1.6 or 2.2.7) with its CRI plugin configured from the shipped
  ``deploy/containerd/`` snippets, its runc shim, runc, the seccomp notify rule, spotgpu-runtime
  (the ``spotgpu`` handler's installed shell fast path, the wrapper and the agent-hosted
  service; or, in NRI mode, the agent's NRI plugin), the agent process with its device plugin,
  detection, solver, eviction through containerd, guard (GuardService) and the fd holder, the
  Kubernetes client (KubeAgentPort over HTTP), gRPC and ttrpc on unix sockets everywhere;
* protocol-level doubles (no kubelet, API server or GPU can run here): the kubelet (its CRI
  calls and device manager, pod-resources), an NVIDIA-like device plugin, the API server;
* checks: a watcher at ``SCHED_FIFO`` (:mod:`spotgpu.testing.exitwatch`) pins every spot
  process and timestamps its exit as the kernel reports it;
* stand-ins: "GPUs" are character devices with ``/dev/null``'s numbers (1, 3), exposed in
  containers as ``/dev/nvidia<N>`` (and ``/dev/nvidiactl``); the agent's ``devnode`` backend
  finds GPU processes by their open file descriptors, and their utilization comes from files
  this harness writes (0 %).

The harness is the kubelet: it writes each pod to the API double, has its container created by
the launcher (through CRI: RunPodSandbox with the RuntimeClass handler, the device plugins'
Allocate answers mapped into the ContainerConfig, CreateContainer, StartContainer), records the
grant in pod-resources, and reports the pod running.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from spotgpu.adapters.proto import containerd_tasks_pb2 as tpb
from spotgpu.adapters.proto import containerd_tasks_pb2_grpc as tpb_grpc
from spotgpu.core import keys
from spotgpu.core.config import AgentConfig
from spotgpu.core.configfile import load_yaml_file
from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.e2e.client import build_client
from spotgpu.e2e.launch import CtrLauncher, Launcher, Mount
from spotgpu.e2e.model import (
    CONTAINERD_NAMESPACE,
    CONTROL_CHAR_DEVICE,
    CTL_PATH,
    IMAGE,
    NODE,
    OWNER,
    SPOT_CONTAINER,
    SPOT_NAMESPACE,
    NodeSettings,
    Paths,
    Spot,
    container_id,
    free_port,
    gpu_fds,
    gpu_id,
    gpu_path,
    twin_of,
)
from spotgpu.e2e.processes import ApiBackedPodResources, ChildProcess, OwnerClient
from spotgpu.guard.rule import listener_ready
from spotgpu.runtime.config import load_runtime_config
from spotgpu.runtime.shim import install_shim
from spotgpu.testing.cgroups import remove_cgroup_tree
from spotgpu.testing.containerd import Containerd
from spotgpu.testing.exitwatch import ExitWatcher
from spotgpu.testing.kubeapi import KubeApiServer
from spotgpu.testing.kubelet import KubeletDouble
from spotgpu.testing.podresources import ContainerDevices
from spotgpu.testing.vendorplugin import VendorDevice, VendorPluginDouble

log = logging.getLogger(__name__)


def make_launcher(node: Node) -> Launcher:
    if node.settings.launcher == "ctr":
        return CtrLauncher(node)
    from spotgpu.e2e.launch_cri import CriLauncher

    return CriLauncher(node)


class Node:
    """The node (see module docstring). ``start()`` it, drive it, ``close()`` it (also on errors)."""

    def __init__(self, base: Path, settings: NodeSettings) -> None:
        self.settings = settings
        self.paths = Paths(base)
        self.run_id = secrets.token_hex(4)
        self.cgroup_root = f"spotgpu-e2e-{self.run_id}"
        self.api = KubeApiServer()
        self.kubelet = KubeletDouble(self.paths.plugins)
        self.pod_resources = ApiBackedPodResources(self.paths.pod_resources / "kubelet.sock", self.api)
        control = [] if settings.launcher == "ctr" else [(CTL_PATH, str(self.paths.dev / "ctl"))]
        self.vendor = VendorPluginDouble(
            self.paths.plugins,
            NVIDIA_GPU_RESOURCE,
            [VendorDevice(gpu_id(i), str(self.paths.dev / f"gpu{i}"), gpu_path(i), 0) for i in range(settings.gpus)],
            extra_devices=control,  # NVIDIA's plugin hands out the control device with every GPU
        )
        self.launcher = make_launcher(self)
        self.metrics_port = free_port()
        self.debug_port = free_port()
        self.agent_config = base / "agent.yaml"
        self.kubeconfig = base / "kubeconfig"
        self.agent = ChildProcess(
            "agent",
            [sys.executable, "-m", "spotgpu", "--log-level", settings.agent_log_level, "agent",
             "--config", str(self.agent_config), "--kubeconfig", str(self.kubeconfig), "--node", NODE],
            self.paths.logs / "agent.log",
        )  # fmt: skip
        self.holder = ChildProcess(
            "guard-holder",
            [sys.executable, "-m", "spotgpu", "--log-level", "INFO", "guard-holder",
             "--listener", str(self.listener), "--control", str(self.paths.run / "holder.sock"),
             "--guard-timeout", str(settings.holder_timeout), "--runtime", "runc",
             "--cgroup-root", self.cgroup_root],
            self.paths.logs / "guard-holder.log",
        )  # fmt: skip
        self.shim: Path | None = None
        self.exits: ExitWatcher | None = None
        """The kernel's exit times of the spot processes (started with the node)."""
        self.owner: OwnerClient | None = None
        self.owner_cid = ""
        self.owner_uid = ""
        """The owner pod's UID (the API's, once admitted)."""
        self._tasks_channel: Any = None

    @property
    def containerd(self) -> Containerd:
        return self.launcher.containerd

    # -- paths -------------------------------------------------------------------------------
    @property
    def listener(self) -> Path:
        return self.paths.run / "guard.sock"

    @property
    def state_url(self) -> str:
        return f"http://127.0.0.1:{self.debug_port}/debug/state"

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> None:
        base = self.paths.base
        for i in range(self.settings.gpus):
            os.mknod(self.paths.dev / f"gpu{i}", 0o666 | stat.S_IFCHR, CONTROL_CHAR_DEVICE)
            (self.paths.util / gpu_id(i)).write_text("0\n")
        os.mknod(self.paths.dev / "ctl", 0o666 | stat.S_IFCHR, CONTROL_CHAR_DEVICE)
        self.launcher.prepare(build_client(base / "bin"))
        self.exits = ExitWatcher(base / "bin")
        self.api.start()
        self.api.put({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        })  # fmt: skip
        self.api.write_kubeconfig(self.kubeconfig)
        self.kubelet.start()
        self.pod_resources.start()
        self.pod_resources.set_allocatable(
            [ContainerDevices(NVIDIA_GPU_RESOURCE, (gpu_id(i),), (0,)) for i in range(self.settings.gpus)]
        )
        self.vendor.start()
        self.vendor.register()
        self.holder.start()
        deadline = time.monotonic() + 30
        while not (listener_ready(str(self.listener)) and (self.paths.run / "holder.sock").exists()):
            if not self.holder.running or time.monotonic() > deadline:
                raise RuntimeError(f"the guard's fd holder did not come up:\n{self.holder.log_tail()}")
            time.sleep(0.02)
        self._write_agent_config()
        runtime = load_runtime_config(self.agent_config)
        agent_config = load_yaml_file(self.agent_config, AgentConfig, section="agent")
        self.shim = install_shim(base / "shim", runtime.with_agent(agent_config), config_path=self.agent_config)
        self.launcher.start()
        self.start_agent()
        self._admit_owner()

    def close(self) -> None:
        """Stop everything this node started (best effort, in reverse order; never raises)."""
        steps: list[tuple[str, Callable[[], None]]] = [
            ("owner client", lambda: self.owner.close() if self.owner else None),
            ("agent", lambda: self.agent.stop(timeout=15)),
            ("containers", self.launcher.close),
            ("holder", self.holder.kill),
            ("tasks channel", lambda: self._tasks_channel.close() if self._tasks_channel is not None else None),
            ("vendor plugin", self.vendor.stop),
            ("pod-resources", self.pod_resources.stop),
            ("kubelet", self.kubelet.close),
            ("api", self.api.stop),
            ("cgroups", self._remove_cgroups),
            ("exit watcher", lambda: self.exits.close() if self.exits is not None else None),
        ]
        for name, step in steps:
            try:
                step()
            except Exception:
                log.exception("stopping %s failed", name)

    def _remove_cgroups(self) -> None:
        remove_cgroup_tree(self.cgroup_root)

    # -- the agent -------------------------------------------------------------------------------
    def _write_agent_config(self) -> None:
        s, run = self.settings, self.paths.run
        config = {
            "agent": {
                "nodeName": NODE,
                "detectInterval": s.detect_interval,
                "maxInactiveTime": s.max_inactive_time,
                # every cycle lends again after maxInactiveTime: the timer, not the predictive
                # default (which backs off owners that keep coming back, as these cycles do)
                "lending": {"policy": "timer"},
                "gpuResource": NVIDIA_GPU_RESOURCE,
                "gpuBackend": "devnode",
                "deviceNodes": [
                    {"id": gpu_id(i), "path": str(self.paths.dev / f"gpu{i}"), "index": i, "numaNode": 0,
                     "containerPaths": [gpu_path(i)]}
                    for i in range(s.gpus)
                ],
                "utilizationDir": str(self.paths.util),
                "devicePluginDir": str(self.paths.plugins),
                "podResourcesSocket": str(self.pod_resources.socket),
                "containerdSocket": self.containerd.address,
                "containerdNamespace": CONTAINERD_NAMESPACE,
                "containerdStateDir": str(self.containerd.base / "state"),
                "metricsAddress": f"127.0.0.1:{self.metrics_port}",
                "debugAddress": f"127.0.0.1:{self.debug_port}",
                "runtimeSocket": str(run / "agent.sock"),
                "stateFile": str(run / "agent-state.json"),
                "twinReplicas": s.replicas,
                "eviction": {
                    "releaseCheck": {
                        "cgroupRoots": [self.cgroup_root],
                        "controlDevices": [{"path": str(self.paths.dev / "ctl"), "containerPaths": [CTL_PATH]}],
                    },
                },
                "guard": {
                    "listenerPath": str(self.listener),
                    "holderPath": str(run / "holder.sock"),
                    "failOpenTimeout": s.fail_open_timeout,
                    "holderTimeout": s.holder_timeout,
                },
            },
            "runtime": {
                "lowerRuntime": "runc",
                "gpuResources": [NVIDIA_GPU_RESOURCE],
                "crossNamespaceSources": [OWNER.namespace],
                "devicePluginSockets": {NVIDIA_GPU_RESOURCE: self.vendor.socket.name},
            },
        }  # fmt: skip
        nri_socket = getattr(self.launcher, "nri_socket", None)
        if nri_socket is not None:
            config["nri"] = {"enabled": True, "socketPath": str(nri_socket)}
        self.agent_config.write_text(yaml.safe_dump(config, sort_keys=False))

    def start_agent(self, timeout: float = 60.0) -> float:
        """Start the agent process and wait until it has recovered, registered its device plugin
        and (with the guard) attached to the fd holder; returns the seconds that took."""
        began = time.monotonic()
        registrations = self.kubelet.registration_count(SPOT_GPU_RESOURCE)
        self.agent.start()
        deadline = began + timeout
        while True:
            if not self.agent.running:
                raise RuntimeError(f"the agent exited during start:\n{self.agent.log_tail()}")
            state = self.agent_state(timeout=1.0)
            guard = (state or {}).get("guard") or {}
            if (
                state is not None
                and state.get("recovered")
                and (not guard.get("available") or guard.get("attached"))
                and self.kubelet.registration_count(SPOT_GPU_RESOURCE) > registrations
            ):
                return time.monotonic() - began
            if time.monotonic() > deadline:
                raise TimeoutError(f"the agent did not become ready within {timeout:.0f}s:\n{self.agent.log_tail()}")
            time.sleep(0.05)

    def agent_state(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """The agent's ``/debug/state``; None when it does not answer."""
        try:
            with urllib.request.urlopen(self.state_url, timeout=timeout) as answer:
                data: dict[str, Any] = json.loads(answer.read())
                return data
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def wait_state(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float, interval: float = 0.02
    ) -> dict[str, Any] | None:
        """Poll ``/debug/state`` until ``predicate`` holds; the last state seen (None if never)."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            state = self.agent_state()
            if state is not None:
                last = state
                if predicate(state):
                    return state
            if time.monotonic() > deadline:
                return last if last is not None and predicate(last) else None
            time.sleep(interval)

    # -- the kubelet's part --------------------------------------------------------------------------
    def _put_pod(self, ref: ContainerRef, requests: Mapping[str, int]) -> str:
        """The pod in the API, bound to the node; its UID (the API server's: the kubelet names the
        pod's cgroup and sandbox after it, so must the launcher)."""
        stored = self.api.put({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": ref.pod, "namespace": ref.namespace},
            "spec": {"nodeName": NODE, "containers": [{
                "name": ref.name,
                "image": IMAGE,
                "resources": {"requests": {k: str(v) for k, v in requests.items()},
                              "limits": {k: str(v) for k, v in requests.items()}},
            }]},
            "status": {"phase": "Pending"},
        })  # fmt: skip
        return str(stored["metadata"]["uid"])

    def _pod_running(self, ref: ContainerRef, cid: str) -> None:
        def running(pod: dict[str, Any]) -> None:
            pod["status"] = {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": ref.name,
                        "image": IMAGE,
                        "imageID": IMAGE,
                        "containerID": f"containerd://{cid}",
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}},
                    }
                ],
            }

        self.api.mutate("", "pods", ref.pod, running, namespace=ref.namespace or "")

    def _admit_owner(self) -> None:
        """The developer's pod: two GPUs, the guard's rule (spotgpu-runtime adds it), the client."""
        self.owner_uid = self._put_pod(OWNER, {NVIDIA_GPU_RESOURCE: self.settings.gpus})
        self.owner = OwnerClient(self.paths.owner_io)
        self.owner_cid = self.launcher.run_owner(self.owner_uid, self.paths.owner_io)
        self._pod_running(OWNER, self.owner_cid)
        reply = self.owner.command("ping", timeout=30)
        if "pid" not in reply:
            raise RuntimeError(f"the owner's GPU client did not start: {reply}")
        bundle_spec = json.loads(self.bundle_config(self.owner_cid).read_text())
        guarded = bundle_spec.get("annotations", {}).get(keys.GUARDED)
        if guarded != OWNER.format():
            skipped = bundle_spec.get("annotations", {}).get(keys.GUARD_SKIPPED)
            raise RuntimeError(f"spotgpu-runtime did not install the guard's rule into the owner (skipped: {skipped})")
        covered = self.wait_state(lambda s: OWNER.format() in (s.get("guard") or {}).get("covers", []), 15)
        if covered is None:
            raise RuntimeError("the guard never received the owner container's notify fd")

    def bundle_config(self, cid: str) -> Path:
        """The ``config.json`` the runc shim ran (after spotgpu-runtime modified it)."""
        tasks = self.containerd.base / "state" / "io.containerd.runtime.v2.task"
        return tasks / CONTAINERD_NAMESPACE / cid / "config.json"

    def start_spot(
        self, name: str, index: int, *, args: Sequence[str] | None = None, mounts: Sequence[Mount] = ()
    ) -> Spot:
        """Start spot pod ``name`` on twin ``index`` (GPU ``index % gpus``): API pod, then the
        launcher (Allocate of the twin through the kubelet double, pod-resources grant, the
        container with the Allocate annotation: device sync does the rest). By default it holds
        its synced GPU open and sleeps; ``args`` run instead (``{gpu}`` names the GPU's path)."""
        gpu, replica = index % self.settings.gpus, index // self.settings.gpus
        twin = twin_of(gpu, replica, self.settings.replicas)
        ref = ContainerRef(SPOT_NAMESPACE, name, SPOT_CONTAINER)
        began = time.monotonic()
        uid = self._put_pod(ref, {SPOT_GPU_RESOURCE: 1})
        if args is None:
            args = ["/bin/sh", "-c", f"exec 3<>{gpu_path(gpu)}; exec sleep 1000000"]
        cid = self.launcher.start_spot(ref, uid, twin, [a.format(gpu=gpu_path(gpu)) for a in args], mounts)
        start_ms = (time.monotonic() - began) * 1000
        self._pod_running(ref, cid)
        return Spot(ref.pod_ref, uid, cid, gpu, twin, start_ms)

    def start_plain(self, ref: ContainerRef, args: Sequence[str], mounts: Sequence[Mount] = ()) -> tuple[str, str]:
        """An ordinary pod of one container that requests no device (a tenant's CPU pod),
        running; its (pod UID, container ID)."""
        uid = self._put_pod(ref, {})
        cid = self.launcher.run_plain(ref, uid, args, mounts)
        self._pod_running(ref, cid)
        return uid, cid

    def forget_pod(self, ref: PodRef) -> None:
        """The kubelet's part after a pod is gone: no more pod-resources rows."""
        self.pod_resources.remove_pod(ref.namespace or "", ref.name)

    # -- containerd ------------------------------------------------------------------------------
    def _tasks(self) -> Any:
        if self._tasks_channel is None:
            import grpc

            self._tasks_channel = grpc.insecure_channel(f"unix://{self.containerd.address}")
        return tpb_grpc.TasksStub(self._tasks_channel)

    def _md(self) -> tuple[tuple[str, str], ...]:
        return ((keys.CONTAINERD_NAMESPACE_HEADER, CONTAINERD_NAMESPACE),)

    def init_pid(self, cid: str) -> int | None:
        import grpc

        try:
            process = self._tasks().Get(tpb.GetRequest(container_id=cid), metadata=self._md(), timeout=5).process
        except grpc.RpcError:
            return None
        return int(process.pid) if process.status == tpb.RUNNING and process.pid > 0 else None

    def remove_container(self, cid: str) -> float | None:
        """The kubelet's clean-up of a dead container (and its pod); its exit time (wall clock,
        seconds) as the runtime recorded it, None when there was none."""
        return self.launcher.remove(cid)

    def delete_task(self, cid: str) -> float | None:
        """Delete the container's (stopped) task and the container through containerd's own API;
        returns the task's exit time (wall clock, seconds), None when there was no task."""
        import grpc

        exited: float | None = None
        try:
            answer = self._tasks().Delete(tpb.DeleteTaskRequest(container_id=cid), metadata=self._md(), timeout=10)
            exited = answer.exited_at.seconds + answer.exited_at.nanos / 1e9
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                self.containerd.ctr("tasks", "delete", "-f", cid, namespace=CONTAINERD_NAMESPACE, check=False)
        self.containerd.ctr("containers", "delete", cid, namespace=CONTAINERD_NAMESPACE, check=False)
        return exited

    def restart_containerd(self) -> float:
        """Start the (paused) containerd again on the same paths; returns seconds until it answers."""
        began = time.monotonic()
        self.containerd.start()
        return time.monotonic() - began

    # -- kubelet restart -----------------------------------------------------------------------------
    def restart_kubelet(self) -> None:
        """What a kubelet restart does to the plugins: every socket in the device-plugins
        directory deleted and ``kubelet.sock`` served anew; pod-resources re-created. The
        vendor plugin (a real one watches for this) serves again and re-registers."""
        self.kubelet.restart()
        self.pod_resources.stop()
        self.pod_resources.start()
        self.vendor.stop()
        self.vendor.start()
        self.vendor.register()


__all__ = [
    "CTL_PATH",
    "IMAGE",
    "NODE",
    "OWNER",
    "SPOT_NAMESPACE",
    "ApiBackedPodResources",
    "ChildProcess",
    "Node",
    "NodeSettings",
    "OwnerClient",
    "Spot",
    "container_id",
    "gpu_fds",
    "gpu_id",
    "gpu_path",
    "remove_cgroup_tree",
    "twin_of",
]
