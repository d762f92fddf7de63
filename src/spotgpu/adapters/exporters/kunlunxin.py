"""Kunlunxin xpu-exporter (protocols.md 7.2, secondary sources only; often port 9507).

``node_xpu_utilization`` (%); the device labels are unconfirmed: ``uuid`` or ``serial`` as the
ID, ``minor``, ``xpu`` or ``id`` as the index are tried in that order.
"""

from spotgpu.adapters.exporters.base import ADAPTERS, GaugeAdapter, MetricSpec

ADAPTER = ADAPTERS.register(
    "kunlunxin",
    GaugeAdapter(
        "kunlunxin",
        (MetricSpec("node_xpu_utilization"),),
        ident_labels=("uuid", "serial"),
        index_labels=("minor", "xpu", "id"),
        default_port=9507,
        confirmed=False,
    ),
)
