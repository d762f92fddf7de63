"""Informers: list+watch of one kind of object into a local cache, the way client-go's reflector works.

Decides nothing; it keeps a cache fresh and tells handlers what changed. Side effects: one
background thread per informer making HTTP requests to the API server.

The protocol:

1. **List** the collection in pages (``limit``/``continue``); the list's ``metadata.resourceVersion``
   is where the watch resumes.
   The cache is replaced by the list, and handlers get ``ADDED``/``MODIFIED`` for new and
   changed objects and ``DELETED`` for objects that vanished while nobody watched.
2. **Watch** from that version (``allowWatchBookmarks``, a server-side ``timeoutSeconds``). Each
   event moves the version on; when the server ends the stream, or nothing arrives for
   ``idle_timeout`` seconds, the watch resumes from the last version, without a relist.
3. **410 Gone** (the server no longer keeps our version, as an ``ERROR`` event or HTTP status):
   relist (step 1). Other failures (connection refused, 5xx, 429): back off and resume.
4. **Resync** every ``resync`` seconds: every cached object is handed to the handlers again
   (``SYNC``), so level-triggered controllers repair anything a handler missed.

We read the stream ourselves over the connection's configured HTTP client (same server, TLS
and credentials as the lightkube client) because lightkube's ``watch`` restarts streams
internally and cannot be stopped or told to relist from outside.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import httpx2

from spotgpu.core.clock import Clock, SystemClock
from spotgpu.core.errors import TemporaryError
from spotgpu.kube.client import Backoff, Connection, Gone, KubeApiError, error_from_status, json_answer, translate

log = logging.getLogger(__name__)

JSON = dict[str, Any]


class EventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    SYNC = "SYNC"
    """A resync: the object did not change; it is handed over again."""


Handler = Callable[[EventType, JSON], None]


def collection_path(group: str, version: str, plural: str, namespace: str | None = None) -> str:
    """The REST path of a collection: ``/api/v1/pods``, ``/apis/<group>/<version>/namespaces/<ns>/<plural>``."""
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` (or ``name`` for cluster-scoped objects), client-go's cache key."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


@dataclass(frozen=True, slots=True)
class WatchTarget:
    """What to list and watch."""

    name: str
    """For logs and metrics, e.g. ``pods``."""
    path: str
    label_selector: str | None = None
    field_selector: str | None = None

    def params(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.label_selector:
            out["labelSelector"] = self.label_selector
        if self.field_selector:
            out["fieldSelector"] = self.field_selector
        return out


class Store:
    """A thread-safe cache of objects by key; values are the API's JSON, never mutated in place."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, JSON] = {}

    def get(self, key: str) -> JSON | None:
        with self._lock:
            return self._items.get(key)

    def items(self) -> list[JSON]:
        with self._lock:
            return list(self._items.values())

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._items)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def upsert(self, obj: JSON) -> JSON | None:
        with self._lock:
            key = object_key(obj)
            old = self._items.get(key)
            self._items[key] = obj
            return old

    def delete(self, obj: JSON) -> JSON | None:
        with self._lock:
            return self._items.pop(object_key(obj), None)

    def replace(self, objs: Iterable[JSON]) -> tuple[list[JSON], list[JSON], list[JSON]]:
        """Replace everything; returns (added, changed, removed)."""
        new = {object_key(o): o for o in objs}
        with self._lock:
            old = self._items
            self._items = new
        added = [o for k, o in new.items() if k not in old]
        changed = [o for k, o in new.items() if k in old and _rv(old[k]) != _rv(o)]
        removed = [o for k, o in old.items() if k not in new]
        return added, changed, removed


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


@dataclass(slots=True)
class InformerStats:
    lists: int = 0
    relists_gone: int = 0
    watches: int = 0
    events: int = 0
    errors: int = 0


DEFAULT_RESYNC: Final = 300.0
WATCH_BACKOFF: Final = Backoff(base=0.2, cap=10.0, attempts=0)


class Informer:
    """List+watch one :class:`WatchTarget` into a :class:`Store` on a background thread."""

    def __init__(
        self,
        connection: Connection,
        target: WatchTarget,
        *,
        handlers: Iterable[Handler] = (),
        resync: float = DEFAULT_RESYNC,
        idle_timeout: float = 30.0,
        watch_timeout: int = 300,
        backoff: Backoff = WATCH_BACKOFF,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        page_size: int = 500,
    ) -> None:
        self.target = target
        self._page_size = page_size
        self.store = Store()
        self.stats = InformerStats()
        self._connection = connection
        self._handlers = list(handlers)
        self._resync = resync
        self._idle_timeout = idle_timeout
        self._watch_timeout = watch_timeout
        self._backoff = backoff
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._rv: str | None = None
        self._last_resync = 0.0
        self.last_error: KubeApiError | None = None

    # ----------------------------------------------------------------- control

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    def start(self) -> Informer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"informer-{self.target.name}", daemon=True)
            self._thread.start()
        return self

    def signal_stop(self) -> None:
        """Ask the thread to stop without waiting (stop several informers at once, then join)."""
        self._stop.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread; it notices within ``idle_timeout`` at worst (a blocked stream read)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._idle_timeout + 5.0 if timeout is None else timeout)

    def wait_synced(self, timeout: float) -> bool:
        """True once the first list has been loaded into the cache."""
        return self._synced.wait(timeout)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    @property
    def resource_version(self) -> str | None:
        return self._rv

    # ----------------------------------------------------------------- loop

    def _run(self) -> None:
        failures = 0
        with self._connection.http(read_timeout=self._idle_timeout) as http:
            while not self._stop.is_set():
                try:
                    if self._rv is None:
                        self._list(http)
                    self._maybe_resync()
                    self._watch(http)
                    failures = 0
                except Gone:
                    self.stats.relists_gone += 1
                    log.info("%s: watch version %s expired (410 Gone); relisting", self.target.name, self._rv)
                    self._rv = None
                except httpx2.ReadTimeout:
                    continue  # idle stream: resume from the same version
                except Exception as exc:  # any failure: back off, resume; never let the thread die
                    err = translate(exc, f"watch {self.target.name}")
                    self.last_error = err
                    self.stats.errors += 1
                    failures += 1
                    if not isinstance(err, TemporaryError):
                        log.error("%s: %s", self.target.name, err)
                    else:
                        log.warning("%s: %s", self.target.name, err)
                    self._stop.wait(self._backoff.delay(failures, self._rng))

    def _list(self, http: httpx2.Client) -> None:
        """List in pages of ``page_size`` (one consistent version across pages; an expired
        continue token is a 410 and starts the list over)."""
        params = {**self.target.params(), "limit": str(self._page_size)}
        items: list[JSON] = []
        rv: str | None = None
        while True:
            resp = http.get(self.target.path, params=params)
            payload = json_answer(resp, f"list {self.target.name}")
            items.extend(payload.get("items") or [])
            meta = payload.get("metadata") or {}
            rv = rv or str(meta.get("resourceVersion") or "") or None
            if not meta.get("continue"):
                break
            params["continue"] = str(meta["continue"])
        self.stats.lists += 1
        added, changed, removed = self.store.replace(items)
        self._rv = rv
        if self._rv is None:
            raise KubeApiError(f"list {self.target.name}: the server returned no resourceVersion")
        self._synced.set()
        self._last_resync = self._clock.monotonic()
        for obj in added:
            self._dispatch(EventType.ADDED, obj)
        for obj in changed:
            self._dispatch(EventType.MODIFIED, obj)
        for obj in removed:
            self._dispatch(EventType.DELETED, obj)

    def _maybe_resync(self) -> None:
        if self._resync <= 0:
            return
        now = self._clock.monotonic()
        if now - self._last_resync >= self._resync:
            self._last_resync = now
            for obj in self.store.items():
                self._dispatch(EventType.SYNC, obj)

    def _watch(self, http: httpx2.Client) -> None:
        params = {
            **self.target.params(),
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self._watch_timeout),
            "resourceVersion": self._rv or "",
        }
        self.stats.watches += 1
        with http.stream("GET", self.target.path, params=params) as resp:
            if resp.status_code != 200:
                resp.read()
                json_answer(resp, f"watch {self.target.name}")
            for line in resp.iter_lines():
                if self._stop.is_set():
                    return
                if not line.strip():
                    continue
                self._handle_line(line)
                self._maybe_resync()

    def _handle_line(self, line: str) -> None:
        try:
            event = json.loads(line)
            kind = event["type"]
            obj = event["object"]
        except (ValueError, KeyError, TypeError) as exc:
            raise KubeApiError(f"watch {self.target.name}: malformed event {line[:200]!r}: {exc}") from None
        if kind == "ERROR":
            raise error_from_status(
                int(obj.get("code") or 0),
                str(obj.get("reason") or ""),
                str(obj.get("message") or ""),
                f"watch {self.target.name}",
            )
        self.stats.events += 1
        rv = _rv(obj)
        if kind == "BOOKMARK":
            self._rv = rv or self._rv
            return
        if kind in ("ADDED", "MODIFIED"):
            self.store.upsert(obj)
        elif kind == "DELETED":
            self.store.delete(obj)
        else:
            log.warning("%s: ignoring watch event of unknown type %r", self.target.name, kind)
            return
        self._rv = rv or self._rv
        self._dispatch(EventType(kind), obj)

    def _dispatch(self, kind: EventType, obj: JSON) -> None:
        for handler in self._handlers:
            try:
                handler(kind, obj)
            except Exception:  # a handler's bug must not stop the cache from being kept fresh
                log.exception("%s: handler %r failed on %s %s", self.target.name, handler, kind, object_key(obj))


def stop_all(informers: Iterable[Informer], *, wait: bool = True) -> None:
    """Signal every informer first, then (``wait``) join them: one idle timeout in all, not one each."""
    informers = list(informers)
    for informer in informers:
        informer.signal_stop()
    if wait:
        for informer in informers:
            informer.stop()


__all__ = [
    "DEFAULT_RESYNC",
    "stop_all",
    "EventType",
    "Handler",
    "Informer",
    "InformerStats",
    "Store",
    "WatchTarget",
    "collection_path",
    "object_key",
]
