"""Iluvatar ix-exporter (protocols.md 7.2, confirmed): port 32021.

``ix_gpu_utilization`` (%); GPUs by ``uuid`` (``GPU-...``) or the ``gpu`` index.
"""

from spotgpu.adapters.exporters.base import ADAPTERS, GaugeAdapter, MetricSpec

ADAPTER = ADAPTERS.register(
    "iluvatar",
    GaugeAdapter(
        "iluvatar",
        (MetricSpec("ix_gpu_utilization"),),
        ident_labels=("uuid",),
        index_labels=("gpu",),
        default_port=32021,
    ),
)
