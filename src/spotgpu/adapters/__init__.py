"""Adapters: spotgpu's side of the node's wire protocols and devices.

Decides nothing: each module implements a port of :mod:`spotgpu.ports` (or serves an API the
kubelet calls) and turns wire messages into plain data and back. This is where the node-side
side effects are: ``deviceplugin`` (the kubelet device plugin API server and its registration),
``kubelet`` (the pod-resources and vendor device plugin clients), ``containerd`` (Tasks and
Containers over gRPC), ``reaper`` (pidfd-pinned SIGKILL), ``procattr`` (``/proc`` cgroup and
namespace reads), ``nvml`` and ``devnode_gpu`` (GPU backends), ``exporters`` (vendor exporters
scraped over HTTP), ``agent_state`` (the lending record file), ``agent_metrics`` (Prometheus
metrics and the agent's HTTP endpoint); ``proto`` holds our ``.proto`` files and the stubs
generated from them.

Layering (import-linter, ``pyproject.toml``): adapters import only the core, the ports and
:mod:`spotgpu.util`; never the agent or the runtime they serve.
"""
