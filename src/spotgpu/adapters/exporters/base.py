"""The GpuAdapter extension point: one vendor exporter's metric text -> utilization per GPU.

Pure conversion; no I/O (scraping is in :mod:`spotgpu.adapters.exporters.scrape`). Each vendor
module defines one :class:`GaugeAdapter` (metric names in order of preference, the labels
that identify a GPU, the unit) and registers it in :data:`ADAPTERS`.

Normalisation: every value becomes a percentage 0-100 (ratios are multiplied by 100).
Per GPU, several series (cores, tiles, engine groups, containers) are combined with ``max``:
the question is "is anything running on it". Defects never raise; each becomes a counted
:class:`ConvertError` of a fixed kind:

* ``missing_metric``: none of the adapter's metric names is in the text;
* ``no_device_label``: a series lacks every device-identifying label;
* ``bad_value``: NaN, infinite, negative or above 100 % after scaling;
* ``unsupported``: the vendor's "not supported" marker (Enflame's -1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.metrics_core import Metric

from spotgpu.core.registry import Registry


@dataclass(frozen=True, slots=True)
class DeviceKey:
    """How an exporter names a GPU: by a unique ID (UUID, serial) and/or an index."""

    ident: str | None = None
    index: int | None = None


@dataclass(frozen=True, slots=True)
class ConvertError:
    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class ConvertResult:
    utilization: Mapping[DeviceKey, float]
    metric: str | None
    """The metric name used (the first of the adapter's names present)."""
    errors: tuple[ConvertError, ...] = ()


class GpuAdapter(Protocol):
    """One vendor exporter's conversion (see module docstring)."""

    @property
    def name(self) -> str: ...

    @property
    def default_port(self) -> int | None: ...

    def convert(self, families: Iterable[Metric]) -> ConvertResult: ...


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One candidate metric: its name, the factor to percent, and a label filter."""

    name: str
    scale: float = 1.0
    """Multiply by this to get percent (100 for 0..1 ratios)."""
    where: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Only series whose label has one of these values (e.g. Intel's engine group ``type``)."""
    unsupported: float | None = None
    """A value meaning "not supported" (Enflame: -1)."""


@dataclass(frozen=True, slots=True)
class GaugeAdapter:
    """A :class:`GpuAdapter` for exporters with one utilization gauge per GPU (every vendor so far)."""

    name: str
    metrics: tuple[MetricSpec, ...]
    ident_labels: tuple[str, ...] = ()
    """Labels holding a unique device ID, in order of preference (e.g. ``UUID``, ``uuid``)."""
    index_labels: tuple[str, ...] = ()
    """Labels holding the device index."""
    default_port: int | None = None
    confirmed: bool = True
    """False when the metric or label names come from secondary sources only (protocols.md 7.2)."""

    def _key(self, labels: Mapping[str, str]) -> DeviceKey | None:
        ident = next((labels[k] for k in self.ident_labels if labels.get(k)), None)
        index = None
        for label in self.index_labels:
            raw = labels.get(label, "")
            if raw.isdigit():
                index = int(raw)
                break
        if ident is None and index is None:
            return None
        return DeviceKey(ident, index)

    def convert(self, families: Iterable[Metric]) -> ConvertResult:
        samples_by_name: dict[str, list[tuple[Mapping[str, str], float]]] = {}
        for family in families:
            for sample in family.samples:
                samples_by_name.setdefault(sample.name, []).append((sample.labels, sample.value))
        spec = next((m for m in self.metrics if m.name in samples_by_name), None)
        if spec is None:
            names = ", ".join(m.name for m in self.metrics)
            return ConvertResult({}, None, (ConvertError("missing_metric", f"{self.name}: no series of {names}"),))
        errors: list[ConvertError] = []
        values: dict[DeviceKey, float] = {}
        for labels, raw in samples_by_name[spec.name]:
            if any(labels.get(k) not in allowed for k, allowed in spec.where.items()):
                continue
            key = self._key(labels)
            if key is None:
                wanted = ", ".join((*self.ident_labels, *self.index_labels))
                errors.append(ConvertError("no_device_label", f"{spec.name}{dict(labels)} has none of {wanted}"))
                continue
            if spec.unsupported is not None and raw == spec.unsupported:
                errors.append(ConvertError("unsupported", f"{spec.name} of {key} is {raw:g} (not supported)"))
                continue
            value = raw * spec.scale
            if not math.isfinite(value) or value < 0 or value > 100.0001:
                errors.append(ConvertError("bad_value", f"{spec.name} of {key} is {raw!r} ({value!r} %)"))
                continue
            values[key] = max(values.get(key, 0.0), min(value, 100.0))
        return ConvertResult(values, spec.name, tuple(errors))


def match_devices(
    utilization: Mapping[DeviceKey, float], devices: Sequence[tuple[str, str | None, int]]
) -> dict[str, float | None]:
    """Map exporter keys to our devices ``(id, uuid, index)``: by ID/UUID first, else by index.

    A device without a series maps to ``None`` (unknown: never lent on a missing series).
    """
    by_ident: dict[str, float] = {}
    by_index: dict[int, float] = {}
    for key, value in utilization.items():
        if key.ident is not None:
            by_ident[key.ident] = max(by_ident.get(key.ident, 0.0), value)
        if key.index is not None:
            by_index[key.index] = max(by_index.get(key.index, 0.0), value)
    result: dict[str, float | None] = {}
    for device_id, uuid, index in devices:
        found = by_ident.get(device_id)
        if found is None and uuid is not None:
            found = by_ident.get(uuid)
        if found is None:
            found = by_index.get(index)
        result[device_id] = found
    return result


ADAPTERS: Registry[GpuAdapter] = Registry("GPU exporter adapter")
"""Every vendor adapter by name; filled by the vendor modules (see :func:`load_adapters`)."""


__all__ = [
    "ADAPTERS",
    "ConvertError",
    "ConvertResult",
    "DeviceKey",
    "GaugeAdapter",
    "GpuAdapter",
    "MetricSpec",
    "match_devices",
]
