"""The return guard: holds an owner's first GPU call (seccomp user notification) until spot work is gone.

What it decides, each in one pure module (plain data in, decisions out, time an argument):

* ``rule``: which ``ioctl`` requests an owner container's filter sends to the guard (the one
  home of NVIDIA's ioctl numbering) and how that rule composes with the container's seccomp
  profile (used by spotgpu-runtime at ``create``);
* ``policy``: for each caught call, continue at once or hold it, and when a held call is
  released (disarm, fail-open timeout, fd gone);
* ``succession``: the fd holder's role (primary, handing over, standby, retired) as a value with
  its transitions, who answers a notify fd, when a handover is refused, when a holder may exit;
* ``ledger.unreturned``: which fds a restarted holder counts as lost.

Where the side effects are:

* ``service``: :class:`~spotgpu.guard.service.GuardService`, the agent's guard (implements
  :class:`~spotgpu.ports.guard.GuardPort`): a loop thread on the holder's control socket and
  the notify fds, the owner-back handler's threads, Prometheus metrics;
* ``holder``: :class:`~spotgpu.guard.holder.FdHolder`, the ``spotgpu guard-holder`` process,
  wired from ``loop`` (epoll), ``endpoints`` (the listening sockets, runc's connections),
  ``guardlink`` (the guard connections), ``succession_io`` (the handover's steps and the links
  between holders; wire format in ``handover``), ``losses`` (the ledger file, ``/proc``) and
  ``kick`` (ptrace: restarting calls a lost guard left stranded);
* shared by both: ``fdtable`` (the notify fds held, by key and by fd number), ``loop``,
  ``seccomp`` (the notify ioctls, fd passing), ``protocol`` (holder <-> guard messages),
  ``listener`` (runc's listener message), ``support`` (probing runc, libseccomp, the kernel).

Measurement: ``gpucheck`` (the rule on a real GPU). Test support lives in :mod:`spotgpu.testing`
(``standin``: a stand-in GPU client; ``guard_testbed``: runc owner containers), which the guard
never imports. Design, guarantees and limits:
``docs/guard.md``.
"""
