"""Moore Threads (protocols.md 7.2, secondary sources only).

Their DCGM-compatible exporter serves ``DCGM_FI_DEV_GPU_UTIL`` (%) with ``UUID``/``gpu`` on
port 9400; ``mtgpu-exporter`` serves ``mtgpu_gpu_utilization`` (labels unconfirmed: ``uuid``
or a ``gpu`` index are tried).
"""

from spotgpu.adapters.exporters.base import ADAPTERS, GaugeAdapter, MetricSpec

ADAPTER = ADAPTERS.register(
    "mthreads",
    GaugeAdapter(
        "mthreads",
        (MetricSpec("DCGM_FI_DEV_GPU_UTIL"), MetricSpec("mtgpu_gpu_utilization")),
        ident_labels=("UUID", "uuid"),
        index_labels=("gpu",),
        default_port=9400,
        confirmed=False,
    ),
)
