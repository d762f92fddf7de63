"""Huawei Ascend npu-exporter (protocols.md 7.2, confirmed for the 2023 mirror): port 8082.

``npu_chip_info_utilization`` (AI core utilization, %); chips by ``vdie_id`` (die UUID) or the
``id`` chip index. Newer MindCluster builds add ``npu_chip_info_overall_utilization``, used
when the classic name is absent.
"""

from spotgpu.adapters.exporters.base import ADAPTERS, GaugeAdapter, MetricSpec

ADAPTER = ADAPTERS.register(
    "ascend",
    GaugeAdapter(
        "ascend",
        (MetricSpec("npu_chip_info_utilization"), MetricSpec("npu_chip_info_overall_utilization")),
        ident_labels=("vdie_id",),
        index_labels=("id",),
        default_port=8082,
    ),
)
