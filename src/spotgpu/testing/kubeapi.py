"""An HTTP-level Kubernetes API double: real REST and watch wire format, in-memory storage.

No kube-apiserver can run on a test machine, so this stands in for one. Real clients
(lightkube, kubectl, client-go) talk to it over HTTP exactly as they would to a cluster:

* REST paths ``/api/v1/...`` and ``/apis/<group>/<version>/...``, namespaced and cluster-scoped,
  with ``status`` subresources, ``pods/binding``, ``pods/eviction`` and ``namespaces/<ns>/bindings``.
* ``resourceVersion`` on every object and list (one global counter, as etcd's revision);
  optimistic concurrency: a ``PUT`` or ``PATCH`` carrying a stale ``metadata.resourceVersion``
  gets ``409 Conflict``; creating an existing name gets ``409 AlreadyExists``.
* Watches (``?watch=true``): newline-delimited JSON events over a chunked response, resumed
  from ``resourceVersion``; without one (or ``0``) they start with synthetic ``ADDED`` events
  for the current state. A version older than the compaction horizon gets an ``ERROR`` event
  carrying a ``410 Gone`` Status, as the real server sends it (:meth:`KubeApiServer.compact`
  moves the horizon). Objects that stop or start matching a selector arrive as ``DELETED`` or
  ``ADDED``. ``timeoutSeconds`` ends a watch; :meth:`KubeApiServer.drop_watches` cuts them.
* Label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, existence) and field selectors
  (``metadata.name``, ``metadata.namespace``, ``spec.nodeName``, ``status.phase``, ``spec.schedulerName``).
* Patches: JSON merge patch, strategic merge patch (lists merged by key where Kubernetes
  declares a patch merge key: conditions by ``type``, containers by ``name``, ...), JSON patch
  (add, remove, replace, test).
* Binding copies the Binding's annotations onto the pod and sets ``spec.nodeName`` (409 when
  already bound); Eviction adds the ``DisruptionTarget`` condition and deletes the pod, or
  answers ``429`` while :meth:`KubeApiServer.block_evictions` says a disruption budget forbids it.
* Deletion honours finalizers (sets ``deletionTimestamp``; the object goes when they are
  removed) and cascades to dependents through ``ownerReferences`` (background garbage collection).
* Optional schema validation of custom resources with their CRDs' ``openAPIV3Schema``.

What it does not do: authentication and authorization (any request is allowed), admission,
defaulting of built-in types, namespace existence checks (any namespace is accepted),
server-side apply (415). Lists honour ``limit``/``continue``; a continue token taken before
the store changed answers 410 Expired (the double keeps no history to serve the old version from).

Test hooks (Python API, for the test acting as kubelet or controller manager): :meth:`put`,
:meth:`get`, :meth:`objects`, :meth:`mutate`, :meth:`remove`, :meth:`inject_fault`,
:meth:`requests` (a log of every request).

Side effects: one HTTP server thread plus one thread per connection on 127.0.0.1; stopped
by :meth:`KubeApiServer.stop` (or the context manager). ``python -m spotgpu.testing.kubeapi``
runs it standalone and writes a kubeconfig for other processes.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import datetime as dt
import http.server
import importlib
import json
import logging
import re
import socketserver
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self
from urllib.parse import parse_qs, urlsplit

import yaml

from spotgpu.core import keys

log = logging.getLogger(__name__)

JSON = dict[str, Any]

CRD_VERSION: Final = "v1alpha1"
"""Version of spotgpu's custom resources (kept equal to :data:`spotgpu.kube.resources.VERSION`)."""


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One REST resource the double serves."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


BUILTIN_TYPES: Final[tuple[ResourceType, ...]] = (
    ResourceType("", "v1", "pods", "Pod", True),
    ResourceType("", "v1", "nodes", "Node", False),
    ResourceType("", "v1", "namespaces", "Namespace", False),
    ResourceType("", "v1", "events", "Event", True, status_subresource=False),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, status_subresource=False),
    ResourceType("events.k8s.io", "v1", "events", "Event", True, status_subresource=False),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True, status_subresource=False),
    ResourceType("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, status_subresource=False),
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False),
    ResourceType(keys.API_GROUP, CRD_VERSION, "queues", "Queue", False),
    ResourceType(keys.API_GROUP, CRD_VERSION, "podgroups", "PodGroup", True),
    ResourceType(keys.API_GROUP, CRD_VERSION, "gangjobs", "GangJob", True),
)

# Strategic-merge-patch list merge keys of the fields our components patch (Kubernetes' patchMergeKey).
_MERGE_KEYS: Final = {
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "ownerReferences": "uid",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "tolerations": None,
}


class ApiFailure(Exception):
    """An error answer: a Kubernetes ``Status`` with HTTP code, reason and message."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> JSON:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


@dataclass(slots=True)
class Fault:
    """Answer matching requests with an error instead of serving them (``times`` left; -1 = always)."""

    method: str
    path: re.Pattern[str]
    code: int
    reason: str
    message: str
    times: int = 1
    hits: int = 0
    after_serving: bool = False
    """Serve the request, then answer the error anyway: a write whose answer got lost."""


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    query: Mapping[str, str]
    content_type: str
    body: Any


@dataclass(slots=True)
class _Event:
    rv: int
    rtype: ResourceType
    type: str
    old: JSON | None
    new: JSON


@dataclass(slots=True)
class _Store:
    objects: dict[tuple[ResourceType, str, str], JSON] = field(default_factory=dict)
    events: deque[_Event] = field(default_factory=deque)
    rv: int = 1
    horizon: int = 0
    """Watches from a version below this get 410 Gone."""


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rv(obj: JSON) -> str | None:
    value = obj.get("metadata", {}).get("resourceVersion")
    return None if value in (None, "") else str(value)


# --------------------------------------------------------------------------- selectors


_REQ_RE: Final = re.compile(
    r"^\s*(!?)([A-Za-z0-9_./-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9_./-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$"
)


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


@dataclass(frozen=True, slots=True)
class _Requirement:
    key: str
    op: str
    """``=``, ``!=``, ``in``, ``notin``, ``exists`` or ``!exists``."""
    values: frozenset[str] = frozenset()

    def __call__(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op == "exists":
            return value is not None
        if self.op == "!exists":
            return value is None
        if self.op in ("=", "in"):
            return value in self.values
        return value not in self.values


Selector = Callable[[Mapping[str, str]], bool]


def parse_label_selector(text: str) -> Selector:
    """A predicate for a Kubernetes label selector string; raises :class:`ApiFailure` (400) if malformed."""
    reqs: list[_Requirement] = []
    for part in _split_selector(text):
        m = _REQ_RE.match(part)
        if m is None:
            raise ApiFailure(400, "BadRequest", f"unable to parse requirement: {part!r}")
        neg, key, op, value, setop, values = m.groups()
        if op is not None:
            reqs.append(_Requirement(key, "!=" if op == "!=" else "=", frozenset({value})))
        elif setop is not None:
            reqs.append(_Requirement(key, setop, frozenset(v.strip() for v in values.split(",") if v.strip())))
        else:
            reqs.append(_Requirement(key, "!exists" if neg else "exists"))
    return lambda labels: all(r(labels) for r in reqs)


_FIELDS: Final[Mapping[str, tuple[str, str]]] = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "spec.nodeName": ("spec", "nodeName"),
    "spec.driver": ("spec", "driver"),
    "spec.schedulerName": ("spec", "schedulerName"),
    "status.phase": ("status", "phase"),
}


def _field(obj: JSON, path: tuple[str, str]) -> str:
    return str((obj.get(path[0]) or {}).get(path[1]) or "")


def parse_field_selector(text: str) -> Callable[[JSON], bool]:
    """A predicate for a field selector over the fields the real server supports for our kinds."""
    reqs: list[tuple[tuple[str, str], bool, str]] = []
    for part in _split_selector(text):
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if m is None:
            raise ApiFailure(400, "BadRequest", f"invalid field selector: {part!r}")
        name, op, value = m.groups()
        if name not in _FIELDS:
            raise ApiFailure(400, "BadRequest", f'field label not supported: "{name}"')
        reqs.append((_FIELDS[name], op == "!=", value))
    return lambda obj: all((_field(obj, path) == value) != negate for path, negate, value in reqs)


# --------------------------------------------------------------------------- patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch for the fields Kubernetes declares merge keys on; other lists are replaced."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and _MERGE_KEYS.get(key) and isinstance(result.get(key), list):
            mk = _MERGE_KEYS[key]
            merged = [copy.deepcopy(item) for item in result[key]]
            for item in value:
                if not isinstance(item, dict) or mk not in item:
                    merged.append(copy.deepcopy(item))
                    continue
                idx = next(
                    (i for i, old in enumerate(merged) if isinstance(old, dict) and old.get(mk) == item[mk]), None
                )
                if item.get("$patch") == "delete":
                    if idx is not None:
                        del merged[idx]
                elif idx is None:
                    merged.append(copy.deepcopy(item))
                else:
                    merged[idx] = strategic_merge_patch(merged[idx], item)
            result[key] = merged
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiFailure(422, "Invalid", f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test); raises :class:`ApiFailure` 422 when an op fails."""
    if not isinstance(ops, list):
        raise ApiFailure(400, "BadRequest", "a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiFailure(400, "BadRequest", f"malformed JSON patch operation {op!r}")
        parts = _pointer(op["path"])
        if not parts:
            raise ApiFailure(422, "Invalid", "JSON patch on the whole document is not supported")
        parent: Any = doc
        for p in parts[:-1]:
            try:
                parent = parent[int(p)] if isinstance(parent, list) else parent[p]
            except (KeyError, IndexError, ValueError):
                raise ApiFailure(422, "Invalid", f"JSON patch path {op['path']!r} does not exist") from None
        last = parts[-1]
        kind = op["op"]
        try:
            if kind == "test":
                current = parent[int(last)] if isinstance(parent, list) else parent[last]
                if current != op.get("value"):
                    raise ApiFailure(
                        422, "Invalid", f"JSON patch test failed at {op['path']!r}: {current!r} != {op.get('value')!r}"
                    )
            elif kind == "remove":
                if isinstance(parent, list):
                    del parent[int(last)]
                else:
                    del parent[last]
            elif kind in ("add", "replace"):
                value = copy.deepcopy(op.get("value"))
                if isinstance(parent, list):
                    if last == "-":
                        parent.append(value)
                    elif kind == "add":
                        parent.insert(int(last), value)
                    else:
                        parent[int(last)] = value
                else:
                    if kind == "replace" and last not in parent:
                        raise KeyError(last)
                    parent[last] = value
            else:
                raise ApiFailure(422, "Invalid", f"JSON patch op {kind!r} is not supported")
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiFailure(422, "Invalid", f"JSON patch {kind} at {op['path']!r} failed: path not found") from None
    return doc


# --------------------------------------------------------------------------- the server


class KubeApiServer:
    """The double; ``with KubeApiServer() as api: client = connect(url=api.url)``."""

    def __init__(
        self,
        *,
        types: Iterable[ResourceType] = BUILTIN_TYPES,
        host: str = "127.0.0.1",
        port: int = 0,
        max_events: int = 10_000,
        crd_schemas: Mapping[tuple[str, str], JSON] | None = None,
        graceful_pod_deletion: bool = False,
    ) -> None:
        self.graceful_pod_deletion = graceful_pod_deletion
        """Pods bound to a node and deleted with a grace period only get a ``deletionTimestamp``
        (as the real server does while the kubelet stops them); :meth:`remove` finishes them."""
        self._types = list(types)
        self._host = host
        self._port = port
        self._max_events = max_events
        self._store = _Store()
        self._cond = threading.Condition()
        self._faults: list[Fault] = []
        self._hooks: list[Callable[[RecordedRequest, JSON], None]] = []
        self._requests: list[RecordedRequest] = []
        self._eviction_blocks: dict[tuple[str, str], int] = {}
        self._watch_generation = 0
        self._closing = False
        self._server: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._validators: dict[tuple[str, str], Callable[[JSON], None]] = {}
        for (group, plural), schema in (crd_schemas or {}).items():
            self.add_schema(group, plural, schema)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        server = _HTTPServer((self._host, self._port), _Handler)
        server.api = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="kubeapi-double", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the API double is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def kubeconfig(self, namespace: str = "default") -> JSON:
        """A kubeconfig (as a mapping) that points a client at this server."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "double", "user": {}}],
            "contexts": [
                {"name": "double", "context": {"cluster": "double", "user": "double", "namespace": namespace}}
            ],
            "current-context": "double",
        }

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        path.write_text(yaml.safe_dump(self.kubeconfig(namespace)))
        return path

    # ----------------------------------------------------------------- test hooks

    def resource_type(self, group: str, plural: str) -> ResourceType:
        for rt in self._types:
            if rt.group == group and rt.plural == plural:
                return rt
        raise KeyError(f"unknown resource {plural}.{group or 'core'}")

    def _type_of_kind(self, api_version: str, kind: str) -> ResourceType:
        for rt in self._types:
            if rt.api_version == api_version and rt.kind == kind:
                return rt
        raise KeyError(f"unknown kind {kind} in {api_version}")

    def add_schema(self, group: str, plural: str, schema: JSON) -> None:
        """Validate created and updated objects of ``plural.group`` against an openAPIV3Schema."""
        # a test dependency (through kubernetes-validate), needed only when schemas are given
        jsonschema: Any = importlib.import_module("jsonschema")
        validator = jsonschema.Draft4Validator(_strip_k8s_extensions(schema))

        def validate(obj: JSON) -> None:
            errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
            if errors:
                causes = [{"field": ".".join(str(p) for p in e.absolute_path), "message": e.message} for e in errors]
                name = obj.get("metadata", {}).get("name", "")
                raise ApiFailure(
                    422,
                    "Invalid",
                    f"{plural}.{group} {name!r} is invalid: "
                    + "; ".join(f"{c['field']}: {c['message']}" for c in causes),
                    {"name": name, "group": group, "kind": plural, "causes": causes},
                )

        self._validators[(group, plural)] = validate

    def add_validator(self, group: str, plural: str, validate: Callable[[JSON], None]) -> None:
        """Check created and updated objects of ``plural.group`` with ``validate`` (raises :class:`ApiFailure`)."""
        self._validators[(group, plural)] = validate

    def put(self, obj: JSON) -> JSON:
        """Create or overwrite an object as a controller or kubelet would; returns the stored copy."""
        rt = self._type_of_kind(obj["apiVersion"], obj["kind"])
        meta = obj.setdefault("metadata", {})
        ns = meta.get("namespace", "") if rt.namespaced else ""
        with self._cond:
            existing = self._store.objects.get((rt, ns, meta["name"]))
            if existing is None:
                return self._create(rt, ns, copy.deepcopy(obj))
            new = copy.deepcopy(obj)
            new["metadata"] = {
                **existing["metadata"],
                **new["metadata"],
                "resourceVersion": existing["metadata"]["resourceVersion"],
            }
            return self._update(rt, ns, existing, new)

    def get(self, group: str, plural: str, name: str, namespace: str = "") -> JSON | None:
        rt = self.resource_type(group, plural)
        with self._cond:
            obj = self._store.objects.get((rt, namespace if rt.namespaced else "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def objects(self, group: str, plural: str, namespace: str | None = None) -> list[JSON]:
        rt = self.resource_type(group, plural)
        with self._cond:
            return [
                copy.deepcopy(o)
                for (t, ns, _), o in sorted(self._store.objects.items(), key=lambda kv: kv[0][1:])
                if t == rt and (namespace is None or ns == namespace)
            ]

    def mutate(self, group: str, plural: str, name: str, fn: Callable[[JSON], None], namespace: str = "") -> JSON:
        """Change an object in place (all of it, status too) and emit MODIFIED, as a kubelet's status update."""
        rt = self.resource_type(group, plural)
        ns = namespace if rt.namespaced else ""
        with self._cond:
            existing = self._store.objects.get((rt, ns, name))
            if existing is None:
                raise KeyError(f"{plural} {ns}/{name} not found")
            new = copy.deepcopy(existing)
            fn(new)
            return self._update(rt, ns, existing, new)

    def remove(self, group: str, plural: str, name: str, namespace: str = "") -> None:
        """Delete an object now, ignoring finalizers and grace (as a kubelet confirming termination)."""
        rt = self.resource_type(group, plural)
        ns = namespace if rt.namespaced else ""
        with self._cond:
            existing = self._store.objects.get((rt, ns, name))
            if existing is not None:
                self._purge(rt, ns, existing)

    def inject_fault(
        self,
        method: str,
        path_regex: str,
        code: int,
        *,
        reason: str = "",
        message: str = "",
        times: int = 1,
        after_serving: bool = False,
    ) -> Fault:
        """Answer the next ``times`` requests matching ``method`` and ``path_regex`` with a failure Status
        (``-1``: until ``times`` is set to 0). ``after_serving``: carry the request out first, as when
        an answer is lost on the way back. ``method`` ``WATCH`` matches watch requests only."""
        fault = Fault(
            method.upper(),
            re.compile(path_regex),
            code,
            reason or http.HTTPStatus(code).phrase.replace(" ", ""),
            message or f"injected {code}",
            times,
            after_serving=after_serving,
        )
        with self._cond:
            self._faults.append(fault)
        return fault

    def after_request(self, hook: Callable[[RecordedRequest, JSON], None]) -> None:
        """Call ``hook(request, answer)`` after each served REST request, under the store's lock (it
        may change the store through :meth:`put`, :meth:`mutate`, :meth:`remove`: e.g. between the
        pages of a list)."""
        with self._cond:
            self._hooks.append(hook)

    def block_evictions(self, namespace: str, name: str, times: int = 1) -> None:
        """The next ``times`` evictions of this pod answer 429, as a violated PodDisruptionBudget does."""
        with self._cond:
            self._eviction_blocks[(namespace, name)] = times

    def compact(self) -> int:
        """Forget the event history: any watch resumed from an older version now gets 410 Gone."""
        with self._cond:
            self._store.horizon = self._store.rv
            self._store.events.clear()
            return self._store.rv

    def drop_watches(self) -> None:
        """Cut every open watch connection (clients must resume from their last version)."""
        with self._cond:
            self._watch_generation += 1
            self._cond.notify_all()

    def requests(self, method: str | None = None, path_regex: str | None = None) -> list[RecordedRequest]:
        with self._cond:
            return [
                r
                for r in self._requests
                if (method is None or r.method == method.upper())
                and (path_regex is None or re.search(path_regex, r.path))
            ]

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._store.rv

    # ----------------------------------------------------------------- storage (lock held)

    def _bump(self) -> str:
        self._store.rv += 1
        return str(self._store.rv)

    def _emit(self, rt: ResourceType, kind: str, old: JSON | None, new: JSON) -> None:
        self._store.events.append(_Event(self._store.rv, rt, kind, copy.deepcopy(old), copy.deepcopy(new)))
        while len(self._store.events) > self._max_events:
            dropped = self._store.events.popleft()
            self._store.horizon = dropped.rv
        self._cond.notify_all()

    def _validate(self, rt: ResourceType, obj: JSON) -> None:
        validator = self._validators.get((rt.group, rt.plural))
        if validator is not None:
            validator(obj)

    def _create(self, rt: ResourceType, ns: str, obj: JSON) -> JSON:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise ApiFailure(
                    422,
                    "Invalid",
                    f"{rt.kind} is invalid: metadata.name: Required value: name or generateName is required",
                )
            meta["name"] = prefix + uuid.uuid4().hex[:5]
        name = meta["name"]
        if (rt, ns, name) in self._store.objects:
            raise ApiFailure(
                409, "AlreadyExists", f'{rt.plural} "{name}" already exists', {"name": name, "kind": rt.plural}
            )
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        if rt.namespaced:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now_iso()
        meta["generation"] = 1
        meta.pop("deletionTimestamp", None)
        if rt.kind == "Pod":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        self._validate(rt, obj)
        meta["resourceVersion"] = self._bump()
        self._store.objects[(rt, ns, name)] = obj
        self._emit(rt, "ADDED", None, obj)
        return copy.deepcopy(obj)

    def _update(self, rt: ResourceType, ns: str, old: JSON, new: JSON) -> JSON:
        meta = new.setdefault("metadata", {})
        name = old["metadata"]["name"]
        sent_rv = _rv(new)
        if sent_rv is not None and sent_rv != old["metadata"]["resourceVersion"]:
            raise ApiFailure(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {rt.plural} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                {"name": name, "kind": rt.plural},
            )
        for fixed in ("uid", "creationTimestamp", "name", "namespace", "deletionTimestamp"):
            if fixed in old["metadata"]:
                meta[fixed] = old["metadata"][fixed]
            else:
                meta.pop(fixed, None)
        new["apiVersion"] = rt.api_version
        new["kind"] = rt.kind
        generation = int(old["metadata"].get("generation", 1))
        if new.get("spec") != old.get("spec"):
            generation += 1
        meta["generation"] = generation
        if {**new, "metadata": {**meta, "resourceVersion": old["metadata"]["resourceVersion"]}} == old:
            return copy.deepcopy(old)  # a no-op update does not bump the version (as the real server)
        self._validate(rt, new)
        meta["resourceVersion"] = self._bump()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._store.objects.pop((rt, ns, name), None)
            self._emit(rt, "DELETED", old, new)
            self._collect_dependents(meta["uid"])
            return copy.deepcopy(new)
        self._store.objects[(rt, ns, name)] = new
        self._emit(rt, "MODIFIED", old, new)
        return copy.deepcopy(new)

    def _purge(self, rt: ResourceType, ns: str, obj: JSON) -> JSON:
        name = obj["metadata"]["name"]
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = self._bump()
        self._store.objects.pop((rt, ns, name), None)
        self._emit(rt, "DELETED", obj, gone)
        self._collect_dependents(obj["metadata"]["uid"])
        return gone

    def _delete(
        self, rt: ResourceType, ns: str, name: str, precondition_rv: str | None = None, grace: int | None = None
    ) -> JSON:
        obj = self._store.objects.get((rt, ns, name))
        if obj is None:
            raise _not_found(rt, name)
        if precondition_rv is not None and precondition_rv != obj["metadata"]["resourceVersion"]:
            raise ApiFailure(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on {rt.plural} {name!r}: Precondition failed: "
                f"ResourceVersion: Expected: {precondition_rv}, Actual: {obj['metadata']['resourceVersion']}",
            )
        if grace is None:
            grace = int(obj.get("spec", {}).get("terminationGracePeriodSeconds", 30)) if rt.kind == "Pod" else 0
        graceful = self.graceful_pod_deletion and rt.kind == "Pod" and grace > 0 and obj.get("spec", {}).get("nodeName")
        if obj["metadata"].get("finalizers") or graceful:
            if obj["metadata"].get("deletionTimestamp"):
                return copy.deepcopy(obj)
            new = copy.deepcopy(obj)
            new["metadata"]["deletionTimestamp"] = _now_iso()
            if graceful:
                new["metadata"]["deletionGracePeriodSeconds"] = grace
            new["metadata"]["resourceVersion"] = self._bump()
            self._store.objects[(rt, ns, name)] = new
            self._emit(rt, "MODIFIED", obj, new)
            return copy.deepcopy(new)
        return self._purge(rt, ns, obj)

    def _collect_dependents(self, owner_uid: str) -> None:
        dependents = [
            (key, obj)
            for key, obj in self._store.objects.items()
            if any(ref.get("uid") == owner_uid for ref in obj["metadata"].get("ownerReferences", ()))
        ]
        for (rt, ns, name), _ in dependents:
            if (rt, ns, name) in self._store.objects:
                self._delete(rt, ns, name)

    # ----------------------------------------------------------------- request handling

    def _check_fault(self, method: str, path: str, *, served: bool = False) -> None:
        for fault in self._faults:
            if fault.after_serving != served:
                continue
            if fault.times != 0 and fault.method in (method, "*") and fault.path.search(path):
                fault.hits += 1
                if fault.times > 0:
                    fault.times -= 1
                raise ApiFailure(fault.code, fault.reason, fault.message)

    def handle(
        self, method: str, path: str, query: Mapping[str, str], content_type: str, body: Any
    ) -> tuple[int, JSON]:
        """Serve one REST request: (HTTP code, JSON answer); raises :class:`ApiFailure` for errors."""
        with self._cond:
            self._requests.append(RecordedRequest(method, path, dict(query), content_type, copy.deepcopy(body)))
            self._check_fault(method, path)
            answer = self._serve(method, path, query, content_type, body)
            for hook in list(self._hooks):
                hook(self._requests[-1], answer[1])
            self._check_fault(method, path, served=True)
            return answer

    def _serve(
        self, method: str, path: str, query: Mapping[str, str], content_type: str, body: Any
    ) -> tuple[int, JSON]:
        with self._cond:
            if path in ("/version", "/version/"):
                return 200, {
                    "major": "1",
                    "minor": "33",
                    "gitVersion": "v1.33.0-spotgpu-double",
                    "platform": "linux/amd64",
                }
            rt, ns, name, sub = self._route(path)
            if method == "GET" and name is None:
                return 200, self._list(rt, ns, query)
            if name is None:
                if method != "POST":
                    raise ApiFailure(405, "MethodNotAllowed", f"{method} is not allowed on a {rt.plural} collection")
                if not isinstance(body, dict):
                    raise ApiFailure(400, "BadRequest", "request body must be a JSON object")
                if rt.plural == "bindings":  # the legacy namespaces/<ns>/bindings endpoint
                    return 201, self._bind(
                        self.resource_type("", "pods"), ns, str(body.get("metadata", {}).get("name")), body
                    )
                body_ns = body.get("metadata", {}).get("namespace")
                if rt.namespaced and body_ns not in (None, "", ns):
                    raise ApiFailure(
                        400,
                        "BadRequest",
                        f"the namespace of the provided object ({body_ns}) does not match the namespace "
                        f"sent on the request ({ns})",
                    )
                return 201, self._create(rt, ns, copy.deepcopy(body))
            key = (rt, ns, name)
            if sub == "binding" and method == "POST":
                return 201, self._bind(rt, ns, name, body)
            if sub == "eviction" and method == "POST":
                return 201, self._evict(rt, ns, name, body)
            if sub not in (None, "status"):
                raise ApiFailure(404, "NotFound", f"the server could not find the requested resource ({sub})")
            if sub == "status" and not rt.status_subresource:
                raise ApiFailure(404, "NotFound", f"{rt.plural} has no status subresource")
            if method == "GET":
                obj = self._store.objects.get(key)
                if obj is None:
                    raise _not_found(rt, name)
                return 200, copy.deepcopy(obj)
            if method == "DELETE":
                opts = body if isinstance(body, dict) else {}
                pre = (opts.get("preconditions") or {}).get("resourceVersion")
                grace = opts.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
                return 200, self._delete(rt, ns, name, pre, None if grace is None else int(grace))
            existing = self._store.objects.get(key)
            if existing is None:
                raise _not_found(rt, name)
            if method == "PUT":
                if not isinstance(body, dict):
                    raise ApiFailure(400, "BadRequest", "request body must be a JSON object")
                return 200, self._update(rt, ns, existing, _scoped(rt, existing, copy.deepcopy(body), sub == "status"))
            if method == "PATCH":
                return 200, self._patch(rt, ns, existing, content_type, body, status_only=sub == "status")
            raise ApiFailure(405, "MethodNotAllowed", f"{method} is not allowed")

    def _route(self, path: str) -> tuple[ResourceType, str, str | None, str | None]:
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, rest = "", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, rest = parts[1], parts[3:]
        else:
            raise ApiFailure(404, "NotFound", f"the server could not find the requested resource ({path})")
        ns = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise ApiFailure(404, "NotFound", f"the server could not find the requested resource ({path})")
        plural = rest[0]
        if group == "" and plural == "bindings" and ns:
            return ResourceType("", "v1", "bindings", "Binding", True, False), ns, None, None
        try:
            rt = self.resource_type(group, plural)
        except KeyError:
            raise ApiFailure(404, "NotFound", f"the server could not find the requested resource ({path})") from None
        if rt.namespaced and not ns and len(rest) > 1:
            raise ApiFailure(404, "NotFound", f"{rt.plural} is namespaced: use /namespaces/<ns>/{rt.plural}")
        name = rest[1] if len(rest) >= 2 else None
        sub = rest[2] if len(rest) == 3 else None
        return rt, ns, name, sub

    def _list(self, rt: ResourceType, ns: str, query: Mapping[str, str]) -> JSON:
        labels = parse_label_selector(query["labelSelector"]) if query.get("labelSelector") else None
        fields = parse_field_selector(query["fieldSelector"]) if query.get("fieldSelector") else None
        items = [
            copy.deepcopy(obj)
            for (t, ons, _), obj in sorted(self._store.objects.items(), key=lambda kv: kv[0][1:])
            if t == rt and (not ns or ons == ns) and _matches(obj, labels, fields)
        ]
        meta: JSON = {"resourceVersion": str(self._store.rv)}
        offset = 0
        if query.get("continue"):
            # a page of a list taken at one version; the double keeps no history, so a token from
            # an older version has expired (a real server answers the same once it compacted)
            try:
                token = json.loads(base64.urlsafe_b64decode(query["continue"].encode()))
                token_rv, offset = int(token["rv"]), int(token["start"])
            except (ValueError, KeyError, TypeError):
                raise ApiFailure(400, "BadRequest", "invalid continue token") from None
            if token_rv != self._store.rv:
                raise ApiFailure(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result. "
                    "You can start a new list without the continue parameter.",
                )
        limit = int(query.get("limit") or 0)
        if limit > 0 and len(items) - offset > limit:
            token_json = json.dumps({"rv": self._store.rv, "start": offset + limit}).encode()
            meta["continue"] = base64.urlsafe_b64encode(token_json).decode()
            meta["remainingItemCount"] = len(items) - offset - limit
        items = items[offset : offset + limit] if limit > 0 else items[offset:]
        return {"kind": rt.kind + "List", "apiVersion": rt.api_version, "metadata": meta, "items": items}

    def _patch(
        self, rt: ResourceType, ns: str, existing: JSON, content_type: str, body: Any, *, status_only: bool
    ) -> JSON:
        ctype = content_type.split(";", maxsplit=1)[0].strip()
        if ctype == "application/merge-patch+json":
            new = merge_patch(existing, body)
        elif ctype == "application/strategic-merge-patch+json":
            if rt.group not in ("", "apps", "batch", "policy", "coordination.k8s.io", "scheduling.k8s.io"):
                raise ApiFailure(
                    415, "UnsupportedMediaType", "strategic merge patch is not supported for custom resources"
                )
            new = strategic_merge_patch(existing, body)
        elif ctype == "application/json-patch+json":
            new = json_patch(existing, body)
        else:
            raise ApiFailure(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, "
                f"application/strategic-merge-patch+json (got {content_type!r})",
            )
        if not isinstance(new, dict):
            raise ApiFailure(422, "Invalid", "a patch must leave an object")
        if _rv(new) == _rv(existing):  # the patch named no version: unconditional
            new.setdefault("metadata", {}).pop("resourceVersion", None)
        return self._update(rt, ns, existing, _scoped(rt, existing, new, status_only))

    def _bind(self, rt: ResourceType, ns: str, name: str, body: Any) -> JSON:
        if not isinstance(body, dict) or not isinstance(body.get("target"), dict) or not body["target"].get("name"):
            raise ApiFailure(422, "Invalid", "Binding is invalid: target.name: Required value")
        pod = self._store.objects.get((rt, ns, name))
        if pod is None:
            raise _not_found(rt, name)
        node = body["target"]["name"]
        current = pod.get("spec", {}).get("nodeName")
        if current:
            raise ApiFailure(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": '
                f'pod {name} is already assigned to node "{current}"',
            )
        if pod["metadata"].get("deletionTimestamp"):
            raise ApiFailure(409, "Conflict", f"pod {name} is being deleted, cannot be assigned to a host")
        new = copy.deepcopy(pod)
        new.setdefault("spec", {})["nodeName"] = node
        annotations = body.get("metadata", {}).get("annotations") or {}
        if annotations:
            new["metadata"].setdefault("annotations", {}).update(annotations)
        conditions = [c for c in new.setdefault("status", {}).get("conditions", []) if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": _now_iso()})
        new["status"]["conditions"] = conditions
        new["metadata"].pop("resourceVersion", None)
        self._update(rt, ns, pod, new)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _evict(self, rt: ResourceType, ns: str, name: str, body: Any) -> JSON:
        pod = self._store.objects.get((rt, ns, name))
        if pod is None:
            raise _not_found(rt, name)
        blocked = self._eviction_blocks.get((ns, name), 0)
        if blocked:
            self._eviction_blocks[(ns, name)] = blocked - 1
            raise ApiFailure(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                {"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget needs 1 healthy pods"}]},
            )
        if not pod["metadata"].get("deletionTimestamp"):
            new = copy.deepcopy(pod)
            conditions = [
                c
                for c in new.setdefault("status", {}).get("conditions", [])
                if c.get("type") != keys.DISRUPTION_CONDITION
            ]
            conditions.append(
                {
                    "type": keys.DISRUPTION_CONDITION,
                    "status": "True",
                    "reason": "EvictionByEvictionAPI",
                    "message": "Eviction API: evicting",
                    "lastTransitionTime": _now_iso(),
                }
            )
            new["status"]["conditions"] = conditions
            new["metadata"].pop("resourceVersion", None)
            pod = self._update(rt, ns, pod, new)
        self._delete(rt, ns, name)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    # ----------------------------------------------------------------- watches

    def watch(self, path: str, query: Mapping[str, str]) -> Iterator[JSON | None]:
        """Yield watch events for a request (``None`` = keep-alive tick so the handler can notice shutdown)."""
        with self._cond:
            self._requests.append(RecordedRequest("GET", path, dict(query), "", None))
            self._check_fault("WATCH", path)
            rt, ns, name, sub = self._route(path)
            if name is not None or sub is not None:
                raise ApiFailure(405, "MethodNotAllowed", "watch a collection (use fieldSelector=metadata.name=...)")
            labels = parse_label_selector(query["labelSelector"]) if query.get("labelSelector") else None
            fields = parse_field_selector(query["fieldSelector"]) if query.get("fieldSelector") else None
            timeout = float(query.get("timeoutSeconds") or 1800)
            rv_text = query.get("resourceVersion", "")
            generation = self._watch_generation
            pending: list[JSON] = []
            if rv_text in ("", "0"):
                since = self._store.rv
                for (t, ons, _), obj in sorted(self._store.objects.items(), key=lambda kv: kv[0][1:]):
                    if t == rt and (not ns or ons == ns) and _matches(obj, labels, fields):
                        pending.append({"type": "ADDED", "object": copy.deepcopy(obj)})
            else:
                try:
                    since = int(rv_text)
                except ValueError:
                    raise ApiFailure(400, "BadRequest", f"invalid resourceVersion {rv_text!r}") from None
                if since < self._store.horizon:
                    gone = ApiFailure(
                        410, "Expired", f"too old resource version: {since} ({self._store.horizon})"
                    ).status()
                    pending.append({"type": "ERROR", "object": gone})
                    since = -1
        deadline = time.monotonic() + timeout
        yield from pending
        if since < 0:
            return
        while True:
            with self._cond:
                batch = []
                for ev in self._store.events:
                    if ev.rv <= since or ev.rtype != rt:
                        continue
                    ev_ns = ev.new.get("metadata", {}).get("namespace", "")
                    if ns and ev_ns != ns:
                        continue
                    kind = _selected_event(ev, labels, fields)
                    if kind is not None:
                        batch.append({"type": kind, "object": copy.deepcopy(ev.new)})
                if self._store.events:
                    since = max(since, self._store.events[-1].rv)
                if not batch:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._closing or generation != self._watch_generation:
                        return
                    self._cond.wait(timeout=min(remaining, 0.25))
            if batch:
                yield from batch
            else:
                yield None


def _scoped(rt: ResourceType, existing: JSON, new: JSON, status_only: bool) -> JSON:
    """What a write may change: only ``status`` through the status subresource, all but it otherwise."""
    if status_only:
        scoped = copy.deepcopy(existing)
        scoped["status"] = new.get("status")
        scoped["metadata"].pop("resourceVersion", None)
        if _rv(new) is not None:
            scoped["metadata"]["resourceVersion"] = _rv(new)
        return scoped
    if rt.status_subresource and "status" in existing:
        new["status"] = copy.deepcopy(existing["status"])
    return new


def _strip_k8s_extensions(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _strip_k8s_extensions(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
        if schema.get("x-kubernetes-preserve-unknown-fields") and "type" not in out:
            out["type"] = "object"
        if schema.get("x-kubernetes-int-or-string"):
            out.pop("type", None)
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if out.pop("nullable", False) and "type" in out:
            out["type"] = [out["type"], "null"]
        return out
    if isinstance(schema, list):
        return [_strip_k8s_extensions(v) for v in schema]
    return schema


def _matches(
    obj: JSON, labels: Callable[[Mapping[str, str]], bool] | None, fields: Callable[[JSON], bool] | None
) -> bool:
    if labels is not None and not labels(obj.get("metadata", {}).get("labels") or {}):
        return False
    return fields is None or fields(obj)


def _selected_event(ev: _Event, labels: Any, fields: Any) -> str | None:
    new_match = _matches(ev.new, labels, fields)
    if ev.type == "DELETED":
        return "DELETED" if (ev.old is None or _matches(ev.old, labels, fields) or new_match) else None
    old_match = ev.old is not None and _matches(ev.old, labels, fields)
    if ev.type == "ADDED":
        return "ADDED" if new_match else None
    if new_match and old_match:
        return "MODIFIED"
    if new_match:
        return "ADDED"
    if old_match:
        return "DELETED"
    return None


def _not_found(rt: ResourceType, name: str) -> ApiFailure:
    group = f".{rt.group}" if rt.group else ""
    return ApiFailure(
        404, "NotFound", f'{rt.plural}{group} "{name}" not found', {"name": name, "group": rt.group, "kind": rt.plural}
    )


class _HTTPServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # socketserver's 5 drops SYNs of parallel clients: 1 s retransmit stalls
    api: KubeApiServer


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes: no 40 ms delayed-ACK stall
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("kubeapi double: " + format, *args)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ApiFailure(400, "BadRequest", f"request body is not JSON: {exc}") from None

    def _send(self, code: int, payload: JSON) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            body = self._body()
            if method == "GET" and query.get("watch") in ("true", "1"):
                self._stream(url.path, query)
                return
            code, payload = self.server.api.handle(method, url.path, query, self.headers.get("Content-Type", ""), body)
        except ApiFailure as exc:
            code, payload = exc.code, exc.status()
        except Exception as exc:  # a bug in the double must show up as a 500, not a hung client
            log.exception("kubeapi double failed on %s %s", method, self.path)
            code, payload = 500, ApiFailure(500, "InternalError", f"double: {exc!r}").status()
        self._send(code, payload)

    def _stream(self, path: str, query: Mapping[str, str]) -> None:
        events = self.server.api.watch(path, query)
        first = next(events, None)  # raises ApiFailure before any byte is written
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in _prepend(first, events):
                if event is None:
                    continue
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away; a finished stream keeps the connection

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


def _prepend(first: JSON | None, rest: Iterator[JSON | None]) -> Iterator[JSON | None]:
    yield first
    yield from rest


def main(argv: Sequence[str] | None = None) -> int:
    """Run the double standalone (for the node end-to-end harness and manual use)."""
    parser = argparse.ArgumentParser(prog="python -m spotgpu.testing.kubeapi", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--kubeconfig", type=Path, required=True, help="write a kubeconfig pointing at the double here")
    parser.add_argument(
        "--load", type=Path, action="append", default=[], help="YAML file(s) of objects to create first"
    )
    args = parser.parse_args(argv)
    with KubeApiServer(port=args.port) as api:
        for path in args.load:
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    api.put(doc)
        api.write_kubeconfig(args.kubeconfig)
        print(api.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "BUILTIN_TYPES",
    "ApiFailure",
    "Fault",
    "KubeApiServer",
    "RecordedRequest",
    "ResourceType",
    "json_patch",
    "merge_patch",
    "parse_field_selector",
    "parse_label_selector",
    "strategic_merge_patch",
]
