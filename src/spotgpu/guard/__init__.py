"""The return guard: holds an owner's first GPU call (seccomp user notification) until spot work is gone.

``rule`` (what owner containers' filters catch; used by spotgpu-runtime), ``service`` (the
agent's :class:`~spotgpu.agent.ports.GuardPort`), ``holder`` (the fd holder process), with
``handover``/``succession``/``ledger`` (holder restarts and upgrades never lose a notify fd).
Design, guarantees and limits: ``docs/guard.md``.
"""
