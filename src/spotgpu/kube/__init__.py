"""Kubernetes integration: client layer, control loops, CRDs and the operator CLI's back end.

Nothing here decides scheduling or lending: API objects are translated into the pure cores'
plain data (:mod:`~spotgpu.kube.snapshot`, :mod:`~spotgpu.kube.objects`), and their decisions into
API calls (:mod:`~spotgpu.kube.apply`, :mod:`~spotgpu.kube.agent_port`). The only pure decisions
of this package are its own control-plane ones: leader election (:func:`spotgpu.kube.leader.decide`)
and the GangJob lifecycle (:func:`spotgpu.kube.gangjob.reconcile`). The translation is pure too
(``snapshot`` with ``nodestate`` and ``snapshot_checks``, ``leases``, ``objects``, ``resources``).

Where the side effects are: the API server, through ``client`` (connections), ``informer``
(list and watch), ``apply`` (binds, ShadowPods, evictions), ``agent_port``, ``events``,
``leader`` (its Lease) and ``gangjob_controller``; ``metrics`` serves the controllers' metrics.

Entry points for other components (docs/kube.md):

* :func:`spotgpu.kube.client.connect` -> :class:`~spotgpu.kube.client.Connection`
* :class:`spotgpu.kube.agent_port.KubeAgentPort`: the node agent's ``KubePort``
* :class:`spotgpu.kube.scheduler_loop.SchedulerLoop`, :class:`spotgpu.kube.gangjob_controller.GangJobController`,
  :class:`spotgpu.kube.leader.LeaderElector`: what ``spotgpu scheduler`` runs
* :mod:`spotgpu.kube.crds`: the CRD manifests (the chart's ``crds/`` is generated from them)

Only this package (and the CLI) imports the Kubernetes client library (an import-linter contract).
"""
