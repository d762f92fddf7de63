"""The node agent: spot-gpu device plugin, idle/return detection, lending, eviction, metrics, recovery.

What it decides, in pure modules (plain data in, decisions out; an import-linter contract keeps
adapters, gRPC, protobuf, Prometheus and NVML out of them): ``model`` (the MappingCache from the
kubelet's view, twin health, eviction plans, whether Allocate gives a twin), ``steer`` (which
twins GetPreferredAllocation and Allocate give, exclusive and shared use kept apart),
``detect`` (one activity sample per owner), ``settings`` and ``ports``. When an owner is lent or
evicted is :mod:`spotgpu.core.lending`'s decision, the same one the simulator runs.

Where the side effects are: ``solver`` coordinates and its executors act (``allocator``,
``publisher``, ``evictor``, ``guarding``, ``persistence``; reads in ``lookups``); ``service`` is
the process (threads, device plugin servers, the runtime service), with ``nodepods`` (the pod
watch), ``measure`` (GPU processes, utilization, PID attribution), ``owner_record`` (the
runtime fallback's file) and ``debugstate``; ``build`` wires real adapters from the
configuration. Every side effect goes through a port (:mod:`spotgpu.ports`,
:mod:`spotgpu.ports.kube`). Design: ``docs/agent.md``.
"""
