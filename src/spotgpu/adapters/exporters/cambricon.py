"""Cambricon mlu-exporter (protocols.md 7.2, confirmed): port 30108, metric prefix ``mlu``.

``mlu_utilization`` (%); boards by ``uuid`` (``MLU-...``) or the ``mlu`` index. Per-core
``mlu_core_utilization`` is the fallback (the busiest core counts).
"""

from spotgpu.adapters.exporters.base import ADAPTERS, GaugeAdapter, MetricSpec

ADAPTER = ADAPTERS.register(
    "cambricon",
    GaugeAdapter(
        "cambricon",
        (MetricSpec("mlu_utilization"), MetricSpec("mlu_core_utilization")),
        ident_labels=("uuid",),
        index_labels=("mlu",),
        default_port=30108,
    ),
)
