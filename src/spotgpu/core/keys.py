"""Every annotation key, label name and well-known name spotgpu reads or writes.

Constants only; no side effects. Keep them here, in one place, so that the scheduler, the
agent, the runtime and the Kubernetes adapters can never disagree on a spelling. Keys in the
``platform.k8s.io`` domain and the resource ``platform/spot-gpu`` keep the original design's
names (shared/seed) so clusters running that design can migrate; everything new to spotgpu
lives under ``spotgpu.io``.

Value formats are defined next to the code that parses them and are cross-referenced here.
"""

from __future__ import annotations

from typing import Final

# --- device sync (spot container <- source container) -------------------------------------
DEVICES_FROM_PREFIX: Final = "platform.k8s.io/container-devices-from"
"""Device-sync annotation. Without a suffix (as the agent's Allocate returns it, so the
kubelet puts it on exactly the requesting container) it applies to the container whose spec
carries it. With ``.<container>`` (set at pod level) it applies only to the container of that
name. Value: see :mod:`spotgpu.core.codec`."""

SYNCED_DEVICES: Final = "platform.k8s.io/synced-devices"
"""Written by spotgpu-runtime into the spec it modified: ``{"<resource>": ["<id>", ...]}``."""

DEVICE_OWNER: Final = "platform.k8s.io/device-owner"
"""On a spot pod, written by the scheduler: ``{"<real device id>": "ns/pod/container"}``."""

POD_DEVICE_TYPE: Final = "platform.k8s.io/pod-device-type"
"""``shadow`` (placeholder holding real GPUs) or ``share`` (inference sharing)."""

CONTAINER_ENV_PREFIX: Final = "platform.k8s.io/container-env"
"""Generic env annotation: ``{"NAME": "value"}``; suffix rules as for DEVICES_FROM_PREFIX."""

# --- node annotations -----------------------------------------------------------------------
NODE_LOWPOWER_SPOT: Final = "platform.k8s.io/lowpower-spot"
"""``"true"`` when the node may lend *allocated* idle GPUs (share-GPU); default ``"false"``."""

NODE_SPOT_PREFER: Final = "platform.k8s.io/spot-prefer"
"""Node strategy: ``auto`` (unallocated GPUs first, lent ones only for spot work that would otherwise
wait), ``idle`` (unallocated GPUs, exclusive first) or ``lowpower`` (lent GPUs, shared first)."""

NODE_SPOT_PREFER_DEFAULT: Final = "auto"
"""The strategy of a node without ``platform.k8s.io/spot-prefer``."""

NODE_SPOT_GPU_STATE: Final = "spotgpu.io/spot-gpu-state"
"""Written by the agent: per real device, its owner, owner state and twin health (JSON); also
its spot pods (``pods``, as pod-resources reports them) and shared replicas per GPU
(``replicas``). Format: :func:`spotgpu.agent.model.node_state_annotation`."""

NODE_IDLE_FORECAST: Final = "spotgpu.io/idle-forecast"
"""Written by the agent with :data:`NODE_SPOT_GPU_STATE`: for each *lent* GPU's twin, the
predicted rest of its owner's idle period in whole seconds, ``{"spot-GPU-x": {"expected": 5400,
"p20": 1200}}`` (``p20``: 80% of such idle periods last at least that much longer); ``{}`` when
nothing is lent. From :func:`spotgpu.core.lending.idle_forecast`; parsed by the scheduler with
:func:`spotgpu.kube.leases.parse_idle_forecast`."""

# --- gangs, queues, jobs --------------------------------------------------------------------
API_GROUP: Final = "scheduling.spotgpu.io"
POD_GROUP: Final = "scheduling.spotgpu.io/pod-group"
"""Label on every gang member: the PodGroup name (same namespace)."""
QUEUE: Final = "scheduling.spotgpu.io/queue"
GANG_JOB: Final = "scheduling.spotgpu.io/gang-job"
SHADOW_FOR: Final = "scheduling.spotgpu.io/shadow-for"
"""On a ShadowPod, the PodGroup whose spot pods it lends real GPUs to: as a label the group's
name (label values cannot hold ``/``; omitted when longer than 63 characters), as an annotation
the full ``ns/name``."""
SCHEDULER_NAME: Final = "spotgpu"

# --- return guard -----------------------------------------------------------------------------
GUARD: Final = "spotgpu.io/return-guard"
"""On an owner pod: :data:`GUARD_OPT_OUT` opts the pod out of the guard's seccomp rule."""
GUARD_OPT_OUT: Final = "disabled"
"""The value of :data:`GUARD` that opts a pod out."""
GUARDED: Final = "spotgpu.io/guarded"
"""Written by spotgpu-runtime into an owner's spec when it injected the guard rule."""

# --- eviction ---------------------------------------------------------------------------------
DISRUPTION_CONDITION: Final = "DisruptionTarget"
"""Pod condition type set on evicted pods (reason: an :class:`~spotgpu.core.types.EvictionReason`)."""

# --- CRI (containerd) annotations in OCI specs, read only --------------------------------------
CRI_CONTAINER_TYPE: Final = "io.kubernetes.cri.container-type"
CRI_SANDBOX_ID: Final = "io.kubernetes.cri.sandbox-id"
CRI_SANDBOX_NAME: Final = "io.kubernetes.cri.sandbox-name"
CRI_SANDBOX_NAMESPACE: Final = "io.kubernetes.cri.sandbox-namespace"
CRI_SANDBOX_UID: Final = "io.kubernetes.cri.sandbox-uid"
CRI_CONTAINER_NAME: Final = "io.kubernetes.cri.container-name"
CRI_IMAGE_NAME: Final = "io.kubernetes.cri.image-name"
CRI_TYPE_SANDBOX: Final = "sandbox"
CRI_TYPE_CONTAINER: Final = "container"

# --- CRI-O annotations (secondary sources; see protocols.md 3.3) -------------------------------
CRIO_CONTAINER_TYPE: Final = "io.kubernetes.cri-o.ContainerType"
CRIO_CONTAINER_NAME: Final = "io.kubernetes.cri-o.ContainerName"
CRIO_SANDBOX_ID: Final = "io.kubernetes.cri-o.SandboxID"

# --- CRI labels on containerd containers, and on CRI-O specs ------------------------------------
LABEL_POD_NAME: Final = "io.kubernetes.pod.name"
LABEL_POD_NAMESPACE: Final = "io.kubernetes.pod.namespace"
LABEL_POD_UID: Final = "io.kubernetes.pod.uid"
LABEL_CONTAINER_NAME: Final = "io.kubernetes.container.name"
LABEL_CRI_KIND: Final = "io.cri-containerd.kind"

CONTAINERD_K8S_NAMESPACE: Final = "k8s.io"
CONTAINERD_NAMESPACE_HEADER: Final = "containerd-namespace"

# --- scheduler decisions (spotgpu.scheduler; applied by spotgpu.kube) ---------------------------
ASSIGNED_DEVICES: Final = "spotgpu.io/assigned-devices"
"""Written by the scheduler on a pod it binds and on a ShadowPod it creates: the exact devices it
chose, ``{"<resource>": ["<id>", ...]}`` (twin IDs ``spot-...`` for spot pods, real IDs otherwise)."""

NOMINATED_DEVICES: Final = "spotgpu.io/nominated-devices"
"""On a pending preemptor pod: GPUs preemption frees for it, ``{"node": "<node>", "devices": ["<real id>", ...]}``."""

SPOT_GPU_MILLI: Final = "spotgpu.io/spot-gpu-milli"
"""On a shared spot pod: its share of one GPU in milli-GPU (1..999); absent for exclusive spot."""

MIN_LEASE: Final = "spotgpu.io/min-lease"
"""On a spot pod (the GangJob controller copies it from ``spec.minLease``): a duration like ``1h``;
read for pods without a PodGroup (a gang's is its PodGroup's ``spec.minLease``)."""

CHECKPOINT_INTERVAL: Final = "spotgpu.io/checkpoint-interval"
"""As :data:`MIN_LEASE`, for ``spec.checkpointInterval``."""

# --- GangJob controller (spotgpu.kube) ----------------------------------------------------------
GANG_ATTEMPT: Final = "scheduling.spotgpu.io/attempt"
"""Label on a GangJob's PodGroup and pods: which attempt (0, 1, ... after each requeue) they belong to."""

# --- return guard: seccomp listener metadata (spotgpu.guard.rule) -------------------------------
GUARD_METADATA_OWNER: Final = "spotgpu.io/owner"
"""Key in the ``listenerMetadata`` string the guard's rule puts into an owner's seccomp config:
``spotgpu.io/owner=<ns>/<pod>/<container>`` (whitespace-separated ``key=value`` pairs); runc hands
it back with every notify fd, so the guard knows the owner without trusting annotations."""

# --- spotgpu-runtime decisions (spotgpu.runtime) ------------------------------------------------
GUARD_SKIPPED: Final = "spotgpu.io/guard-skipped"
"""Written by spotgpu-runtime into a GPU owner's spec when it did *not* install the guard's rule:
``<reason>: <detail>`` (reasons: ``opted-out``, ``guard-disabled``, ``guard-unavailable``,
``listener-down``, ``conflict``, ``lookup-failed``). Absent on guarded owners and non-owners."""

CDI_SYNCED: Final = "cdi.k8s.io/spotgpu-synced"
"""Written by spotgpu-runtime into a spot container's spec: the CDI device names of the synced
devices (for a CDI-aware lower runtime)."""

NRI_TOLERATE_MISSING_PLUGIN: Final = "spotgpu.io/tolerate-missing-nri-plugin"
"""Pod annotation (``"true"``) that lets containerd's NRI default validator create the pod's
containers while spotgpu's NRI plugin is not connected (``deploy/containerd/nri-v3.toml``:
``tolerate_missing_plugins_annotation``). containerd also reads it as ``<key>/pod`` and
``<key>/container.<name>``. Only the agent DaemonSet and system pods may carry it: admission
must refuse it (and every annotation starting with it) outside system namespaces."""

RUNTIME_WRITTEN: Final = (SYNCED_DEVICES, GUARDED, GUARD_SKIPPED, CDI_SYNCED)
"""Every annotation spotgpu-runtime writes into specs. What they say must always be ours: the
runtime removes them from every spec it sees before it decides, and its shell fast path sends
every ``create`` whose spec carries one to the agent (a forged one never reaches runc)."""

# --- ShadowPods (authenticated; spotgpu.core.shadow) ------------------------------------------
SHADOW_POD_LABEL: Final = "spotgpu.io/shadow-pod"
"""Label the scheduler puts on every ShadowPod it creates (value ``"true"``). A pod counts as a
ShadowPod only with this label, ``pod-device-type: shadow`` *and* the configured ShadowPod
namespace, which only the scheduler may write (RBAC plus the chart's admission policy)."""

DEFAULT_SHADOW_NAMESPACE: Final = "spotgpu-system"
"""Namespace of ShadowPods unless configured (``shadowNamespace``): the chart's release namespace."""

# --- who may write pod metadata (the chart's admission policy; a test keeps them equal) ------------
SCHEDULER_ANNOTATIONS: Final = (DEVICE_OWNER, POD_DEVICE_TYPE, ASSIGNED_DEVICES, NOMINATED_DEVICES, SHADOW_FOR)
"""Pod annotations only the scheduler's service account may add, change or remove: the agent, the
runtime and the scheduler believe them. ``deploy/chart/spotgpu/templates/admission-policy.yaml``
lists the same keys (``schedulerAnnotations``)."""
SCHEDULER_ANNOTATION_PREFIXES: Final = (DEVICES_FROM_PREFIX,)
"""As :data:`SCHEDULER_ANNOTATIONS`, for every annotation key starting with one of these
(``container-devices-from`` and ``container-devices-from.<container>``)."""
SCHEDULER_LABELS: Final = (SHADOW_FOR, SHADOW_POD_LABEL)
"""Pod labels only the scheduler's service account may add, change or remove."""
