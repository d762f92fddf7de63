"""Hygon DCU dcu-exporter (protocols.md 7.2): port 16080 (confirmed).

``dcu_utilizationrate`` (%; the name is from secondary sources); DCUs by ``device_id`` (the
serial) or the ``minor_number`` index.
"""

from spotgpu.adapters.exporters.base import ADAPTERS, GaugeAdapter, MetricSpec

ADAPTER = ADAPTERS.register(
    "hygon",
    GaugeAdapter(
        "hygon",
        (MetricSpec("dcu_utilizationrate"),),
        ident_labels=("device_id",),
        index_labels=("minor_number",),
        default_port=16080,
        confirmed=False,
    ),
)
