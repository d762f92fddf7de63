"""MetaX mx-exporter (protocols.md 7.2, secondary sources only; port unconfirmed).

``mx_gpu_usage`` (%), or the bare ``gpu_usage`` a vendor page shows; GPUs by ``uuid``, or a
``gpu``/``deviceId`` index when present (unconfirmed label names).
"""

from spotgpu.adapters.exporters.base import ADAPTERS, GaugeAdapter, MetricSpec

ADAPTER = ADAPTERS.register(
    "metax",
    GaugeAdapter(
        "metax",
        (MetricSpec("mx_gpu_usage"), MetricSpec("gpu_usage")),
        ident_labels=("uuid",),
        index_labels=("gpu", "deviceId"),
        confirmed=False,
    ),
)
