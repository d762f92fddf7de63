"""spotgpu-runtime: the OCI runtime wrapper between containerd's runc shim and runc.

Kept empty on purpose: the per-call wrapper imports this package on every container creation
it handles, so nothing may be imported here. Map of the package (docs/runtime.md):

* host side, per call: :mod:`.shim` (the POSIX-sh fast path and its installer),
  :mod:`.wrapper` (stdlib-only Python for ``create``), :mod:`.argv`, :mod:`.protocol`;
* agent side: :mod:`.service` (unix-socket server), :mod:`.engine` (``SpecEngine.modify``: the
  one entry point of every decision), :mod:`.sanitize` (runs before the chain on every spec),
  :mod:`.modifiers` (Devices, ReplaceMounts, Generic, CPUSet, GuardRule), :mod:`.providers`
  (ContainerSync, PodSync, Direct), :mod:`.sync` (resolution and the security rule),
  :mod:`.lookup` (ports), :mod:`.node` (kubelet and host adapters), :mod:`.config`;
* fallback: :mod:`.local` and :mod:`.ownerstate`.
"""
