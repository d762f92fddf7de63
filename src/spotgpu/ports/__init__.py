"""The ports: Protocols and plain data through which the agent and spotgpu-runtime reach the
node, and which the adapters implement.

Decides nothing and has no side effects: each module is interfaces and frozen data only. It sits
below both the code that uses a port and the adapter that implements it, so neither imports the
other's package for a type (import-linter's layers contract keeps it that way):

* ``node``: what the agent asks of the node (GPU backends, container tasks, the kubelet's
  pod-resources view, the lending record), implemented in :mod:`spotgpu.adapters`;
* ``lookup``: what spotgpu-runtime's modifier chain asks of the node (device assignments,
  device plugins' answers, owners, host device nodes), implemented by
  :mod:`spotgpu.runtime.node` over :mod:`spotgpu.adapters.kubelet`.

Ports whose only implementations live above their user stay with it: the Kubernetes port in
:mod:`spotgpu.ports.kube`, the guard's in :mod:`spotgpu.ports.guard`.
"""
