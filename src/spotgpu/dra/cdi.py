"""CDI spec files: the claims' specs the driver writes, and the vendor's specs it looks up.

Side effects: files in one CDI spec directory (``/var/run/cdi`` by default; it must be one of
containerd's ``cdi_spec_dirs``). Writes go through :func:`spotgpu.util.fileio.write_atomic`: a
temporary file *in the same directory*, then a rename (containerd 2.2.7 watches the directory
with inotify; a file moved in from elsewhere is not seen: shared/reference/cdi-containerd22.md
section 4). A spec whose content is unchanged is not rewritten (each write makes containerd
rescan every spec). :meth:`CdiDir.vendor_device` finds the vendor's own CDI device for a real
GPU: a device named by the GPU's ID in a spec of the configured vendor kind (``nvidia.com/gpu``:
NVIDIA's generated specs name devices by UUID).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from spotgpu.util.fileio import write_atomic

log = logging.getLogger(__name__)


class CdiDir:
    def __init__(self, directory: Path, *, vendor_dirs: Sequence[Path] = (), vendor_kind: str | None = None) -> None:
        self.directory = directory
        self._vendor_dirs = tuple(vendor_dirs)
        self._vendor_kind = vendor_kind

    def write(self, file_name: str, spec: Mapping[str, Any]) -> Path:
        path = self.directory / file_name
        data = (json.dumps(spec, indent=1, sort_keys=True) + "\n").encode()
        with contextlib.suppress(OSError):
            if path.read_bytes() == data:
                return path
        write_atomic(path, data, mode=0o644, durable=True)
        return path

    def remove(self, file_name: str) -> None:
        (self.directory / file_name).unlink(missing_ok=True)

    def exists(self, file_name: str) -> bool:
        return (self.directory / file_name).is_file()

    def vendor_device(self, real: str) -> str | None:
        """``<vendor kind>=<real>`` when a vendor spec defines a device named ``real``; else None."""
        if self._vendor_kind is None:
            return None
        for directory in self._vendor_dirs:
            for path in sorted(directory.glob("*")):
                if path.suffix not in (".json", ".yaml") or not path.is_file():
                    continue
                try:
                    spec = yaml.safe_load(path.read_text())
                except (OSError, yaml.YAMLError) as exc:
                    log.warning("CDI spec %s unreadable: %s", path, exc)
                    continue
                if not isinstance(spec, dict) or spec.get("kind") != self._vendor_kind:
                    continue
                names = {d.get("name") for d in spec.get("devices") or () if isinstance(d, dict)}
                if real in names:
                    return f"{self._vendor_kind}={real}"
        return None


__all__ = ["CdiDir"]
