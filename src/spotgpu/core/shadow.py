"""Which pods are ShadowPods: the one authentication rule the agent and the scheduler share.

Pure; no side effects. A ShadowPod holds real GPUs for spot work: its GPUs get Healthy twins
without activity detection, and other tenants' spot pods are synced onto them. So a pod that
merely *says* it is one (``platform.k8s.io/pod-device-type: shadow`` is an ordinary annotation
any tenant can write) must not be believed. A pod is a ShadowPod only when all three hold:

1. the annotation ``platform.k8s.io/pod-device-type: shadow``;
2. the label ``spotgpu.io/shadow-pod: "true"``;
3. it lives in the ShadowPod namespace (``shadowNamespace``, default ``spotgpu-system``, the
   chart's release namespace), where only the scheduler may create pods: tenants get no RBAC
   there, and the chart's admission policy lets only the scheduler's service account set the
   annotation or the label, on any pod, in any namespace.

A pod that claims one of (1) or (2) without all three is *forged*: the agent and the scheduler
treat it as an ordinary pod, and count and log it (:class:`ShadowCheck` says why).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from spotgpu.core import keys
from spotgpu.core.types import PodDeviceType

SHADOW_LABEL_VALUE: Final = "true"


class ShadowClaim(StrEnum):
    NONE = "none"
    """The pod does not claim to be a ShadowPod."""
    AUTHENTIC = "authentic"
    FORGED = "forged"


@dataclass(frozen=True, slots=True)
class ShadowCheck:
    claim: ShadowClaim
    reason: str = ""
    """Why a claim is forged (empty otherwise)."""

    @property
    def authentic(self) -> bool:
        return self.claim is ShadowClaim.AUTHENTIC


def shadow_labels() -> dict[str, str]:
    """The label the scheduler puts on every ShadowPod it creates."""
    return {keys.SHADOW_POD_LABEL: SHADOW_LABEL_VALUE}


def check_shadow(
    namespace: str | None,
    annotations: Mapping[str, str],
    labels: Mapping[str, str],
    *,
    shadow_namespace: str,
) -> ShadowCheck:
    """Whether a pod is an authentic ShadowPod (module docstring), forged, or no claim at all."""
    typed = annotations.get(keys.POD_DEVICE_TYPE) == PodDeviceType.SHADOW.value
    labelled = keys.SHADOW_POD_LABEL in labels
    if not typed and not labelled:
        return ShadowCheck(ShadowClaim.NONE)
    missing = []
    if not typed:
        missing.append(f"annotation {keys.POD_DEVICE_TYPE}={PodDeviceType.SHADOW.value}")
    if labels.get(keys.SHADOW_POD_LABEL) != SHADOW_LABEL_VALUE:
        missing.append(f"label {keys.SHADOW_POD_LABEL}={SHADOW_LABEL_VALUE}")
    if namespace != shadow_namespace:
        missing.append(f"namespace {shadow_namespace} (it is in {namespace})")
    if missing:
        return ShadowCheck(ShadowClaim.FORGED, "claims to be a ShadowPod without " + ", ".join(missing))
    return ShadowCheck(ShadowClaim.AUTHENTIC)


__all__ = ["SHADOW_LABEL_VALUE", "ShadowCheck", "ShadowClaim", "check_shadow", "shadow_labels"]
