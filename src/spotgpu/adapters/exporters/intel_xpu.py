"""Intel XPU Manager exporter (protocols.md 7.2, confirmed): port 30000.

``xpum_engine_group_ratio`` per engine group and tile is a 0..1 ratio (the % scaled by 0.01);
the busiest of the ``compute``, ``render`` and ``3d`` groups counts, falling back to
``xpum_engine_ratio``. GPUs by ``uuid``; the ``card`` label is not the device index on every
system, so only the UUID is used.
"""

from spotgpu.adapters.exporters.base import ADAPTERS, GaugeAdapter, MetricSpec

ADAPTER = ADAPTERS.register(
    "intel-xpu",
    GaugeAdapter(
        "intel-xpu",
        (
            MetricSpec("xpum_engine_group_ratio", scale=100.0, where={"type": ("compute", "render", "3d")}),
            MetricSpec("xpum_engine_ratio", scale=100.0),
        ),
        ident_labels=("uuid",),
        default_port=30000,
    ),
)
