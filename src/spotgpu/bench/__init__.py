"""``spotgpu bench <name>``: the benchmarks, one module each, each printing one JSON object.

Decides nothing. Side effects: whatever a benchmark measures on (a synthetic snapshot in
memory for ``scheduler``; private containerd instances, runc containers, stand-in GPU device
nodes and the guard's fd holder for ``agent``, ``runtime`` and ``guard``, all under temporary
directories removed at the end). Uses :mod:`spotgpu.testing`; not part of the production image
(``deploy/Dockerfile``), and nothing in production imports it (import-linter).
"""
