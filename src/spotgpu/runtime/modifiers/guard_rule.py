"""GuardRule: install the return guard's seccomp notify rule into GPU owners' specs.

Decides *which* containers get the rule; *what* the rule matches belongs to the guard
(:func:`spotgpu.guard.rule.apply_guard_rule`). Side effects only through the context: one
pod-resources lookup (does this container hold real GPUs?) and the guard's ``listener_ready``
probe of its socket.

A container is an owner when it is a Kubernetes container (not a sandbox) that the kubelet
allocated devices of a ``runtime.gpuResources`` resource and that syncs no devices itself.
For an owner the decision is recorded in the spec:

* injected: the guard's :func:`apply_guard_rule` writes ``spotgpu.io/guarded`` = the owner;
* not injected: ``spotgpu.io/guard-skipped`` = ``<reason>: <detail>``, with reason one of
  ``opted-out`` (pod annotation ``spotgpu.io/return-guard: disabled``), ``guard-disabled``
  (node configuration), ``guard-unavailable`` (guard package missing), ``listener-down``
  (runc would refuse to create the container: never inject then), ``conflict`` (the spec's
  seccomp profile cannot carry the rule; the owner still starts), ``lookup-failed``.

Never fails the owner's container: every problem becomes a skip. Containers that are not
owners carry neither annotation (one set through a pod-annotation allow-list is removed), so
the agent can trust them when it decides whether an owner's GPUs may be lent.
"""

from __future__ import annotations

from spotgpu.core import keys
from spotgpu.core.errors import SpotgpuError
from spotgpu.runtime.modifiers.base import ModifyContext
from spotgpu.runtime.spec import ContainerKind, Spec, set_annotation, string_annotations


class GuardRule:
    name = "guard-rule"

    def modify(self, spec: Spec, ctx: ModifyContext) -> None:
        identity = ctx.identity
        owner = identity.ref
        is_owner = False
        skip: str | None = None
        if identity.kind is ContainerKind.CONTAINER and owner is not None and ctx.devices_from is None:
            try:
                pod = ctx.lookup.pod(owner.namespace or "", owner.pod)
                held = pod.container(owner.name) if pod is not None else None
                is_owner = held is not None and any(held.ids(r) for r in ctx.config.gpu_resources)
            except SpotgpuError as exc:
                is_owner, skip = True, f"lookup-failed: {exc}"
        if not is_owner:
            set_annotation(spec, keys.GUARDED, None)
            set_annotation(spec, keys.GUARD_SKIPPED, None)
            return
        assert owner is not None
        listener = str(ctx.config.guard_listener_path)
        if skip is not None:
            pass
        elif string_annotations(spec).get(keys.GUARD) == keys.GUARD_OPT_OUT:
            skip = f"opted-out: the pod sets {keys.GUARD}={keys.GUARD_OPT_OUT}"
        elif not ctx.config.guard_enabled:
            skip = "guard-disabled: runtime.guardEnabled is false on this node"
        elif ctx.guard is None:
            skip = "guard-unavailable: the spotgpu.guard package is not installed"
        elif not ctx.guard.ready(listener):
            skip = f"listener-down: nothing listens on {listener}"
        else:
            try:
                ctx.guard.apply(spec, listener_path=listener, owner=owner)
            except ValueError as exc:  # the guard's GuardRuleError family (ValidationError)
                skip = f"conflict: {exc}"
        if skip is None:
            set_annotation(spec, keys.GUARD_SKIPPED, None)
            return
        set_annotation(spec, keys.GUARDED, None)
        set_annotation(spec, keys.GUARD_SKIPPED, skip)
        ctx.notes.append(f"guard not installed for owner {owner}: {skip}")


__all__ = ["GuardRule"]
