"""Fixtures for the Kubernetes integration tests.

No kube-apiserver can run here: every test talks, through the real client library (lightkube)
and real HTTP on 127.0.0.1, to :class:`spotgpu.testing.kubeapi.KubeApiServer`, a double that
speaks the Kubernetes REST and watch wire format and validates spotgpu's custom resources
against the CRDs' own schemas.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from spotgpu.kube import crds
from spotgpu.kube.client import Connection, connect
from spotgpu.testing.kubeapi import KubeApiServer


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer(crd_schemas=crds.schemas()) as server:
        yield server


@pytest.fixture
def conn(api: KubeApiServer) -> Iterator[Connection]:
    connection = connect(url=api.url, namespace="default", timeout=5.0)
    try:
        yield connection
    finally:
        connection.close()


@pytest.fixture
def leader() -> threading.Event:
    """Leadership as the loops under test see it (``may_act=leader.is_set``); set by default."""
    flag = threading.Event()
    flag.set()
    return flag
