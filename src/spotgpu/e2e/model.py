"""What the node end-to-end run is made of: names, settings, the stand-in GPUs, one spot pod.

Pure apart from :func:`free_port` (binds a socket) and :func:`gpu_fds` (reads ``/proc``).
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from spotgpu.core import keys
from spotgpu.core.ids import DeviceID, NodeName, to_spot_id
from spotgpu.core.refs import ContainerRef, PodRef

NODE: Final = NodeName("e2e-node")
OWNER: Final = ContainerRef("team-a", "devbox", "main")
SPOT_NAMESPACE: Final = "spot-jobs"
SPOT_CONTAINER: Final = "worker"
CONTAINERD_NAMESPACE: Final = keys.CONTAINERD_K8S_NAMESPACE
STANDIN: Final = (1, 3)
"""Device numbers of the stand-in GPUs (``/dev/null``'s): every ioctl on them fails with ENOTTY."""
CTL_PATH: Final = "/dev/nvidiactl"
IMAGE: Final = "localhost/spotgpu-e2e/busybox:static"
"""The pods' image: through CRI a real image (busybox and the owner's client), imported into
containerd; with ``--ctr`` only a name (the containers run the harness's root filesystem)."""
CONTROL_CHAR_DEVICE = os.makedev(*STANDIN)

Launcher = Literal["cri", "ctr"]
Mode = Literal["wrapper", "nri"]


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
    launcher: Launcher = "cri"
    """``cri``: pods through the kubelet CRI double and containerd's CRI plugin; ``ctr``: ``ctr
    run`` (the earlier harness, kept as a benchmark baseline)."""
    containerd: str = "1.6"
    """``1.6`` (Debian's) or ``2.2`` (containerd 2.2.7); ``ctr`` runs on 1.6."""
    mode: Mode = "wrapper"
    """spotgpu-runtime as the ``spotgpu`` runtime handler, or the agent's NRI plugin (2.x)."""

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
    watched: tuple[int, ...] = ()
    """Its processes the exit watcher pinned (:class:`spotgpu.testing.exitwatch.ExitWatcher`)."""


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
    "CONTAINERD_NAMESPACE",
    "CONTROL_CHAR_DEVICE",
    "CTL_PATH",
    "IMAGE",
    "NODE",
    "OWNER",
    "SPOT_CONTAINER",
    "SPOT_NAMESPACE",
    "STANDIN",
    "Launcher",
    "Mode",
    "NodeSettings",
    "Paths",
    "Spot",
    "container_id",
    "free_port",
    "gpu_fds",
    "gpu_id",
    "gpu_path",
    "twin_of",
]
