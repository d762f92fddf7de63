"""spotgpu as a DRA driver on the node (``agent.mode: dra``): docs/dra.md.

Pure modules (no I/O, no gRPC; an import-linter contract keeps it so): :mod:`.claim` (a
ResourceClaim as plain data), :mod:`.slices` (the node's ResourceSlices and their sync plan),
:mod:`.decide` (whether a claim may be prepared: the claim checks, then the runtime's own
twin/owner/lend authorization), :mod:`.cdispec` (CDI spec content). Edges: :mod:`.cdi` (spec
files), :mod:`.checkpoint`, :mod:`.driver` (Prepare/Unprepare), :mod:`.plugin` (the kubelet
plugin's gRPC servers and sockets), :mod:`.publisher` (ResourceSlice publication through
:class:`.ports.DraApi`).
"""
