"""One GPU node on this machine, for ``spotgpu node-e2e``: every real node component, and the
harness playing the parts that cannot run here (the kubelet, the API server, the GPUs).

Decides nothing about lending. Side effects (all under one private directory, all undone by
:meth:`Node.close`): stand-in device nodes, a static test program, a busybox root filesystem,
a private containerd (:class:`spotgpu.testing.containerd.Containerd`), the kubelet-side doubles
over real gRPC (:mod:`spotgpu.testing.kubelet`) and the HTTP Kubernetes API double
(:class:`spotgpu.testing.kubeapi.KubeApiServer`) in this process, the guard's fd holder and the
agent as child processes (``spotgpu guard-holder``, ``spotgpu agent --config``), the installed
spotgpu-runtime fast path, containers and their cgroups.

What is real and what stands in:

* real: containerd 1.6 and its runc shim, runc, the seccomp notify rule, spotgpu-runtime (its
  installed shell fast path, the wrapper, the agent-hosted service and modifier chain), the
  agent process with its device plugin, detection, solver, eviction through containerd, guard
  (GuardService) and the fd holder, the Kubernetes client (KubeAgentPort over HTTP), gRPC on
  unix sockets everywhere;
* protocol-level doubles (no kubelet, API server or GPU can run here): the kubelet's device
  manager and pod-resources API, an NVIDIA-like device plugin, the API server;
* stand-ins: "GPUs" are character devices with ``/dev/null``'s numbers (1, 3), exposed in
  containers as ``/dev/nvidia<N>``; the agent's ``devnode`` backend finds GPU processes by their
  open file descriptors, and their utilization comes from files this harness writes (0 %).

The harness is the kubelet and containerd's CRI plugin: it writes each pod to the API double,
asks the device plugins for the container's devices (``Allocate`` through the kubelet double),
records the grant in pod-resources, builds the container's OCI spec the way the CRI plugin
would (the CRI annotations that name pod and container, the Allocate answer's env, devices and
annotations, a kubelet-style cgroup path ``/<run>/pod<uid>/<64-hex id>``) and creates it with
``ctr run --config`` through the spotgpu-runtime fast path (``--runc-binary``).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import queue
import secrets
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from spotgpu.adapters.proto import containerd_tasks_pb2 as tpb
from spotgpu.adapters.proto import containerd_tasks_pb2_grpc as tpb_grpc
from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2 as dp
from spotgpu.core import keys
from spotgpu.core.config import AgentConfig, load_yaml_file
from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE, DeviceID, NodeName, to_spot_id
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.e2e.client import build_client
from spotgpu.guard.rule import listener_ready
from spotgpu.runtime.config import load_runtime_config
from spotgpu.runtime.shim import install_shim
from spotgpu.testing.containerd import Containerd, make_rootfs
from spotgpu.testing.kubeapi import KubeApiServer
from spotgpu.testing.kubelet import (
    ContainerDevices,
    ContainerResources,
    KubeletDouble,
    PodResources,
    PodResourcesDouble,
    VendorDevice,
    VendorPluginDouble,
)

log = logging.getLogger(__name__)

NODE: Final = NodeName("e2e-node")
OWNER: Final = ContainerRef("team-a", "devbox", "main")
SPOT_NAMESPACE: Final = "spot-jobs"
SPOT_CONTAINER: Final = "worker"
CONTAINERD_NAMESPACE: Final = keys.CONTAINERD_K8S_NAMESPACE
STANDIN: Final = (1, 3)
"""Device numbers of the stand-in GPUs (``/dev/null``'s): every ioctl on them fails with ENOTTY."""
CTL_PATH: Final = "/dev/nvidiactl"
IMAGE: Final = "localhost/spotgpu-e2e/busybox:static"
"""What the pods say they run (the containers really run the harness's busybox root filesystem)."""
CONTROL_CHAR_DEVICE = os.makedev(*STANDIN)


@dataclass(frozen=True, slots=True)
class NodeSettings:
    """How the node is set up (the CLI's options)."""

    gpus: int = 2
    """GPUs of the owner (all of the node's GPUs)."""
    spot_containers: int = 8
    detect_interval: float = 0.25
    max_inactive_time: float = 1.0
    fail_open_timeout: float = 5.0
    holder_timeout: float = 1.0
    agent_log_level: str = "INFO"

    @property
    def replicas(self) -> int:
        """Twins per GPU so that every spot container gets one (shared spot when > 1)."""
        return max(1, -(-self.spot_containers // self.gpus))


def gpu_id(index: int) -> DeviceID:
    return DeviceID(f"GPU-e2e-{index}")


def gpu_path(index: int) -> str:
    """Where containers see GPU ``index`` (NVIDIA's naming)."""
    return f"/dev/nvidia{index}"


def twin_of(index: int, replica: int, replicas: int) -> DeviceID:
    twin = to_spot_id(gpu_id(index))
    return twin if replicas == 1 else DeviceID(f"{twin}::{replica}")


def container_id(*parts: str) -> str:
    """A CRI-style 64-hex container ID (unique per run, pod, container and attempt)."""
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ChildProcess:
    """A child process with its output in a log file; killed by :meth:`kill` or :meth:`stop`."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            out.write(f"--- start {self.starts} of {self.name}: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def kill(self) -> None:
        """SIGKILL and reap (a crash, as the faults want it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class OwnerClient:
    """The owner container's GPU client (:mod:`spotgpu.e2e.client`), driven over two FIFOs."""

    def __init__(self, io_dir: Path) -> None:
        self.io_dir = io_dir
        io_dir.mkdir(parents=True, exist_ok=True)
        for name in ("cmd", "out"):
            path = io_dir / name
            path.unlink(missing_ok=True)
            os.mkfifo(path, 0o600)
        # O_RDWR on a FIFO never blocks and keeps it open from both ends: the container's opens
        # succeed at once, and the client never sees EOF while this object lives.
        self._cmd = os.open(io_dir / "cmd", os.O_RDWR | os.O_CLOEXEC)
        self._out = os.open(io_dir / "out", os.O_RDWR | os.O_CLOEXEC)
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._reader = threading.Thread(target=self._read, name="owner-client", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        poller = select.poll()
        poller.register(self._out, select.POLLIN)
        pending = b""
        while not self._closing.is_set():
            if not poller.poll(200):
                continue
            try:
                chunk = os.read(self._out, 65536)
            except OSError:
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                with contextlib.suppress(ValueError):
                    self._replies.put(json.loads(line))

    def command(self, text: str, timeout: float) -> dict[str, Any]:
        """Send one command and wait for its reply."""
        with self._lock:
            os.write(self._cmd, text.encode() + b"\n")
            try:
                return self._replies.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"the owner's GPU client did not answer {text!r} within {timeout:.1f}s") from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._cmd, b"exit\n")
        self._closing.set()
        self._reader.join(timeout=2)
        for fd in (self._cmd, self._out):
            with contextlib.suppress(OSError):
                os.close(fd)


class ApiBackedPodResources(PodResourcesDouble):
    """The pod-resources double, answering only for pods the API double still has: a deleted
    pod leaves the kubelet's active pods (and so ``List``/``Get``) at once. ``delay`` makes every
    answer that much slower (a kubelet under load, for the faults)."""

    def __init__(self, socket_path: Path, api: KubeApiServer) -> None:
        super().__init__(socket_path)
        self.api = api
        self.delay = 0.0

    def pods(self) -> list[PodResources]:
        if self.delay > 0:
            time.sleep(self.delay)
        alive = {(p["metadata"].get("namespace", ""), p["metadata"]["name"]) for p in self.api.objects("", "pods")}
        return [p for p in super().pods() if (p.namespace, p.name) in alive]


@dataclass(slots=True)
class Spot:
    """One spot pod the harness started (one container)."""

    ref: PodRef
    uid: str
    cid: str
    gpu: int
    twin: DeviceID
    start_ms: float
    pid: int | None = None


@dataclass(slots=True)
class Paths:
    base: Path
    dev: Path = field(init=False)
    plugins: Path = field(init=False)
    pod_resources: Path = field(init=False)
    run: Path = field(init=False)
    logs: Path = field(init=False)
    specs: Path = field(init=False)
    util: Path = field(init=False)
    owner_io: Path = field(init=False)

    def __post_init__(self) -> None:
        for name in ("dev", "plugins", "pod_resources", "run", "logs", "specs", "util", "owner_io"):
            path = self.base / name.replace("_", "-")
            path.mkdir(parents=True, exist_ok=True)
            setattr(self, name, path)


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
        self.vendor = VendorPluginDouble(
            self.paths.plugins,
            NVIDIA_GPU_RESOURCE,
            [VendorDevice(gpu_id(i), str(self.paths.dev / f"gpu{i}"), gpu_path(i), 0) for i in range(settings.gpus)],
        )
        self.containerd = Containerd(base / "ctd")
        self.metrics_port = free_port()
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
             "--guard-timeout", str(settings.holder_timeout), "--runtime", "runc"],
            self.paths.logs / "guard-holder.log",
        )  # fmt: skip
        self.shim: Path | None = None
        self.rootfs: Path | None = None
        self.owner: OwnerClient | None = None
        self.owner_cid = container_id(self.run_id, OWNER.format(), "0")
        self.owner_uid = str(uuid.uuid4())
        self._spec_template: dict[str, Any] | None = None
        self._pods: dict[PodRef, PodResources] = {}
        self._started: list[str] = []
        self._tasks_channel: Any = None

    # -- paths -------------------------------------------------------------------------------
    @property
    def listener(self) -> Path:
        return self.paths.run / "guard.sock"

    @property
    def state_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/debug/state"

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> None:
        base = self.paths.base
        for i in range(self.settings.gpus):
            os.mknod(self.paths.dev / f"gpu{i}", 0o666 | stat.S_IFCHR, CONTROL_CHAR_DEVICE)
            (self.paths.util / gpu_id(i)).write_text("0\n")
        os.mknod(self.paths.dev / "ctl", 0o666 | stat.S_IFCHR, CONTROL_CHAR_DEVICE)
        client = build_client(base / "bin")
        self.rootfs = make_rootfs(base / "rootfs", [(client, "/bin/e2eclient")])
        (self.rootfs / "e2e").mkdir(exist_ok=True)
        self.containerd.start()
        self._started.append("containerd")
        self.api.start()
        self._started.append("api")
        self.api.put({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        })  # fmt: skip
        self.api.write_kubeconfig(self.kubeconfig)
        self.kubelet.start()
        self._started.append("kubelet")
        self.pod_resources.start()
        self.pod_resources.set_allocatable(
            [ContainerDevices(NVIDIA_GPU_RESOURCE, (gpu_id(i),), (0,)) for i in range(self.settings.gpus)]
        )
        self._started.append("pod-resources")
        self.vendor.start()
        self.vendor.register()
        self._started.append("vendor")
        self.holder.start()
        self._started.append("holder")
        deadline = time.monotonic() + 30
        while not (listener_ready(str(self.listener)) and (self.paths.run / "holder.sock").exists()):
            if not self.holder.running or time.monotonic() > deadline:
                raise RuntimeError(f"the guard's fd holder did not come up:\n{self.holder.log_tail()}")
            time.sleep(0.02)
        self._write_agent_config()
        runtime = load_runtime_config(self.agent_config)
        agent_config = load_yaml_file(self.agent_config, AgentConfig, section="agent")
        self.shim = install_shim(base / "shim", runtime.with_agent(agent_config), config_path=self.agent_config)
        self.start_agent()
        self._admit_owner()

    def close(self) -> None:
        """Stop everything this node started (best effort, in reverse order; never raises)."""
        steps: list[tuple[str, Callable[[], None]]] = [
            ("owner client", lambda: self.owner.close() if self.owner else None),
            ("agent", lambda: self.agent.stop(timeout=15)),
            ("containerd", self.containerd.stop),
            ("holder", self.holder.kill),
            ("tasks channel", lambda: self._tasks_channel.close() if self._tasks_channel is not None else None),
            ("vendor plugin", self.vendor.stop),
            ("pod-resources", self.pod_resources.stop),
            ("kubelet", self.kubelet.close),
            ("api", self.api.stop),
            ("cgroups", self._remove_cgroups),
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
                "metricsAddress": f"127.0.0.1:{self.metrics_port}",
                "runtimeSocket": str(run / "agent.sock"),
                "stateFile": str(run / "agent-state.json"),
                "twinReplicas": s.replicas,
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
    def _template(self) -> dict[str, Any]:
        if self._spec_template is None:
            scratch = self.paths.specs / "template"
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
            keys.CRI_SANDBOX_ID: container_id(self.run_id, ref.pod_ref.format(), "sandbox"),
            keys.CRI_SANDBOX_NAME: ref.pod,
            keys.CRI_SANDBOX_NAMESPACE: ref.namespace,
            keys.CRI_SANDBOX_UID: pod_uid,
            keys.CRI_CONTAINER_NAME: ref.name,
            **(annotations or {}),
        }
        linux = spec["linux"]
        linux["cgroupsPath"] = f"/{self.cgroup_root}/pod{pod_uid}/{cid}"
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
        path = self.paths.specs / f"{cid}.json"
        path.write_text(json.dumps(spec))
        return path

    def _run(self, cid: str, ref: ContainerRef, pod_uid: str, spec: Path) -> None:
        """``ctr run --config`` through the spotgpu-runtime fast path, with the CRI labels."""
        assert self.shim is not None and ref.namespace is not None
        labels = {
            keys.LABEL_POD_NAME: ref.pod,
            keys.LABEL_POD_NAMESPACE: ref.namespace,
            keys.LABEL_POD_UID: pod_uid,
            keys.LABEL_CONTAINER_NAME: ref.name,
            keys.LABEL_CRI_KIND: keys.CRI_TYPE_CONTAINER,
        }
        argv = ["run", "-d", "--null-io", "--runtime", "io.containerd.runc.v2", "--runc-binary", str(self.shim),
                "--config", str(spec)]  # fmt: skip
        for key, value in labels.items():
            argv += ["--label", f"{key}={value}"]
        self.containerd.ctr(*argv, cid, namespace=CONTAINERD_NAMESPACE)

    def _put_pod(self, ref: ContainerRef, uid: str, requests: Mapping[str, int]) -> None:
        self.api.put({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": ref.pod, "namespace": ref.namespace, "uid": uid},
            "spec": {"nodeName": NODE, "containers": [{
                "name": ref.name,
                "image": IMAGE,
                "resources": {"requests": {k: str(v) for k, v in requests.items()},
                              "limits": {k: str(v) for k, v in requests.items()}},
            }]},
            "status": {"phase": "Pending"},
        })  # fmt: skip

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

    def _grant(self, ref: ContainerRef, resource: str, ids: Sequence[str]) -> None:
        devices = ContainerDevices(resource, tuple(ids), (0,))
        pod = PodResources(ref.namespace or "", ref.pod, (ContainerResources(ref.name, (devices,)),))
        self._pods[ref.pod_ref] = pod
        self.pod_resources.upsert_pod(pod)

    def _admit_owner(self) -> None:
        """The developer's pod: two GPUs, the guard's rule (spotgpu-runtime adds it), the client."""
        ref, gpus = OWNER, [gpu_id(i) for i in range(self.settings.gpus)]
        self._put_pod(ref, self.owner_uid, {NVIDIA_GPU_RESOURCE: len(gpus)})
        answer = self.kubelet.allocate(NVIDIA_GPU_RESOURCE, gpus).container_responses[0]
        self._grant(ref, NVIDIA_GPU_RESOURCE, gpus)
        self.owner = OwnerClient(self.paths.owner_io)
        spec = self._spec(
            self.owner_cid,
            ref,
            self.owner_uid,
            ["/bin/sh", "-c", "exec /bin/e2eclient </e2e/cmd >/e2e/out 2>&1"],
            env=dict(answer.envs),
            annotations=dict(answer.annotations),
            devices=[*_device_specs(answer), (str(self.paths.dev / "ctl"), CTL_PATH)],
            mounts=[*((m.container_path, m.host_path, m.read_only) for m in answer.mounts),
                    ("/e2e", str(self.paths.owner_io), False)],
        )  # fmt: skip
        self._run(self.owner_cid, ref, self.owner_uid, spec)
        self._pod_running(ref, self.owner_cid)
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

    def start_spot(self, name: str, index: int) -> Spot:
        """Start spot pod ``name`` on twin ``index`` (GPU ``index % gpus``): API pod, Allocate
        of the twin through the kubelet double, pod-resources grant, container through
        spotgpu-runtime with the Allocate annotation (device sync does the rest)."""
        gpu, replica = index % self.settings.gpus, index // self.settings.gpus
        twin = twin_of(gpu, replica, self.settings.replicas)
        ref = ContainerRef(SPOT_NAMESPACE, name, SPOT_CONTAINER)
        uid = str(uuid.uuid4())
        cid = container_id(self.run_id, ref.format(), uid)
        began = time.monotonic()
        self._put_pod(ref, uid, {SPOT_GPU_RESOURCE: 1})
        answer = self.kubelet.allocate(SPOT_GPU_RESOURCE, [twin]).container_responses[0]
        self._grant(ref, SPOT_GPU_RESOURCE, [twin])
        spec = self._spec(
            cid,
            ref,
            uid,
            ["/bin/sh", "-c", f"exec 3<>{gpu_path(gpu)}; exec sleep 1000000"],
            env=dict(answer.envs),
            annotations=dict(answer.annotations),
        )
        self._run(cid, ref, uid, spec)
        start_ms = (time.monotonic() - began) * 1000
        self._pod_running(ref, cid)
        return Spot(ref.pod_ref, uid, cid, gpu, twin, start_ms)

    def forget_pod(self, ref: PodRef) -> None:
        """The kubelet's part after a pod is gone: no more pod-resources rows."""
        self._pods.pop(ref, None)
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
        """Delete the container's (stopped) task and the container; returns the task's exit time
        (wall clock, seconds) that containerd recorded, None when there was no task."""
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


def remove_cgroup_tree(name: str, root: Path = Path("/sys/fs/cgroup")) -> None:
    """Remove the (empty) cgroup directories ``/<name>/...`` in every hierarchy: runc removes each
    container's own cgroup; the kubelet-style pod directories above them are the caller's."""
    tops = [root / name, *(d / name for d in root.iterdir() if d.is_dir() and not d.is_symlink())]
    for top in tops:
        if not top.is_dir():
            continue
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _device_specs(answer: dp.ContainerAllocateResponse) -> list[tuple[str, str]]:
    return [(d.host_path, d.container_path) for d in answer.devices]


def gpu_fds(pid: int, paths: Sequence[str]) -> list[str]:
    """The stand-in GPU device paths (as the process sees them) that ``pid`` holds open."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return []
    found = []
    for fd in fds:
        try:
            link = os.readlink(f"{fd_dir}/{fd}")
            if link not in paths:
                continue
            st = os.stat(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == STANDIN:
            found.append(link)
    return found


__all__ = [
    "CTL_PATH",
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
