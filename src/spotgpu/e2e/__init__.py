"""``spotgpu node-e2e``: the whole node side of spotgpu on one machine, lend and return in a loop.

Modules: :mod:`.node` starts the node (private containerd, kubelet-side doubles, the Kubernetes
API double, the guard's fd holder, the agent as its own process, the owner container) and plays
the kubelet; :mod:`.client` is the owner's GPU client (static C); :mod:`.run` runs the cycles and
the faults and computes the figures. Design and figures: ``docs/node-e2e.md``.

Decides nothing of spotgpu's: it plays the kubelet and the owner, and judges the outcome
(:mod:`.model`: leaks, owner errors, targets). Side effects: every process and file :mod:`.node`
starts, under one temporary directory. Uses :mod:`spotgpu.testing`; not part of the production
image, and nothing in production imports it (import-linter).
"""
