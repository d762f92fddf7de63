"""The API double's DRA resources: ResourceSlice, ResourceClaim, DeviceClass, DeviceTaintRule.

``resource.k8s.io/v1`` (GA since 1.34; DeviceTaintRule's v1 since 1.37), served by
:class:`~spotgpu.testing.kubeapi.KubeApiServer` when given :data:`DRA_TYPES`;
:func:`validate_dra` makes it refuse (422) any object that does not validate against the
Kubernetes schemas of *every* release in :data:`SCHEMA_VERSIONS` that has the kind (strict:
unknown fields are errors), through the ``kubernetes-validate`` test dependency. The field
selectors the kubelet and DRA drivers use (``spec.nodeName``, ``spec.driver``) are the double's.
"""

from __future__ import annotations

import importlib
from typing import Any, Final

from spotgpu.testing.kubeapi import BUILTIN_TYPES, ApiFailure, KubeApiServer, ResourceType

GROUP: Final = "resource.k8s.io"
VERSION: Final = "v1"
DRA_TYPES: Final[tuple[ResourceType, ...]] = (
    ResourceType(GROUP, VERSION, "resourceslices", "ResourceSlice", False, status_subresource=False),
    ResourceType(GROUP, VERSION, "resourceclaims", "ResourceClaim", True),
    ResourceType(GROUP, VERSION, "deviceclasses", "DeviceClass", False, status_subresource=False),
    ResourceType(GROUP, VERSION, "devicetaintrules", "DeviceTaintRule", False),
)
ALL_TYPES: Final = (*BUILTIN_TYPES, *DRA_TYPES)
SCHEMA_VERSIONS: Final = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")
_FIRST_V1: Final = {"DeviceTaintRule": "1.37.0"}
"""Kinds whose ``resource.k8s.io/v1`` form is younger than 1.34."""


def validate_dra(obj: dict[str, Any]) -> None:
    """Raise a 422 :class:`ApiFailure` unless ``obj`` is valid in every release that serves its kind in v1."""
    kv: Any = importlib.import_module("kubernetes_validate")
    kind = str(obj.get("kind", ""))
    first = _FIRST_V1.get(kind, SCHEMA_VERSIONS[0])
    for version in SCHEMA_VERSIONS:
        if tuple(map(int, version.split("."))) < tuple(map(int, first.split("."))):
            continue
        try:
            kv.validate(obj, version, strict=True)
        except kv.ValidationError as exc:
            name = obj.get("metadata", {}).get("name", "")
            message = str(exc).splitlines()[0]
            raise ApiFailure(422, "Invalid", f"{kind} {name!r} is invalid (Kubernetes {version}): {message}") from None


def dra_api(**kwargs: Any) -> KubeApiServer:
    """An API double serving the built-in kinds and the DRA kinds, with schema validation."""
    api = KubeApiServer(types=ALL_TYPES, **kwargs)
    for rt in DRA_TYPES:
        api.add_validator(rt.group, rt.plural, validate_dra)
    return api


__all__ = ["ALL_TYPES", "DRA_TYPES", "GROUP", "SCHEMA_VERSIONS", "VERSION", "dra_api", "validate_dra"]
