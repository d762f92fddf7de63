"""Scraping vendor exporters over HTTP: the exporter :class:`~spotgpu.ports.node.UtilizationReader`.

Decides nothing. Side effects: HTTP GETs (standard library ``urllib``) to the configured
exporter URLs, one per detection cycle each. Parsing uses prometheus-client's maintained text
parser; conversion is the vendor's :class:`~spotgpu.adapters.exporters.base.GpuAdapter`.

Never raises for an exporter's failure: an unreachable exporter, unparsable text or odd
series are counted through ``on_error(source, kind, count)`` and the GPUs concerned read as
``None`` (unknown), which the detector treats as activity: no lending on missing data.
Error kinds: ``scrape``, ``parse`` and the conversion kinds of
:mod:`spotgpu.adapters.exporters.base`, plus ``unmatched`` (a GPU of ours without a series).
Several exporters: per GPU the largest known value wins.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from spotgpu.adapters.exporters import adapter as get_adapter
from spotgpu.adapters.exporters.base import ConvertResult, GpuAdapter, match_devices
from spotgpu.core.ids import DeviceID
from spotgpu.ports.node import GpuDevice

log = logging.getLogger(__name__)

ErrorSink = Callable[[str, str, int], None]

MAX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Exporter:
    vendor: str
    url: str
    timeout: float = 2.0


def fetch(url: str, timeout: float) -> str:
    """GET ``url``; raises ``OSError`` (or ``urllib.error.URLError``) on failure."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body: bytes = response.read(MAX_BYTES + 1)
    if len(body) > MAX_BYTES:
        raise OSError(f"{url}: response larger than {MAX_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


def convert_text(gpu_adapter: GpuAdapter, text: str) -> ConvertResult:
    """Parse Prometheus text and convert it; a parse failure raises ``ValueError``."""
    families = list(text_string_to_metric_families(text))
    return gpu_adapter.convert(families)


class ExporterUtilization:
    """Utilization from one or more vendor exporters (see module docstring)."""

    def __init__(self, exporters: Sequence[Exporter], on_error: ErrorSink | None = None) -> None:
        if not exporters:
            raise ValueError("at least one exporter is needed")
        self.exporters = [(e, get_adapter(e.vendor)) for e in exporters]
        self.name = "exporter:" + ",".join(e.vendor for e in exporters)
        self._on_error = on_error or (lambda source, kind, count: None)
        self.last_errors: list[tuple[str, str, str]] = []

    def _error(self, source: str, kind: str, message: str) -> None:
        self.last_errors.append((source, kind, message))
        self._on_error(source, kind, 1)

    def read(self, devices: Sequence[GpuDevice]) -> Mapping[DeviceID, float | None]:
        self.last_errors = []
        merged: dict[DeviceID, float | None] = {d.id: None for d in devices}
        keys = [(d.id, d.uuid, d.index) for d in devices]
        for exporter, gpu_adapter in self.exporters:
            source = exporter.vendor
            try:
                text = fetch(exporter.url, exporter.timeout)
            except (OSError, urllib.error.URLError, ValueError) as exc:
                self._error(source, "scrape", f"{exporter.url}: {exc}")
                log.warning("exporter %s at %s: scrape failed: %s", source, exporter.url, exc)
                continue
            try:
                result = convert_text(gpu_adapter, text)
            except Exception as exc:  # any defect of the text is a counted error, never a crash
                self._error(source, "parse", f"{exporter.url}: {exc}")
                log.warning("exporter %s at %s: text does not parse: %s", source, exporter.url, exc)
                continue
            for error in result.errors:
                self._error(source, error.kind, error.message)
                log.warning("exporter %s: %s", source, error.message)
            matched = match_devices(result.utilization, keys)
            for device_id, value in matched.items():
                if value is None:
                    if result.metric is not None:
                        self._error(source, "unmatched", f"no {result.metric} series for GPU {device_id}")
                    continue
                current = merged[DeviceID(device_id)]
                merged[DeviceID(device_id)] = value if current is None else max(current, value)
        return merged


__all__ = ["ErrorSink", "Exporter", "ExporterUtilization", "convert_text", "fetch"]
