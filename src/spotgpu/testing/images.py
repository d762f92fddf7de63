"""Container images without a registry: a pause image and a busybox image, as tarballs.

Side effects: compiles a static C program (the pause binary) and writes image tarballs into a
directory the caller owns; :func:`import_image` runs ``ctr images import``. Nothing is pulled:
a CRI runtime on a test machine (no network) finds both images in its ``k8s.io`` namespace.

Each tarball is an OCI image layout (``oci-layout``, ``index.json`` whose manifest carries the
``io.containerd.image.name`` and ``org.opencontainers.image.ref.name`` annotations,
``blobs/sha256/``) plus a docker-style ``manifest.json``, with one uncompressed layer. Layers
are written with fixed metadata (mtime 0, root owner), so the same content gives the same
digests: importing twice is a no-op.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import shutil
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from spotgpu.testing.cbuild import compile_static
from spotgpu.testing.containerd import BUSYBOX, BUSYBOX_APPLETS

PAUSE_IMAGE: Final = "localhost/spotgpu-test/pause:static"
BUSYBOX_IMAGE: Final = "localhost/spotgpu-test/busybox:static"

_PAUSE_SOURCE: Final = r"""
/* The pod sandbox's process: sleeps until SIGTERM or SIGINT, reaps every child. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stop;
    sigaction(SIGINT, &sa, 0);
    sigaction(SIGTERM, &sa, 0);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, 0);
    for (;;) pause();
}
"""

_ARCH: Final = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}
OCI_MANIFEST: Final = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG: Final = "application/vnd.oci.image.config.v1+json"
OCI_LAYER: Final = "application/vnd.oci.image.layer.v1.tar"


@dataclass(frozen=True, slots=True)
class Entry:
    """One file of a layer: a regular file (``source``), a directory or a symlink (``link``)."""

    path: str
    source: Path | None = None
    link: str | None = None
    mode: int = 0o755
    data: bytes | None = None


def _layer(entries: Iterable[Entry]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.path.lstrip("/"))
            info.mtime, info.uid, info.gid, info.mode = 0, 0, 0, entry.mode
            if entry.link is not None:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.link, 0o777
                tar.addfile(info)
            elif entry.source is not None or entry.data is not None:
                data = entry.data if entry.data is not None else entry.source.read_bytes()  # type: ignore[union-attr]
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
    return out.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_image(tarball: Path, name: str, entries: Sequence[Entry], config: dict[str, Any]) -> Path:
    """An image tarball of one layer with ``entries``; ``config`` is the image config's ``config``
    (Entrypoint, Cmd, Env, WorkingDir). Returns ``tarball``."""
    layer = _layer(entries)
    image_config = json.dumps(
        {
            "architecture": _ARCH.get(platform.machine(), platform.machine()),
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": _digest(image_config), "size": len(image_config)},
            "layers": [{"mediaType": OCI_LAYER, "digest": _digest(layer), "size": len(layer)}],
        },
        sort_keys=True,
    ).encode()
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": OCI_MANIFEST,
                "digest": _digest(manifest),
                "size": len(manifest),
                "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    blobs = {_digest(b).split(":")[1]: b for b in (layer, image_config, manifest)}
    docker = [
        {
            "Config": f"blobs/sha256/{_digest(image_config).split(':')[1]}",
            "RepoTags": [name],
            "Layers": [f"blobs/sha256/{_digest(layer).split(':')[1]}"],
        }
    ]
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
        "manifest.json": json.dumps(docker).encode(),
        **{f"blobs/sha256/{h}": b for h, b in blobs.items()},
    }
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, "w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return tarball


def pause_image(directory: Path) -> Path:
    """The pause image tarball (``gcc -static`` of a sleep-and-reap program) in ``directory``."""
    binary = compile_static(_PAUSE_SOURCE, directory / "pause-build", "pause")
    return write_image(
        directory / "pause.tar",
        PAUSE_IMAGE,
        [Entry("/pause", binary)],
        {"Entrypoint": ["/pause"], "WorkingDir": "/"},
    )


def busybox_entries(extra_files: Iterable[tuple[Path, str]] = ()) -> list[Entry]:
    """The busybox root filesystem (static /bin/busybox and its applets) as layer entries."""
    if not BUSYBOX.exists():
        raise FileNotFoundError(f"{BUSYBOX} is missing (Debian package busybox-static)")
    entries = [Entry(f"/{d}") for d in ("bin", "proc", "sys", "dev", "tmp", "etc", "run", "var")]
    entries.append(Entry("/bin/busybox", BUSYBOX))
    entries += [Entry(f"/bin/{applet}", link="busybox") for applet in BUSYBOX_APPLETS]
    entries.append(Entry("/etc/passwd", data=b"root:x:0:0:root:/:/bin/sh\n", mode=0o644))
    entries.append(Entry("/etc/group", data=b"root:x:0:\n", mode=0o644))
    parents: set[str] = set()
    for host_file, inside in extra_files:
        parent = str(Path(inside).parent)
        if parent not in ("/", "/bin", "/etc") and parent not in parents:
            parents.add(parent)
            entries.append(Entry(parent))
        entries.append(Entry(inside, host_file))
    return entries


def busybox_image(directory: Path, extra_files: Iterable[tuple[Path, str]] = (), name: str = BUSYBOX_IMAGE) -> Path:
    """A busybox image tarball (``/bin/sh`` and the common applets, ``PATH=/bin``)."""
    return write_image(
        directory / f"{name.rsplit('/', 1)[-1].replace(':', '-')}.tar",
        name,
        busybox_entries(extra_files),
        {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"], "WorkingDir": "/"},
    )


def import_image(ctr: str, address: str, tarball: Path, namespace: str = "k8s.io") -> None:
    """``ctr images import`` into ``namespace`` (unpacked for the default snapshotter)."""
    if shutil.which(ctr) is None and not Path(ctr).exists():
        raise FileNotFoundError(f"{ctr} not found")
    proc = subprocess.run(
        [ctr, "--address", address, "--namespace", namespace, "images", "import", str(tarball)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ctr images import {tarball.name} failed: {proc.stderr.strip()}")


__all__ = [
    "BUSYBOX_IMAGE",
    "PAUSE_IMAGE",
    "Entry",
    "busybox_entries",
    "busybox_image",
    "import_image",
    "pause_image",
    "write_image",
]
