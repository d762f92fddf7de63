"""Informers against the HTTP API double: list+watch with resourceVersion, resume, 410 relist, resync.

The double speaks the real watch wire format (chunked newline-delimited JSON events, ERROR
events carrying a 410 Status), so this exercises exactly the code path a cluster would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from kubehelpers import wait_for

from spotgpu.core.clock import ManualClock
from spotgpu.kube.client import Backoff, Connection
from spotgpu.kube.informer import EventType, Informer, WatchTarget, collection_path
from spotgpu.testing.kubeapi import KubeApiServer, RecordedRequest


def pod(name: str, ns: str = "default", **labels: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[EventType, str]] = []
        self.lock = threading.Lock()

    def __call__(self, kind: EventType, obj: dict) -> None:
        with self.lock:
            self.events.append((kind, obj["metadata"]["name"]))

    def names(self, kind: EventType) -> list[str]:
        with self.lock:
            return [n for k, n in self.events if k is kind]


@pytest.fixture
def informer_factory(conn: Connection) -> Iterator[Callable[..., Informer]]:
    made: list[Informer] = []

    def make(**kwargs: object) -> Informer:
        target = kwargs.pop("target", WatchTarget("pods", collection_path("", "v1", "pods")))
        inf = Informer(conn, target, idle_timeout=0.3, backoff=Backoff(base=0.05, cap=0.2, attempts=0), **kwargs)  # type: ignore[arg-type]
        made.append(inf)
        return inf.start()

    yield make
    for inf in made:
        inf.stop()


def test_list_then_watch_keeps_the_cache(api: KubeApiServer, informer_factory: Callable[..., Informer]) -> None:
    api.put(pod("a"))
    rec = Recorder()
    inf = informer_factory(handlers=[rec])
    assert inf.wait_synced(5)
    assert inf.store.keys() == ["default/a"]
    api.put(pod("b"))
    api.mutate("", "pods", "a", lambda o: o["metadata"].setdefault("labels", {}).update(x="1"), namespace="default")
    api.remove("", "pods", "b", namespace="default")
    wait_for(lambda: rec.names(EventType.DELETED) == ["b"])
    assert rec.names(EventType.ADDED) == ["a", "b"]
    assert rec.names(EventType.MODIFIED) == ["a"]
    assert inf.store.get("default/a")["metadata"]["labels"] == {"x": "1"}
    assert inf.resource_version == str(api.resource_version)


def test_dropped_watch_resumes_from_its_version_without_relisting(
    api: KubeApiServer, informer_factory: Callable[..., Informer]
) -> None:
    def watch_versions() -> list[str | None]:
        return [r.query.get("resourceVersion") for r in api.requests("GET", r"/api/v1/pods$") if "watch" in r.query]

    inf = informer_factory()
    assert inf.wait_synced(5)
    wait_for(lambda: len(watch_versions()) == 1)
    api.drop_watches()
    api.put(pod("a"))
    wait_for(lambda: inf.store.keys() == ["default/a"])
    wait_for(lambda: len(watch_versions()) >= 2)
    assert inf.stats.lists == 1
    assert inf.stats.relists_gone == 0
    assert all(v not in ("", "0", None) for v in watch_versions())


def test_410_gone_relists_and_reports_what_changed_meanwhile(
    api: KubeApiServer, informer_factory: Callable[..., Informer]
) -> None:
    api.put(pod("stays"))
    api.put(pod("goes"))
    rec = Recorder()
    inf = informer_factory(handlers=[rec])
    assert inf.wait_synced(5)
    blocked = api.inject_fault("WATCH", r"/api/v1/pods$", 503, times=-1)  # keep the informer off the stream
    api.drop_watches()
    wait_for(lambda: blocked.hits >= 1)
    api.remove("", "pods", "goes", namespace="default")
    api.put(pod("new"))
    api.compact()  # the informer's version is now too old
    blocked.times = 0
    wait_for(lambda: inf.stats.relists_gone == 1)
    wait_for(lambda: inf.store.keys() == ["default/new", "default/stays"])
    assert "goes" in rec.names(EventType.DELETED)
    assert rec.names(EventType.ADDED) == ["goes", "stays", "new"] or rec.names(EventType.ADDED) == [
        "stays",
        "goes",
        "new",
    ]
    assert inf.stats.lists == 2
    assert inf.stats.errors >= 1  # the 503s, backed off and retried


def test_resync_hands_every_object_over_again(api: KubeApiServer, informer_factory: Callable[..., Informer]) -> None:
    api.put(pod("a"))
    clock = ManualClock()
    rec = Recorder()
    inf = informer_factory(handlers=[rec], resync=60.0, clock=clock)
    assert inf.wait_synced(5)
    clock.advance(61)
    api.drop_watches()  # wakes the loop, which resyncs before watching again
    wait_for(lambda: rec.names(EventType.SYNC) == ["a"])


def test_a_failing_handler_does_not_stop_the_informer(
    api: KubeApiServer, informer_factory: Callable[..., Informer]
) -> None:
    def broken(kind: EventType, obj: dict) -> None:
        raise RuntimeError("handler bug")

    rec = Recorder()
    inf = informer_factory(handlers=[broken, rec])
    assert inf.wait_synced(5)
    api.put(pod("a"))
    api.put(pod("b"))
    wait_for(lambda: rec.names(EventType.ADDED) == ["a", "b"])


def test_selectors_are_sent_and_respected(api: KubeApiServer, informer_factory: Callable[..., Informer]) -> None:
    target = WatchTarget("mine", collection_path("", "v1", "pods"), label_selector="team=x")
    inf = informer_factory(target=target)
    assert inf.wait_synced(5)
    api.put(pod("x1", team="x"))
    api.put(pod("y1", team="y"))
    wait_for(lambda: inf.store.keys() == ["default/x1"])
    api.mutate("", "pods", "x1", lambda o: o["metadata"]["labels"].update(team="y"), namespace="default")
    wait_for(lambda: inf.store.keys() == [])


def test_lists_are_paged_and_an_expired_continue_token_starts_over(
    api: KubeApiServer, informer_factory: Callable[..., Informer]
) -> None:
    for i in range(5):
        api.put(pod(f"p{i}"))
    interrupted = {"done": False}

    def change_after_first_page(request: RecordedRequest, answer: dict) -> None:
        if not interrupted["done"] and "continue" in answer.get("metadata", {}):
            interrupted["done"] = True
            api.put(pod("late"))  # the store moves: the next page's token has expired (410)

    api.after_request(change_after_first_page)
    inf = informer_factory(page_size=2)
    assert inf.wait_synced(5)
    assert inf.store.keys() == [f"default/{n}" for n in ("late", "p0", "p1", "p2", "p3", "p4")]
    pages = [r for r in api.requests("GET", r"/api/v1/pods$") if "watch" not in r.query]
    assert [r.query.get("limit") for r in pages] == ["2"] * len(pages)
    assert len(pages) == 1 + 1 + 3  # first page, the expired second page, then 3 pages of 6 objects
    assert inf.stats.relists_gone == 1
