"""NVIDIA dcgm-exporter (protocols.md 7.1, confirmed): port 9400, ``/metrics``.

``DCGM_FI_DEV_GPU_UTIL`` is a percentage (preferred); ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` is a
0..1 ratio (used when the profiling counters are the only ones exported). Devices by ``UUID``
(``uuid`` with ``--use-old-namespace``) or the ``gpu`` index. Caveat (DESIGN.md): the pod
labels attribute a lent GPU's load to the owner; the agent ignores utilization while lent.
"""

from spotgpu.adapters.exporters.base import ADAPTERS, GaugeAdapter, MetricSpec

ADAPTER = ADAPTERS.register(
    "dcgm",
    GaugeAdapter(
        "dcgm",
        (MetricSpec("DCGM_FI_DEV_GPU_UTIL"), MetricSpec("DCGM_FI_PROF_GR_ENGINE_ACTIVE", scale=100.0)),
        ident_labels=("UUID", "uuid"),
        index_labels=("gpu",),
        default_port=9400,
    ),
)
