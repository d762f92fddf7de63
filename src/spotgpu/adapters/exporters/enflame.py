"""Enflame gcu-exporter (protocols.md 7.2, confirmed): port 9400 (collides with DCGM).

``enflame_gcu_usage`` (%; ``-1`` means unsupported and is a counted error, never 0 %); cards
by ``uuid`` (``GCU-...``) or the ``minor_number`` card index.
"""

from spotgpu.adapters.exporters.base import ADAPTERS, GaugeAdapter, MetricSpec

ADAPTER = ADAPTERS.register(
    "enflame",
    GaugeAdapter(
        "enflame",
        (MetricSpec("enflame_gcu_usage", unsupported=-1.0),),
        ident_labels=("uuid",),
        index_labels=("minor_number",),
        default_port=9400,
    ),
)
