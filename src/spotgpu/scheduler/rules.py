"""The one home of the GPU rules: which GPU spot work may use, which reserved work may take, what
preemption can free, and the per-node summary the cycle indexes nodes by.

Pure functions; no side effects. Everything that needs these rules calls this module: the cycle's
state (:meth:`~spotgpu.scheduler.state.ClusterState.refresh` and the ``GPUState`` methods), the
spot and gpufit plugins through the node classes, and the simulator, which summarises its own
nodes with the same :func:`summarize` to decide which nodes a trimmed snapshot needs
(:mod:`spotgpu.sim.schedview`).

The rules read a GPU through :class:`GpuView` (attributes only), so the cycle's mirrors and the
simulator's views are read by the same code:

* **lend** (:func:`lend`): spot work may use a GPU whose real device and twin are healthy and
  that no preemptor is nominated to: unallocated (a new ShadowPod will hold it), held by a
  ShadowPod that is neither being deleted nor *draining* (none of its GPUs nominated: it has to
  go whole), or allocated to an idle owner on a node that allows lending (not to a reserved pod
  placed in this very cycle: its owner is about to start).
* **bindable** (:func:`bindable`): a reserved pod may take a healthy, unallocated GPU nobody uses
  and nobody is nominated to.
* **reclaimable** (:func:`reclaimable`): preemption may free a healthy GPU that is unallocated or
  held by a ShadowPod from an earlier cycle (never a reserved owner's). It is free at no cost
  (:func:`zero_cost`) when no live spot user is on it and, for a ShadowPod's GPU, none on any GPU
  of that ShadowPod (a ShadowPod is released whole).

:func:`summarize` is the fast path (one pass, branch-light: it runs after every change on a node,
the hottest function of a cycle); :func:`reference_summary` composes the per-GPU rules and is
what a property test holds it equal to.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import NamedTuple, Protocol

from spotgpu.core.types import GPU_MILLI


class Lend(IntEnum):
    """How a GPU could serve spot work right now (from the spot plugin's point of view)."""

    NO = 0
    NEW_SHADOW = 1
    """Unallocated: a new ShadowPod must hold it."""
    SHADOW = 2
    """Held by a ShadowPod already."""
    LENT = 3
    """Allocated to an idle reserved owner on a node that allows lending."""


class ShadowView(Protocol):
    @property
    def deleting(self) -> bool: ...
    @property
    def nominated(self) -> int:
        """How many of its GPUs are nominated for a preemptor (> 0: draining)."""
        ...

    @property
    def new(self) -> bool:
        """Created in this cycle (not in the cluster yet: preemption cannot free it)."""
        ...

    def live_users(self) -> bool:
        """Whether any of its GPUs has a spot user that is not being evicted."""
        ...


class HolderView(Protocol):
    @property
    def tentative(self) -> bool: ...


class UserView(Protocol):
    @property
    def evicting(self) -> bool: ...
    @property
    def priority(self) -> int: ...


class GpuView(Protocol):
    """What the rules read of one GPU."""

    @property
    def healthy(self) -> bool:
        """The real device is healthy."""
        ...

    @property
    def twin_ok(self) -> bool:
        """Its twin ``spot-<id>`` is Healthy (the agent's word: unallocated or owner idle)."""
        ...

    @property
    def nominee(self) -> object | None: ...
    @property
    def owner(self) -> object | None:
        """The container the kubelet allocated the real GPU to (None: unallocated)."""
        ...

    @property
    def shadow(self) -> ShadowView | None: ...
    @property
    def holder(self) -> HolderView | None:
        """The reserved spotgpu pod holding it, if any."""
        ...

    @property
    def users(self) -> Sequence[UserView]:
        """Spot pods using it (its twin)."""
        ...

    @property
    def exclusive(self) -> int: ...
    @property
    def used_milli(self) -> int: ...
    @property
    def live(self) -> int:
        """Users not being evicted."""
        ...

    @property
    def lease(self) -> int:
        """Bucket of its owner's idle forecast (:mod:`spotgpu.scheduler.lease`); -1: unknown or unused."""
        ...


class NodeSummary(NamedTuple):
    """A node's placement and preemption figures (what its class and preemption key are made of)."""

    free: int
    """Bindable GPUs (reserved tasks can take them)."""
    spot_unallocated: int
    """Unused lendable twins on unallocated or ShadowPod-held GPUs."""
    spot_lent: int
    """Unused lendable twins on GPUs of an idle owner."""
    partials: tuple[int, ...]
    """Milli left on lendable GPUs that shared spot pods use partly, ascending."""
    lent_partials: tuple[int, ...]
    """The same for lent GPUs only (filled only when asked to split lent GPUs out), ascending."""
    lent_leases: tuple[int, ...]
    """Forecast buckets of the unused lent twins whose forecast is known, ascending."""
    top_priority: int
    """Highest spot priority among live users of reclaimable GPUs (0: none)."""
    zero_cost: int
    """Reclaimable GPUs free without a new victim."""
    available: int
    """Reclaimable GPUs (with victims)."""
    unallocated_milli: int
    """Room for spot work on unallocated or ShadowPod-held GPUs, in milli: 1000 per unused lendable
    twin (``spot_unallocated``) plus what is left on partly used shared ones (the ``auto``
    strategy's demand rule, :mod:`spotgpu.scheduler.demand`)."""


# --- the rules, one GPU at a time (the reference) ---------------------------------------------


def lend(g: GpuView, lending: bool) -> Lend:
    """How spot work could use ``g`` (ignoring its current users); ``lending``: the node allows it."""
    if not (g.healthy and g.twin_ok) or g.nominee is not None:
        return Lend.NO
    if g.owner is None:
        return Lend.NEW_SHADOW
    shadow = g.shadow
    if shadow is not None:
        return Lend.NO if shadow.deleting or shadow.nominated else Lend.SHADOW
    holder = g.holder
    if holder is not None and holder.tentative:
        return Lend.NO  # placed in this cycle: its owner is about to start, not idle
    return Lend.LENT if lending else Lend.NO


def bindable(g: GpuView) -> bool:
    """A reserved task could be bound to ``g`` now."""
    return g.healthy and g.owner is None and not g.users and g.nominee is None


def reclaimable(g: GpuView) -> bool:
    """Preemption could free ``g`` for a reserved task (spot users and ShadowPods only).

    Necessary, not sufficient: a ShadowPod-held GPU is freed only with its whole ShadowPod
    (:mod:`spotgpu.scheduler.victims` counts that cost).
    """
    shadow = g.shadow
    return g.healthy and (g.owner is None or (shadow is not None and not shadow.new))


def zero_cost(g: GpuView) -> bool:
    """A reclaimable ``g`` is free without a new victim: no live user on it (or on its ShadowPod)."""
    if g.live:
        return False
    shadow = g.shadow
    return shadow is None or shadow.deleting or not shadow.live_users()


def reference_summary(gpus: Sequence[GpuView], lending: bool, split_lent: bool) -> NodeSummary:
    """:func:`summarize` written as the per-GPU rules above (slower; the property tests' oracle)."""
    lends = [lend(g, lending) for g in gpus]
    partials = sorted(
        GPU_MILLI - g.used_milli
        for g, how in zip(gpus, lends, strict=True)
        if how and g.users and not g.exclusive and g.used_milli < GPU_MILLI
    )
    lent_partials = sorted(
        GPU_MILLI - g.used_milli
        for g, how in zip(gpus, lends, strict=True)
        if split_lent and how is Lend.LENT and g.users and not g.exclusive and g.used_milli < GPU_MILLI
    )
    unused = [(g, how) for g, how in zip(gpus, lends, strict=True) if how and not g.users]
    reclaim = [g for g in gpus if g.nominee is None and reclaimable(g)]
    top = max((u.priority for g in reclaim if g.live for u in g.users if not u.evicting), default=0)
    spot_unallocated = sum(1 for _, how in unused if how is not Lend.LENT)
    unallocated_partials = sum(
        GPU_MILLI - g.used_milli
        for g, how in zip(gpus, lends, strict=True)
        if how and how is not Lend.LENT and g.users and not g.exclusive and g.used_milli < GPU_MILLI
    )
    return NodeSummary(
        free=sum(1 for g in gpus if bindable(g)),
        spot_unallocated=spot_unallocated,
        spot_lent=sum(1 for _, how in unused if how is Lend.LENT),
        partials=tuple(partials),
        lent_partials=tuple(lent_partials),
        lent_leases=tuple(sorted(g.lease for g, how in unused if how is Lend.LENT and g.lease >= 0)),
        top_priority=top,
        zero_cost=sum(1 for g in reclaim if zero_cost(g)),
        available=len(reclaim),
        unallocated_milli=GPU_MILLI * spot_unallocated + unallocated_partials,
    )


# --- the fast path ----------------------------------------------------------------------------

_tuple_new = tuple.__new__


def summarize(gpus: Sequence[GpuView], lending: bool, split_lent: bool = False) -> NodeSummary:
    """The node's summary in one pass: the rules above, inlined (held equal by a property test).

    ``split_lent`` also fills :attr:`NodeSummary.lent_partials` (the ``auto`` strategy needs it;
    other nodes leave it empty so that their classes stay as coarse as they can be).
    """
    free = spot_u = spot_l = zero = avail = top = rest = 0
    partials: list[int] = []
    lent_partials: list[int] | None = [] if split_lent else None
    leases: list[int] | None = None
    idle_in_shadow: list[ShadowView] | None = None
    for g in gpus:
        if not g.healthy or g.nominee is not None:
            continue
        users = g.users
        owner = g.owner
        shadow = g.shadow
        if owner is None:
            how = Lend.NEW_SHADOW
            if not users:
                free += 1
        elif shadow is not None:
            how = Lend.NO if shadow.deleting or shadow.nominated else Lend.SHADOW
        else:
            holder = g.holder
            how = Lend.LENT if lending and (holder is None or not holder.tentative) else Lend.NO
        if how and g.twin_ok:
            if not users:
                if how is Lend.LENT:
                    spot_l += 1
                    if g.lease >= 0:
                        if leases is None:
                            leases = [g.lease]
                        else:
                            leases.append(g.lease)
                else:
                    spot_u += 1
            elif not g.exclusive and g.used_milli < GPU_MILLI:
                partials.append(GPU_MILLI - g.used_milli)
                if how is not Lend.LENT:
                    rest += GPU_MILLI - g.used_milli
                elif lent_partials is not None:
                    lent_partials.append(GPU_MILLI - g.used_milli)
        if owner is None or (shadow is not None and not shadow.new):
            avail += 1
            if g.live == 0:
                if shadow is None or shadow.deleting:
                    zero += 1
                elif idle_in_shadow is None:
                    idle_in_shadow = [shadow]
                else:
                    idle_in_shadow.append(shadow)
            else:
                for u in users:
                    if not u.evicting and u.priority > top:
                        top = u.priority
    if idle_in_shadow is not None:
        # Freed only with the whole ShadowPod: zero cost only if none of its GPUs has a live user.
        zero += sum(1 for sh in idle_in_shadow if not sh.live_users())
    partials.sort()
    if lent_partials:
        lent_partials.sort()
    if leases is not None:
        leases.sort()
    summary = (
        free,
        spot_u,
        spot_l,
        tuple(partials),
        tuple(lent_partials) if lent_partials else (),
        tuple(leases) if leases is not None else (),
        top,
        zero,
        avail,
        GPU_MILLI * spot_u + rest,
    )
    return _tuple_new(NodeSummary, summary)  # NodeSummary(*summary) without its Python-level __new__


__all__ = [
    "GpuView",
    "HolderView",
    "Lend",
    "NodeSummary",
    "ShadowView",
    "UserView",
    "bindable",
    "lend",
    "reclaimable",
    "reference_summary",
    "summarize",
    "zero_cost",
]
