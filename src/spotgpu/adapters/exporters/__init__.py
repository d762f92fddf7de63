"""Vendor GPU exporters: scrape Prometheus text over HTTP, convert to utilization per GPU.

One module per vendor (:mod:`.dcgm`, :mod:`.ascend`, :mod:`.cambricon`, :mod:`.amd`,
:mod:`.intel_xpu`, :mod:`.iluvatar`, :mod:`.enflame`, :mod:`.hygon`, :mod:`.metax`,
:mod:`.mthreads`, :mod:`.kunlunxin`), each registering a
:class:`~spotgpu.adapters.exporters.base.GpuAdapter` in
:data:`~spotgpu.adapters.exporters.base.ADAPTERS`; :func:`adapter` imports them all on first
use. A new vendor is one new module plus its name in :data:`VENDOR_MODULES`.

Decides nothing: the vendor modules map series to GPUs (pure); side effects (HTTP scrapes) are
in :mod:`.scrape`.
"""

from __future__ import annotations

import importlib

from spotgpu.adapters.exporters.base import ADAPTERS, GpuAdapter

VENDOR_MODULES = (
    "dcgm",
    "ascend",
    "cambricon",
    "amd",
    "intel_xpu",
    "iluvatar",
    "enflame",
    "hygon",
    "metax",
    "mthreads",
    "kunlunxin",
)


def load_adapters() -> tuple[str, ...]:
    """Import every vendor module (each registers itself once); returns the adapter names."""
    for module in VENDOR_MODULES:
        importlib.import_module(f"{__name__}.{module}")
    return ADAPTERS.names()


def adapter(name: str) -> GpuAdapter:
    load_adapters()
    return ADAPTERS.get(name)


__all__ = ["VENDOR_MODULES", "adapter", "load_adapters"]
