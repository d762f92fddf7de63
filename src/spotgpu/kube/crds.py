"""CustomResourceDefinitions (``apiextensions.k8s.io/v1``, structural schemas) and PriorityClasses.

Pure data; the only side effect is :func:`main`, which writes the Helm chart's ``crds/``
files (``python -m spotgpu.kube.crds deploy/chart/spotgpu/crds``; ``--check`` fails when they
are stale, as the test suite does). This module is the one source of the schemas: the chart
ships its output, the API double can validate objects against it.

Validation lives in the schema where the API server can enforce it (types, enums, minimums,
required fields, and CEL rules such as ``minAvailable <= replicas``) so a bad GangJob is refused
by ``kubectl apply`` instead of failing later in the controller.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from spotgpu.core.types import SpotPriority
from spotgpu.kube import resources as r

JSON = dict[str, Any]

_CONDITION: Final[JSON] = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": {"type": "string", "maxLength": 316},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string", "maxLength": 1024},
        "message": {"type": "string", "maxLength": 32768},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
    },
}

_CONDITIONS: Final[JSON] = {
    "type": "array",
    "items": _CONDITION,
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}

_GPU_QUANTITY: Final[JSON] = {
    "x-kubernetes-int-or-string": True,
    "pattern": r"^([0-9]+(\.[0-9]+)?|[0-9]+m)$",
    "description": "GPUs: whole (4), fractional ('2.5') or milli ('500m').",
}


_DURATION: Final[JSON] = {
    "x-kubernetes-int-or-string": True,
    "pattern": r"^([0-9]+(\.[0-9]+)?(h|m|s|ms))+$",
    "description": "A duration: Go style ('90s', '30m', '1h30m') or whole seconds (>= 0).",
}


def _lease_fields(what: str) -> JSON:
    return {
        "minLease": {
            **_DURATION,
            "description": f"Spot only: run {what} only on GPUs expected to stay available this long: unallocated "
            "GPUs, or lent GPUs whose owner's idle forecast (p20) covers it. " + _DURATION["description"],
        },
        "checkpointInterval": {
            **_DURATION,
            "description": f"Spot only: how often {what} checkpoints; lent GPUs whose idle forecast best fits "
            "max(minLease, checkpointInterval) are preferred. " + _DURATION["description"],
        },
    }


def _crd(kind: str, plural: str, scope: str, schema: JSON, *, columns: list[JSON], short: list[str]) -> JSON:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{r.GROUP}", "labels": {"app.kubernetes.io/part-of": "spotgpu"}},
        "spec": {
            "group": r.GROUP,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short,
                "categories": ["spotgpu"],
            },
            "versions": [
                {
                    "name": r.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def _root(spec: JSON, status: JSON, description: str) -> JSON:
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


QUEUE_SCHEMA: Final[JSON] = _root(
    {
        "type": "object",
        "required": ["type"],
        "properties": {
            "type": {
                "type": "string",
                "enum": ["reserved", "spot"],
                "description": "spot: its gangs are spot tasks using platform/spot-gpu twins; reserved: real GPUs.",
            },
            "weight": {"type": "integer", "minimum": 1, "maximum": 65535, "default": 1},
            "capacity": _GPU_QUANTITY,
        },
    },
    {
        "type": "object",
        "properties": {
            "pending": {"type": "integer", "minimum": 0},
            "running": {"type": "integer", "minimum": 0},
        },
    },
    "A queue of PodGroups; its type decides whether they are spot or reserved work.",
)

PODGROUP_SCHEMA: Final[JSON] = _root(
    {
        "type": "object",
        "required": ["queue", "minMember"],
        "properties": {
            "queue": {"type": "string", "minLength": 1, "maxLength": 253},
            "minMember": {"type": "integer", "minimum": 1, "maximum": 10000},
            "priorityClassName": {"type": "string", "maxLength": 253},
            "pool": {"type": "string", "maxLength": 63},
            **_lease_fields("the gang"),
        },
    },
    {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": ["Pending", "Inqueue", "Running", "Evicted"]},
            "scheduled": {"type": "integer", "minimum": 0},
            "running": {"type": "integer", "minimum": 0},
            "conditions": _CONDITIONS,
        },
    },
    "A gang: at least minMember of its pods (label scheduling.spotgpu.io/pod-group) run together, or none.",
)

GANGJOB_SCHEMA: Final[JSON] = _root(
    {
        "type": "object",
        "required": ["template", "replicas"],
        "x-kubernetes-validations": [
            {
                "rule": "!has(self.minAvailable) || self.minAvailable <= self.replicas",
                "message": "minAvailable must not exceed replicas",
            }
        ],
        "properties": {
            "template": {
                "type": "object",
                "description": "The pod template of every member (a core/v1 PodTemplateSpec).",
                "required": ["spec"],
                "properties": {
                    "metadata": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "spec": {
                        "type": "object",
                        "required": ["containers"],
                        "x-kubernetes-preserve-unknown-fields": True,
                        "properties": {
                            "containers": {
                                "type": "array",
                                "minItems": 1,
                                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            }
                        },
                    },
                },
            },
            "replicas": {"type": "integer", "minimum": 1, "maximum": 10000},
            "minAvailable": {"type": "integer", "minimum": 1, "maximum": 10000},
            "queue": {"type": "string", "minLength": 1, "maxLength": 253, "default": r.DEFAULT_QUEUE},
            "priorityClassName": {
                "type": "string",
                "enum": [p.value for p in SpotPriority],
                "default": SpotPriority.SPOTMID.value,
            },
            "gpus": {
                "type": "integer",
                "minimum": 0,
                "maximum": 64,
                "description": "platform/spot-gpu twins per pod, set on the first container (0: as in the template).",
            },
            "retryLimit": {"type": "integer", "minimum": 0, "maximum": 1000, "default": r.DEFAULT_RETRY_LIMIT},
            "requeueBackoffSeconds": {
                "type": "integer",
                "minimum": 0,
                "maximum": r.MAX_REQUEUE_BACKOFF,
                "default": r.DEFAULT_REQUEUE_BACKOFF,
                "description": "Wait before the first requeue; doubles on every further eviction (capped at 600).",
            },
            **_lease_fields("the job"),
        },
    },
    {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": [p.value for p in r.GangJobPhase]},
            "attempt": {"type": "integer", "minimum": 0},
            "evictions": {"type": "integer", "minimum": 0},
            "retries": {"type": "integer", "minimum": 0},
            "podGroup": {"type": "string"},
            "running": {"type": "integer", "minimum": 0},
            "lastEvictionTime": {"type": "string", "format": "date-time"},
            "lastEvictionReason": {"type": "string"},
            "nextAttemptTime": {"type": "string", "format": "date-time"},
            "message": {"type": "string"},
            "observedGeneration": {"type": "integer"},
            "conditions": _CONDITIONS,
        },
    },
    "A spot job run as a gang: its pods are created, evicted gangs are torn down and requeued with backoff.",
)


def custom_resource_definitions() -> list[JSON]:
    """The three CRDs, in install order."""
    return [
        _crd(
            "Queue",
            "queues",
            "Cluster",
            QUEUE_SCHEMA,
            columns=[
                {"name": "Type", "type": "string", "jsonPath": ".spec.type"},
                {"name": "Weight", "type": "integer", "jsonPath": ".spec.weight"},
                {"name": "Capacity", "type": "string", "jsonPath": ".spec.capacity"},
                {"name": "Pending", "type": "integer", "jsonPath": ".status.pending"},
                {"name": "Running", "type": "integer", "jsonPath": ".status.running"},
            ],
            short=["sq"],
        ),
        _crd(
            "PodGroup",
            "podgroups",
            "Namespaced",
            PODGROUP_SCHEMA,
            columns=[
                {"name": "Queue", "type": "string", "jsonPath": ".spec.queue"},
                {"name": "MinMember", "type": "integer", "jsonPath": ".spec.minMember"},
                {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
            ],
            short=["spg"],
        ),
        _crd(
            "GangJob",
            "gangjobs",
            "Namespaced",
            GANGJOB_SCHEMA,
            columns=[
                {"name": "Queue", "type": "string", "jsonPath": ".spec.queue"},
                {"name": "Priority", "type": "string", "jsonPath": ".spec.priorityClassName"},
                {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                {"name": "Evictions", "type": "integer", "jsonPath": ".status.evictions"},
                {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
            ],
            short=["gj"],
        ),
    ]


def schemas() -> dict[tuple[str, str], JSON]:
    """``(group, plural) -> openAPIV3Schema``, for the API double's validation."""
    return {
        (crd["spec"]["group"], crd["spec"]["names"]["plural"]): crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for crd in custom_resource_definitions()
    }


def priority_classes() -> list[JSON]:
    """PriorityClasses spothigh/spotmid/spotlow (3000/2000/1000); spot pods never preempt others."""
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": p.value, "labels": {"app.kubernetes.io/part-of": "spotgpu"}},
            "value": p.value_int,
            "globalDefault": False,
            "preemptionPolicy": "Never",
            "description": f"spotgpu spot tier {p.value}: lower tiers are evicted first",
        }
        for p in SpotPriority
    ]


HEADER: Final = "# Generated by `python -m spotgpu.kube.crds`; do not edit (schemas live in spotgpu/kube/crds.py).\n"


def render_files() -> dict[str, str]:
    """File name -> YAML text of the chart's ``crds/`` directory."""
    return {
        f"{crd['spec']['names']['plural']}.{r.GROUP}.yaml": HEADER + yaml.safe_dump(crd, sort_keys=False, width=120)
        for crd in custom_resource_definitions()
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spotgpu.kube.crds", description="write the chart's CRD files")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--check", action="store_true", help="fail if the files differ instead of writing them")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render_files().items():
        path = args.directory / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            args.directory.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale CRD files (run python -m spotgpu.kube.crds DIR): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "GANGJOB_SCHEMA",
    "PODGROUP_SCHEMA",
    "QUEUE_SCHEMA",
    "custom_resource_definitions",
    "priority_classes",
    "render_files",
    "schemas",
]
