"""spotgpu-runtime: the OCI runtime wrapper between containerd's runc shim and runc.

Kept empty on purpose: the per-call wrapper imports this package on every container creation
it handles, so nothing may be imported here.

Decides how a container's OCI spec must change (:class:`~spotgpu.runtime.engine.SpecEngine`
and its modifier chain, pure given the node lookups), and refuses a spec that breaks a rule.
Side effects: the wrapper (rewrites ``config.json``, execs the lower runtime), the service's
unix socket, the shim installer, the node adapters (kubelet gRPC, ``stat`` of device nodes) and
the ``local`` fallback's owner record. Map of the package (docs/runtime.md):

* host side, per call: :mod:`.shim` (the POSIX-sh fast path and its installer),
  :mod:`.wrapper` (stdlib-only Python for ``create``), :mod:`.argv`, :mod:`.protocol`;
* agent side: :mod:`.service` (unix-socket server), :mod:`.engine` (``SpecEngine.modify``: the
  one entry point of every decision), :mod:`.sanitize` (runs before the chain on every spec),
  :mod:`.modifiers` (Devices, ReplaceMounts, Generic, CPUSet, GuardRule), :mod:`.providers`
  (ContainerSync, PodSync, Direct), :mod:`.sync` (resolution and the security rule),
  :mod:`.node` (kubelet and host adapters of the ports in :mod:`spotgpu.ports.lookup`), :mod:`.config`;
* fallback: :mod:`.local` and :mod:`.ownerstate`.
"""
