"""A private containerd with its CRI plugin on, configured from the shipped snippets.

Side effects: writes ``config.toml`` under a directory the caller owns, starts and stops the
``containerd`` daemon (Debian's 1.6 or the 2.2.7 build in ``../shared/bin``), imports the
pause and busybox images; may copy the 2.2.7 binaries into a private folder to give them
their run bit.

The configuration is three layers, merged key by key (later wins):

1. a base with everything private to this instance and what this host needs
   (shared/reference/cri-nri.md): root, state, sockets, the ``opt`` path, an empty CNI
   folder, ``restrict_oom_score_adj`` (no CAP_SYS_RESOURCE here), the pinned pause image,
   ``overlayfs``, CDI spec folders, and on 2.x the NRI socket;
2. the shipped snippets from ``deploy/containerd/`` exactly as an operator merges them;
3. host facts: for every runtime handler, a private runc ``Root``, ``SystemdCgroup = false``
   (no systemd here), on 2.x ``runtime_path`` (2.x would find Debian's 1.6 shim on PATH
   first), and ``BinaryName`` where the snippet names spotgpu-runtime's install path (the
   path of the shim this test installed); the NRI default validator turned off only where a
   test asks (``CriSettings.nri_validator``). :func:`overrides` lists them; nothing else of a
   snippet is changed, so a wrong snippet fails the tests that use it.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from spotgpu.testing.containerd import Containerd
from spotgpu.testing.images import PAUSE_IMAGE, import_image

Version = Literal["1.6", "2.2"]
ENV_CONTAINERD22: Final = "SPOTGPU_CONTAINERD22"
"""Folder with containerd 2.2.7's ``containerd``, ``containerd-shim-runc-v2`` and ``ctr``."""
DEFAULT_CONTAINERD22: Final = Path("../shared/bin/containerd-2.2.7")
"""Relative to the repository root."""
SPOTGPU_RUNTIME_PATH: Final = "/usr/local/lib/spotgpu/spotgpu-runtime"
"""The BinaryName the shipped snippets name (replaced by the test's installed shim)."""
CRI_V1: Final = "io.containerd.grpc.v1.cri"
CRI_V2_RUNTIME: Final = "io.containerd.cri.v1.runtime"
CRI_V2_IMAGES: Final = "io.containerd.cri.v1.images"
NRI_V2: Final = "io.containerd.nri.v1.nri"


def repo_root() -> Path:
    """The source checkout this package was installed from (editable install, ``src/`` layout)."""
    return Path(__file__).resolve().parents[3]


def snippet_dir() -> Path:
    return repo_root() / "deploy" / "containerd"


@dataclass(frozen=True, slots=True)
class Binaries:
    """One containerd build: the daemon, its runc shim, ``ctr``."""

    version: Version
    containerd: str
    shim: str
    ctr: str

    @property
    def folder(self) -> str | None:
        """The folder to put first on PATH (None: the system's)."""
        return str(Path(self.containerd).parent) if os.sep in self.containerd else None


def _runnable(folder: Path) -> Path:
    """``folder`` if its binaries can run, else a private copy with the run bit set."""
    names = ("containerd", "containerd-shim-runc-v2", "ctr")
    if all(os.access(folder / n, os.X_OK) for n in names):
        return folder
    copy_dir = Path(tempfile.mkdtemp(prefix="spotgpu-containerd22-"))
    for name in names:
        shutil.copy2(folder / name, copy_dir / name)
        (copy_dir / name).chmod(0o755)
    return copy_dir


def containerd22_folder() -> Path | None:
    """Where containerd 2.2.7 is: ``$SPOTGPU_CONTAINERD22``, else ``../shared/bin/containerd-2.2.7``
    from the repository root when it exists; None when neither is there."""
    configured = os.environ.get(ENV_CONTAINERD22)
    folder = Path(configured) if configured else repo_root() / DEFAULT_CONTAINERD22
    return folder.resolve() if (folder / "containerd").exists() else None


def binaries(version: Version) -> Binaries:
    """The binaries of ``version`` (1.6: Debian's on PATH); FileNotFoundError when absent."""
    if version == "1.6":
        found = [shutil.which(n) for n in ("containerd", "containerd-shim-runc-v2", "ctr")]
        if None in found:
            raise FileNotFoundError("containerd 1.6 (Debian package containerd) is not installed")
        return Binaries("1.6", "containerd", "containerd-shim-runc-v2", "ctr")
    folder = containerd22_folder()
    if folder is None:
        raise FileNotFoundError(f"containerd 2.2.7 not found (set ${ENV_CONTAINERD22} or add {DEFAULT_CONTAINERD22})")
    folder = _runnable(folder)
    return Binaries("2.2", str(folder / "containerd"), str(folder / "containerd-shim-runc-v2"), str(folder / "ctr"))


# --- TOML ------------------------------------------------------------------------------------

_BARE: Final = re.compile(r"[A-Za-z0-9_-]+")


def _key(key: str) -> str:
    return key if _BARE.fullmatch(key) else '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def dumps_toml(data: Mapping[str, Any]) -> str:
    """Nested tables of strings, numbers, booleans and lists as TOML (enough for containerd)."""
    lines: list[str] = []

    def table(path: list[str], items: Mapping[str, Any]) -> None:
        scalars = [(k, v) for k, v in items.items() if not isinstance(v, Mapping)]
        tables = [(k, v) for k, v in items.items() if isinstance(v, Mapping)]
        if path and (scalars or not tables):
            lines.append("")
            lines.append("[" + ".".join(_key(p) for p in path) + "]")
        lines.extend(f"{_key(k)} = {_value(v)}" for k, v in scalars)
        for k, v in tables:
            table([*path, k], v)

    table([], data)
    return "\n".join(lines).lstrip("\n") + "\n"


def merge(base: dict[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
    """``layer`` merged into a copy of ``base``, table by table (scalars and lists replaced)."""
    out = copy.deepcopy(base)
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# --- the configuration -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CriSettings:
    """What a CRI test instance needs besides its binaries."""

    snippets: tuple[Path, ...] = ()
    """Shipped snippets to merge (``deploy/containerd/*.toml``), in order."""
    spotgpu_runtime: str | None = None
    """The installed spotgpu-runtime shim that replaces the snippets' BinaryName."""
    nri: bool = False
    """2.x: leave NRI on with a private socket (``<base>/nri.sock``); off otherwise."""
    nri_request_timeout: str = "2s"
    nri_validator: bool = True
    """False: turn the shipped snippet's NRI default validator off (a test of the fail-open
    behaviour a node without it has); True: keep the snippet's table as it is."""
    cdi_dirs: tuple[str, ...] = ()


def _runtime_table(config: dict[str, Any], version: Version) -> dict[str, Any]:
    plugins = config.setdefault("plugins", {})
    if version == "1.6":
        return plugins.setdefault(CRI_V1, {}).setdefault("containerd", {})  # type: ignore[no-any-return]
    return plugins.setdefault(CRI_V2_RUNTIME, {}).setdefault("containerd", {})  # type: ignore[no-any-return]


def base_config(base: Path, version: Version, binaries: Binaries, settings: CriSettings) -> dict[str, Any]:
    """Layer 1 (module docstring)."""
    (base / "cni").mkdir(parents=True, exist_ok=True)
    runc = {"runtime_type": "io.containerd.runc.v2", "options": {}}
    config: dict[str, Any] = {
        "version": 2 if version == "1.6" else 3,
        "root": str(base / "root"),
        "state": str(base / "state"),
        "grpc": {"address": str(base / "containerd.sock")},
        "ttrpc": {"address": str(base / "containerd.sock.ttrpc")},
        "debug": {"level": "warn"},
        "plugins": {"io.containerd.internal.v1.opt": {"path": str(base / "opt")}},
    }
    cni = {"conf_dir": str(base / "cni")}
    if version == "1.6":
        config["plugins"][CRI_V1] = {
            "sandbox_image": PAUSE_IMAGE,
            "restrict_oom_score_adj": True,
            "stream_server_address": "127.0.0.1",
            "enable_cdi": bool(settings.cdi_dirs),
            "cdi_spec_dirs": list(settings.cdi_dirs),
            "cni": {**cni, "bin_dir": str(base / "cni")},
            "containerd": {"snapshotter": "overlayfs", "default_runtime_name": "runc", "runtimes": {"runc": runc}},
        }
        return config
    config["plugins"][CRI_V2_IMAGES] = {"snapshotter": "overlayfs", "pinned_images": {"sandbox": PAUSE_IMAGE}}
    config["plugins"][CRI_V2_RUNTIME] = {
        "restrict_oom_score_adj": True,
        "enable_cdi": True,
        "cdi_spec_dirs": list(settings.cdi_dirs) or [str(base / "cdi")],
        "cni": {**cni, "bin_dirs": [str(base / "cni")]},
        "containerd": {"default_runtime_name": "runc", "runtimes": {"runc": runc}},
    }
    config["plugins"]["io.containerd.grpc.v1.cri"] = {"stream_server_address": "127.0.0.1"}
    config["plugins"][NRI_V2] = {
        "disable": not settings.nri,
        "socket_path": str(base / "nri.sock"),
        "plugin_path": str(base / "nri-plugins"),
        "plugin_config_path": str(base / "nri-conf"),
        "plugin_registration_timeout": "5s",
        "plugin_request_timeout": settings.nri_request_timeout,
    }
    return config


def overrides(config: dict[str, Any], base: Path, binaries: Binaries, settings: CriSettings) -> list[str]:
    """Layer 3 (module docstring), in place; returns the overridden keys, for the record."""
    changed: list[str] = []
    runtimes = _runtime_table(config, binaries.version).get("runtimes", {})
    for name, runtime in runtimes.items():
        options = runtime.setdefault("options", {})
        options["Root"] = str(base / "runc-root")
        options["SystemdCgroup"] = False
        changed += [f"runtimes.{name}.options.Root", f"runtimes.{name}.options.SystemdCgroup"]
        if binaries.version != "1.6":
            runtime["runtime_path"] = binaries.shim
            changed.append(f"runtimes.{name}.runtime_path")
        if options.get("BinaryName") == SPOTGPU_RUNTIME_PATH:
            if settings.spotgpu_runtime is None:
                raise ValueError(f"snippet names {SPOTGPU_RUNTIME_PATH} for {name}; no installed shim given")
            options["BinaryName"] = settings.spotgpu_runtime
            changed.append(f"runtimes.{name}.options.BinaryName")
    nri = config.get("plugins", {}).get(NRI_V2)
    if isinstance(nri, dict) and binaries.version != "1.6":
        nri["socket_path"] = str(base / "nri.sock")
        changed.append("nri.socket_path")
        if not settings.nri_validator and "default_validator" in nri:
            nri["default_validator"]["enable"] = False
            changed.append("nri.default_validator.enable")
    return changed


def compose(base: Path, binaries: Binaries, settings: CriSettings) -> tuple[dict[str, Any], list[str]]:
    """The whole configuration (three layers) and the keys layer 3 set."""
    config = base_config(base, binaries.version, binaries, settings)
    wanted = 2 if binaries.version == "1.6" else 3
    for snippet in settings.snippets:
        layer = tomllib.loads(snippet.read_text())
        if layer.get("version") != wanted:
            raise ValueError(
                f"{snippet.name} is config version {layer.get('version')}; containerd {binaries.version} needs {wanted}"
            )
        config = merge(config, layer)
    changed = overrides(config, base, binaries, settings)
    return config, changed


class CriContainerd(Containerd):
    """A containerd of ``binaries.version`` with CRI, configured by :func:`compose`; pause and
    busybox images imported into ``k8s.io`` at start (``images``: tarballs)."""

    def __init__(self, base: Path, binaries: Binaries, settings: CriSettings, images: Sequence[Path] = ()) -> None:
        super().__init__(base)
        self.binaries = binaries
        self.settings = settings
        self.images = tuple(images)
        self.containerd_binary = binaries.containerd
        self.ctr_binary = binaries.ctr
        self.overridden: list[str] = []
        self._imported = False

    @property
    def nri_socket(self) -> Path:
        return self.base / "nri.sock"

    def config(self) -> str:
        config, self.overridden = compose(self.base, self.binaries, self.settings)
        return dumps_toml(config)

    def environment(self) -> dict[str, str] | None:
        folder = self.binaries.folder
        if folder is None:
            return None
        return {**os.environ, "PATH": f"{folder}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    def start(self, timeout: float = 30.0) -> CriContainerd:
        super().start(timeout)
        if not self._imported:
            for tarball in self.images:
                import_image(self.ctr_binary, self.address, tarball)
            self._imported = True
        return self

    def namespaces(self) -> list[str]:
        return ["k8s.io", *(n for n in super().namespaces() if n != "k8s.io")]


__all__ = [
    "DEFAULT_CONTAINERD22",
    "ENV_CONTAINERD22",
    "SPOTGPU_RUNTIME_PATH",
    "Binaries",
    "CriContainerd",
    "CriSettings",
    "Version",
    "base_config",
    "binaries",
    "compose",
    "containerd22_folder",
    "dumps_toml",
    "merge",
    "overrides",
    "repo_root",
    "snippet_dir",
]
