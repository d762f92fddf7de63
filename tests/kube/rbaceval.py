"""A small RBAC authorizer over rendered manifests, as the API server's RBAC authorizer decides.

A request is allowed when a ClusterRoleBinding (anywhere) or a RoleBinding in the request's
namespace binds the user, or a group the user is in, to a Role (of that namespace) or ClusterRole
with a rule matching the request's API group, resource (``pods/binding`` for a subresource), verb
and, where the rule names resources, its name. ``*`` matches anything (the chart uses none, and a
test says so). A service account's user is ``system:serviceaccount:<ns>:<name>``, in the groups
``system:serviceaccounts``, ``system:serviceaccounts:<ns>`` and ``system:authenticated``.
Aggregated ClusterRoles are refused (the chart defines none for its own components).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from spotgpu.testing.kubeapi import RecordedRequest

JSON = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Attributes:
    """What RBAC sees of a request."""

    verb: str
    group: str
    resource: str  # with its subresource: pods/binding
    namespace: str | None = None
    name: str | None = None


def attributes(r: RecordedRequest) -> Attributes:
    """The RBAC attributes of a request the API double recorded."""
    parts = [p for p in r.path.split("/") if p]
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespace = None
    if len(rest) > 2 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) == 3 else "")
    name = rest[1] if len(rest) >= 2 else None
    verb = {
        "GET": "get" if name else ("watch" if "watch" in r.query else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }[r.method]
    return Attributes(verb, group, resource, namespace, name)


def service_account(namespace: str, name: str) -> tuple[str, frozenset[str]]:
    """The user name and groups of a service account's token."""
    groups = frozenset({"system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"})
    return f"system:serviceaccount:{namespace}:{name}", groups


def _binds(binding: JSON, user: str, groups: frozenset[str]) -> bool:
    for s in binding.get("subjects") or []:
        if s["kind"] == "ServiceAccount" and user == f"system:serviceaccount:{s['namespace']}:{s['name']}":
            return True
        if (s["kind"] == "User" and s["name"] == user) or (s["kind"] == "Group" and s["name"] in groups):
            return True
    return False


def _matches(rule: JSON, req: Attributes) -> bool:
    def has(key: str, value: str) -> bool:
        return value in rule.get(key, []) or "*" in rule.get(key, [])

    if not (has("verbs", req.verb) and has("apiGroups", req.group) and has("resources", req.resource)):
        return False
    names = rule.get("resourceNames") or []
    return not names or (req.name is not None and req.name in names)


def _role(docs: Iterable[JSON], kind: str, name: str, namespace: str | None) -> JSON | None:
    for d in docs:
        meta = d["metadata"]
        if d["kind"] == kind and meta["name"] == name and (kind == "ClusterRole" or meta.get("namespace") == namespace):
            if "aggregationRule" in d:
                raise ValueError(f"aggregated ClusterRole {name}: not modelled")
            return d
    return None


def allowed(docs: list[JSON], user: str, groups: frozenset[str], req: Attributes) -> bool:
    """Whether RBAC as rendered in ``docs`` allows ``user`` (in ``groups``) the request ``req``."""
    for binding in docs:
        kind = binding["kind"]
        if kind not in ("ClusterRoleBinding", "RoleBinding") or not _binds(binding, user, groups):
            continue
        where = binding["metadata"].get("namespace") if kind == "RoleBinding" else None
        if kind == "RoleBinding" and where != req.namespace:
            continue
        ref = binding["roleRef"]
        role = _role(docs, ref["kind"], ref["name"], where)
        if role is not None and any(_matches(rule, req) for rule in role.get("rules") or []):
            return True
    return False
