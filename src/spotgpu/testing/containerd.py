"""A private containerd instance and busybox root filesystems, for tests and the node harness.

Side effects: starts and stops a ``containerd`` process whose root, state, socket and config
all live under one directory the caller owns; creates files and symlinks for root
filesystems and OCI bundles. Nothing touches the host's default containerd paths, so several
instances (several test runs) can coexist on one machine.

Needs root and the Debian packages ``containerd`` (with ``ctr`` and
``containerd-shim-runc-v2``), ``runc`` and ``busybox-static``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from spotgpu.core.errors import TemporaryError

BUSYBOX = Path("/bin/busybox")
BUSYBOX_APPLETS = (
    "sh",
    "sleep",
    "cat",
    "echo",
    "ls",
    "true",
    "false",
    "test",
    "env",
    "kill",
    "ps",
    "stat",
    "readlink",
    "grep",
    "touch",
    "mkdir",
    "rm",
    "head",
    "wc",
    "dd",
    "date",
    "id",
)


def make_rootfs(path: Path, extra_files: Iterable[tuple[Path, str]] = ()) -> Path:
    """A minimal root filesystem with static busybox and its common applets as symlinks.

    ``extra_files`` are (host file, path inside the rootfs) pairs copied in (e.g. a static
    test program). Returns ``path``.
    """
    if not BUSYBOX.exists():
        raise FileNotFoundError(f"{BUSYBOX} is missing (Debian package busybox-static)")
    for sub in ("bin", "proc", "sys", "dev", "tmp", "etc", "run", "var"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, path / "bin" / "busybox")
    for applet in BUSYBOX_APPLETS:
        link = path / "bin" / applet
        if not link.is_symlink():
            link.symlink_to("busybox")
    (path / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    (path / "etc" / "group").write_text("root:x:0:\n")
    for host_file, inside in extra_files:
        target = path / inside.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(host_file, target)
    return path


def make_bundle(
    bundle: Path,
    rootfs: Path,
    args: Sequence[str],
    *,
    env: Sequence[str] = ("PATH=/bin",),
    annotations: dict[str, str] | None = None,
    readonly_root: bool = True,
) -> Path:
    """An OCI bundle (``config.json`` from ``runc spec``, adjusted) whose root is ``rootfs``.

    Returns the path of ``config.json``.
    """
    bundle.mkdir(parents=True, exist_ok=True)
    config = bundle / "config.json"
    config.unlink(missing_ok=True)
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True, capture_output=True)
    spec = json.loads(config.read_text())
    spec["process"]["args"] = list(args)
    spec["process"]["env"] = list(env)
    spec["process"]["terminal"] = False
    spec["root"] = {"path": str(rootfs.resolve()), "readonly": readonly_root}
    if annotations:
        spec["annotations"] = dict(annotations)
    config.write_text(json.dumps(spec, indent=2))
    return config


_CONFIG = """version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{address}"

[ttrpc]
  address = "{address}.ttrpc"

[debug]
  level = "warn"
"""


class Containerd:
    """A containerd daemon with all its paths under ``base``; use as a context manager.

    The CRI plugin is disabled: tests create containers with ``ctr`` (``--rootfs`` directly, no
    images), and the Tasks/Containers gRPC API is the same one a Kubernetes node's containerd
    serves.
    """

    containerd_binary = "containerd"
    ctr_binary = "ctr"

    def __init__(self, base: Path) -> None:
        self.base = base
        self.address = str(base / "containerd.sock")
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = base / "containerd.log"

    def config(self) -> str:
        """The daemon's ``config.toml`` (subclasses: a CRI-enabled one)."""
        return _CONFIG.format(root=self.base / "root", state=self.base / "state", address=self.address)

    def environment(self) -> dict[str, str] | None:
        """The daemon's environment (None: inherit ours)."""
        return None

    # -- life cycle ------------------------------------------------------------------------
    def start(self, timeout: float = 20.0) -> Containerd:
        self.base.mkdir(parents=True, exist_ok=True)
        config = self.base / "config.toml"
        config.write_text(self.config())
        with self._log.open("ab") as log:
            self._proc = subprocess.Popen(
                [self.containerd_binary, "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.environment(),
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"containerd exited with {self._proc.returncode}: {self.log_tail()}")
            if os.path.exists(self.address) and self.ctr("version", check=False).returncode == 0:
                return self
            time.sleep(0.05)
        self.stop()
        raise TemporaryError(f"containerd did not come up within {timeout}s: {self.log_tail()}")

    @property
    def pid(self) -> int | None:
        """The daemon's PID while it runs (None when stopped or paused)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def stop(self) -> None:
        """Kill every task we created, stop containerd, and reap the shims it left behind."""
        if self._proc is not None and self._proc.poll() is None:
            for namespace in self.namespaces():
                self.remove_all(namespace)
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        self._kill_own_shims()

    def pause(self) -> None:
        """Stop the daemon process (SIGKILL) without touching running containers or shims."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> Containerd:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- ctr -------------------------------------------------------------------------------
    def ctr(
        self, *args: str, namespace: str = "default", check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``ctr`` against this instance; ``check`` raises with ctr's stderr on failure."""
        proc = subprocess.run(
            [self.ctr_binary, "--address", self.address, "--namespace", namespace, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def run_detached(
        self,
        container_id: str,
        rootfs: Path,
        args: Sequence[str],
        *,
        namespace: str = "default",
        runc_binary: str | None = None,
        env: Sequence[str] = ("PATH=/bin",),
        labels: dict[str, str] | None = None,
        devices: Sequence[str] = (),
        extra: Sequence[str] = (),
    ) -> None:
        """``ctr run -d --rootfs``: create and start a container running ``args``.

        ``ctr`` sets no ``PATH`` for a bare rootfs, hence the default ``env``.
        """
        cmd = ["run", "-d", "--rootfs", "--runtime", "io.containerd.runc.v2"]
        if runc_binary:
            cmd += ["--runc-binary", runc_binary]
        for item in env:
            cmd += ["--env", item]
        for key, value in (labels or {}).items():
            cmd += ["--label", f"{key}={value}"]
        for device in devices:
            cmd += ["--device", device]
        cmd += [*extra, str(rootfs), container_id, *args]
        self.ctr(*cmd, namespace=namespace)

    def namespaces(self) -> list[str]:
        proc = self.ctr("namespaces", "list", "-q", check=False)
        return [line.strip() for line in proc.stdout.splitlines() if line.strip()]

    def task_pids(self, namespace: str = "default") -> dict[str, int]:
        """Running tasks: container ID -> init PID (host namespace)."""
        proc = self.ctr("tasks", "list", namespace=namespace, check=False)
        result: dict[str, int] = {}
        for line in proc.stdout.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "RUNNING":
                result[parts[0]] = int(parts[1])
        return result

    def containers(self, namespace: str = "default") -> list[str]:
        proc = self.ctr("containers", "list", "-q", namespace=namespace, check=False)
        return [line.strip() for line in proc.stdout.splitlines() if line.strip()]

    def remove_all(self, namespace: str = "default") -> None:
        """Kill and delete every task and container of ``namespace`` (best effort)."""
        self.remove(self.containers(namespace), namespace)

    def remove(self, container_ids: Sequence[str], namespace: str = "default", *, workers: int = 1) -> None:
        """Kill and delete the tasks and containers ``container_ids`` (best effort), ``workers``
        ``ctr`` processes at a time."""

        def kill(cid: str) -> None:
            self.ctr("tasks", "kill", "-a", "-s", "SIGKILL", cid, namespace=namespace, check=False)

        def delete(cid: str) -> None:
            while time.monotonic() < deadline:
                proc = self.ctr("tasks", "delete", "-f", cid, namespace=namespace, check=False)
                if proc.returncode == 0 or "not found" in proc.stderr:
                    break
                time.sleep(0.05)
            self.ctr("containers", "delete", cid, namespace=namespace, check=False)

        with ThreadPoolExecutor(max(1, workers)) as pool:
            list(pool.map(kill, container_ids))
            deadline = time.monotonic() + 10
            list(pool.map(delete, container_ids))

    def _kill_own_shims(self) -> None:
        """Shims outlive containerd by design; kill the ones started for this instance's socket."""
        marker = self.address.encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmdline and marker in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)


__all__ = ["BUSYBOX", "Containerd", "make_bundle", "make_rootfs"]
