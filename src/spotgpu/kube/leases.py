"""Leases and idle forecasts as the scheduler reads them from API objects.

Pure: annotation text in, typed values (or counted reasons they were ignored) out; no I/O.
:func:`parse_idle_forecast` reads the agent's ``spotgpu.io/idle-forecast`` node annotation;
:func:`pod_lease` a lone pod's ``spotgpu.io/min-lease``/``spotgpu.io/checkpoint-interval``.
Used by :mod:`spotgpu.kube.snapshot`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from spotgpu.core import keys
from spotgpu.core.configfile import parse_duration
from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import DeviceID, from_spot_id
from spotgpu.kube.resources import ObjectError
from spotgpu.scheduler.model import MAX_FORECAST_S, IdleForecast

MAX_FORECAST_ANNOTATION: Final = 64 * 1024
"""An idle-forecast annotation longer than this is ignored whole (an agent writes ~60 bytes per GPU)."""


@dataclass(slots=True)
class IgnoredForecasts:
    """What :func:`parse_idle_forecast` left out: how many entries, and the first few reasons."""

    count: int = 0
    reasons: list[str] = field(default_factory=list)

    def add(self, reason: str, count: int = 1) -> None:
        self.count += count
        if len(self.reasons) < 3:
            self.reasons.append(reason)

    def __bool__(self) -> bool:
        return self.count > 0

    def reason(self) -> str:
        more = f" (and {self.count - len(self.reasons)} more)" if self.count > len(self.reasons) else ""
        return f"{self.count} entries of {keys.NODE_IDLE_FORECAST} ignored: {'; '.join(self.reasons)}{more}"


def parse_idle_forecast(
    node: str, text: str | None, devices: Mapping[DeviceID, object]
) -> tuple[dict[DeviceID, IdleForecast], IgnoredForecasts]:
    """The agent's ``spotgpu.io/idle-forecast`` for ``node``: real device ID -> forecast.

    Hostile input is ignored entry by entry and counted, never raised: text that is not a JSON
    object (or longer than :data:`MAX_FORECAST_ANNOTATION`), keys that are not twin IDs of this
    node's GPUs (``spot-<id>`` of a device in ``devices``), values that are not objects with
    whole-second ``expected`` and ``p20`` in ``0..MAX_FORECAST_S``. An ignored entry leaves its GPU
    without a forecast, which the scheduler treats as unknown: the least attractive a lent GPU can
    be (it covers no minimum lease), so bad input never makes a GPU more attractive.
    """
    ignored = IgnoredForecasts()
    if text is None:
        return {}, ignored
    if not isinstance(text, str) or len(text) > MAX_FORECAST_ANNOTATION:
        ignored.add(f"the annotation is not a string of at most {MAX_FORECAST_ANNOTATION} characters")
        return {}, ignored
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        ignored.add("the annotation is not a JSON object")
        return {}, ignored
    out: dict[DeviceID, IdleForecast] = {}
    for twin, entry in data.items():
        problem = _forecast_problem(twin, entry, devices)
        if isinstance(problem, str):
            ignored.add(f"{str(twin)[:80]!r}: {problem}")
        else:
            out[problem[0]] = problem[1]
    return out, ignored


def _forecast_problem(
    twin: str, entry: object, devices: Mapping[DeviceID, object]
) -> str | tuple[DeviceID, IdleForecast]:
    """The parsed entry, or why it is ignored."""
    try:
        device = from_spot_id(twin)
    except ValidationError:
        return "not a twin ID (spot-<device>)"
    if device not in devices:
        return "no such GPU on this node"
    if not isinstance(entry, dict):
        return "not an object"
    expected, p20 = entry.get("expected"), entry.get("p20")
    for name, value in (("expected", expected), ("p20", p20)):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{name} is not whole seconds"
        if not 0 <= value <= MAX_FORECAST_S:
            return f"{name} {value} is outside 0..{MAX_FORECAST_S}"
    assert isinstance(expected, int) and isinstance(p20, int)
    return device, IdleForecast(expected, p20)


def pod_lease(annotations: Mapping[str, Any], where: str) -> tuple[float, float]:
    """(minLease, checkpointInterval) in seconds from a lone pod's annotations (0 when absent).

    For pods without a PodGroup (a gang's come from its PodGroup's spec). A malformed or negative
    value raises :class:`~spotgpu.kube.resources.ObjectError` naming the pod and the annotation."""
    out = []
    for key in (keys.MIN_LEASE, keys.CHECKPOINT_INTERVAL):
        raw = annotations.get(key)
        if raw is None:
            out.append(0.0)
            continue
        try:
            out.append(float(parse_duration(raw, f"annotation {key}")))
        except ValidationError as exc:
            raise ObjectError(f"{where}: {exc}") from None
    return out[0], out[1]


__all__ = ["MAX_FORECAST_ANNOTATION", "IgnoredForecasts", "parse_idle_forecast", "pod_lease"]
