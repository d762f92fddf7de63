"""spotgpu: lend idle reserved GPUs to preemptible spot jobs, and take them back before the owner notices.

Packages (see docs/architecture.md):

* :mod:`spotgpu.core`: the shared model (IDs, references, the device-sync annotation codec,
  MappingCache, the lending state machine and owner-return model, configuration). Pure.
* :mod:`spotgpu.scheduler`: gang scheduling with the spot plugin. Pure decision core.
* :mod:`spotgpu.agent`: the node agent (device plugin, detection, lending, eviction).
* :mod:`spotgpu.guard`: the return guard (seccomp user notification).
* :mod:`spotgpu.runtime`: ``spotgpu-runtime``, the OCI runtime wrapper.
* :mod:`spotgpu.sim`: the cluster simulator behind ``spotgpu simulate``.
* :mod:`spotgpu.kube`: Kubernetes control loops and client layer.
* :mod:`spotgpu.adapters`: the I/O edges (gRPC stubs, containerd, NVML, exporters).
"""

__version__ = "0.1.0"
