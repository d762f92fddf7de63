"""AMD device-metrics-exporter (protocols.md 7.2, confirmed): port 5000.

``gpu_gfx_activity`` (%, 0-100), also with the optional ``amd_`` metric prefix; GPUs by
``gpu_uuid`` (optional label) or the ``gpu_id`` index.
"""

from spotgpu.adapters.exporters.base import ADAPTERS, GaugeAdapter, MetricSpec

ADAPTER = ADAPTERS.register(
    "amd",
    GaugeAdapter(
        "amd",
        (MetricSpec("gpu_gfx_activity"), MetricSpec("amd_gpu_gfx_activity")),
        ident_labels=("gpu_uuid",),
        index_labels=("gpu_id",),
        default_port=5000,
    ),
)
