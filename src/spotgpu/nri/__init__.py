"""NRI mode of spotgpu-runtime: the modifier chain's decision made at the runtime's
CreateContainer through an NRI plugin inside the agent, instead of by the wrapper at ``create``;
a synced spot container's lend rule asked again at StartContainer.

What it decides, pure: ``adjust`` (the chain's change to a spec as an NRI ContainerAdjustment,
or a refusal when NRI cannot express it exactly), ``spec`` (an NRI container as the chain's
OCI-spec-shaped input, OCI objects back as NRI messages), ``wire`` (the multiplexer and ttrpc
framing), ``config`` (the ``nri`` section; :func:`~spotgpu.nri.config.load_nri_config` reads one
file). The decision about the container itself is the runtime's
(:class:`~spotgpu.runtime.engine.SpecEngine`), never a copy.

Where the side effects are: ``transport`` (one session on the runtime's NRI socket, its reader
and handler threads), ``plugin`` (registration and reconnecting), ``host`` (the engine's node
lookups, a bounded thread pool), ``service`` (hosting both in the agent, beside the wrapper's
service). Design: ``docs/runtime.md``; wire facts: ``shared/reference/cri-nri.md``.
"""
