"""What a GangJob's pod template may say: only what its tenant may write on its own pods.

Pure, no I/O. The GangJob controller creates a GangJob's pods with the scheduler's service account,
and the chart's admission policy lets exactly that account write the pod metadata the agent, the
runtime and the scheduler believe (``admission-policy.yaml``). A template copied as is would make the
controller a confused deputy: a tenant could write, through it, what admission refuses from the
tenant directly. :func:`template_refusals` is the one rule; :meth:`spotgpu.kube.resources.GangJobView.parse`
applies it, so no GangJob view (and no pod built from one) exists for a refused template.

Refused, each named in the answer:

* annotations in :data:`~spotgpu.core.keys.SCHEDULER_ANNOTATIONS`, or starting with one of
  :data:`~spotgpu.core.keys.SCHEDULER_ANNOTATION_PREFIXES` (the admission policy's own lists);
* annotations only spotgpu-runtime writes (:data:`~spotgpu.core.keys.RUNTIME_WRITTEN`; admission
  refuses them on pods for everyone, the scheduler included);
* labels in :data:`~spotgpu.core.keys.SCHEDULER_LABELS`;
* ``spec.nodeName``: it places a pod without the scheduler (and skips its lending decisions);
* ``spec.schedulerName`` other than ``spotgpu``: the controller creates spotgpu's pods only;
* labels or annotations that are not a map of strings (the rule could not vouch for them).

Not this rule's business: what admission checks of every pod whoever creates it. Pod Security
Admission (``hostNetwork``, ``hostPID``, ``privileged``, hostPath volumes) is namespace-based and
applies to the controller's pods as to the tenant's own; the chart's spot-pod rule (no real GPUs
in a spot pod) matches every creator. Admission rules keyed on the *requesting user* see the
scheduler's service account for GangJob pods, not the tenant: such rules must also cover
GangJobs. The controller sets ``schedulerName``, ``priorityClassName`` (the GangJob's), its own
labels (job, attempt, PodGroup, queue) and the lease annotations over the template's, and takes
nothing of the template's metadata but labels and annotations (no name, namespace, owner
references or finalizers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spotgpu.core import keys


def _scheduler_annotation(key: str) -> bool:
    return key in keys.SCHEDULER_ANNOTATIONS or key.startswith(keys.SCHEDULER_ANNOTATION_PREFIXES)


def _string_map(value: object) -> bool:
    return isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _metadata_refusals(metadata: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    annotations = metadata.get("annotations")
    labels = metadata.get("labels")
    if annotations is not None and not _string_map(annotations):
        out.append("metadata.annotations: not a map of strings")
        annotations = None
    if labels is not None and not _string_map(labels):
        out.append("metadata.labels: not a map of strings")
        labels = None
    for key in sorted(annotations or {}):
        if _scheduler_annotation(key):
            out.append(f"annotation {key}: only the spotgpu scheduler writes it")
        elif key in keys.RUNTIME_WRITTEN:
            out.append(f"annotation {key}: only spotgpu-runtime writes it, never onto pods")
    for key in sorted(labels or {}):
        if key in keys.SCHEDULER_LABELS:
            out.append(f"label {key}: only the spotgpu scheduler writes it")
    return out


def template_refusals(template: Mapping[str, Any]) -> tuple[str, ...]:
    """Every reason ``template`` (a pod template: ``metadata``, ``spec``) may not become a pod the
    scheduler's service account creates, each naming the key or field; empty: acceptable."""
    out: list[str] = []
    metadata = template.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        out.append("metadata: not a map")
    elif metadata is not None:
        out.extend(_metadata_refusals(metadata))
    spec = template.get("spec")
    if isinstance(spec, Mapping):
        if spec.get("nodeName") not in (None, ""):
            out.append("spec.nodeName: the spotgpu scheduler places GangJob pods")
        if spec.get("schedulerName") not in (None, "", keys.SCHEDULER_NAME):
            out.append(f"spec.schedulerName: GangJob pods are scheduled by {keys.SCHEDULER_NAME}")
    return tuple(out)


__all__ = ["template_refusals"]
