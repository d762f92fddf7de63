"""The client layer: connecting to the Kubernetes API, error translation, retry with backoff.

Decides nothing about the cluster. Side effects: :func:`connect` reads the kubeconfig or the
in-cluster service account; :func:`retry` sleeps between attempts. Every other module of
:mod:`spotgpu.kube` reaches the API through a :class:`Connection`: typed writes through
``connection.client`` (a :class:`lightkube.Client`), list+watch through ``connection.http``
(the same configured HTTP client, see :mod:`spotgpu.kube.informer`).

Errors: every call wrapped in :func:`api_errors` raises a :class:`KubeApiError` subclass that
is a :class:`~spotgpu.core.errors.TemporaryError` when retrying can help (409 Conflict, 410
Gone, 429, 5xx, connection failures and timeouts) and a
:class:`~spotgpu.core.errors.PermanentError` otherwise (404, AlreadyExists, 400/422, 401/403),
with the operation, HTTP code and the server's reason and message in the text.
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import httpx2
from lightkube import ApiError, Client, KubeConfig
from lightkube.config.client_adapter import Client as http_client_for
from lightkube.config.client_adapter import ConnectionParams
from lightkube.config.kubeconfig import SingleConfig
from lightkube.config.models import Cluster, User

from spotgpu.core.errors import PermanentError, SpotgpuError, TemporaryError

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TIMEOUT: Final = 10.0


class KubeApiError(SpotgpuError):
    """An API call failed; ``code`` is the HTTP status (0 when no answer came)."""

    def __init__(self, message: str, *, code: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


class NotFound(KubeApiError, PermanentError):
    """404: the object does not exist (often success for deletes)."""


class AlreadyExists(KubeApiError, PermanentError):
    """409 AlreadyExists on create."""


class Conflict(KubeApiError, TemporaryError):
    """409 Conflict: the object changed since it was read; re-read and try again."""


class Gone(KubeApiError, TemporaryError):
    """410 Gone: a watch's resourceVersion is older than the server keeps; relist."""


class TooManyRequests(KubeApiError, TemporaryError):
    """429: throttled, or an eviction a PodDisruptionBudget forbids for now."""


class ServerError(KubeApiError, TemporaryError):
    """5xx, or no answer at all (connection refused, timeout)."""


class Rejected(KubeApiError, PermanentError):
    """400, 401, 403, 405, 415, 422: the request itself is wrong or not allowed."""


def error_from_status(code: int, reason: str, message: str, what: str) -> KubeApiError:
    """The :class:`KubeApiError` for an HTTP status and a Status object's reason and message."""
    text = f"{what}: {code} {reason}: {message}".rstrip(": ")
    cls: type[KubeApiError]
    if code == 404:
        cls = NotFound
    elif code == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
    elif code == 410:
        cls = Gone
    elif code == 429:
        cls = TooManyRequests
    elif code >= 500 or code == 0:
        cls = ServerError
    else:
        cls = Rejected
    return cls(text, code=code, reason=reason)


def no_answer_cause(exc: BaseException) -> str:
    """Why no answer came, in words (``connection refused``, ``timed out``, the TLS or DNS error)."""
    if isinstance(exc, httpx2.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    text = str(exc).strip()
    if text.startswith("[Errno") and "] " in text:
        text = text.split("] ", 1)[1]
    return (text[:1].lower() + text[1:]) if text else type(exc).__name__


def translate(exc: BaseException, what: str) -> KubeApiError:
    """Map a lightkube/httpx exception to our taxonomy."""
    if isinstance(exc, KubeApiError):
        return exc
    if isinstance(exc, ApiError):
        status = exc.status
        return error_from_status(int(status.code or 0), status.reason or "", status.message or "", what)
    if isinstance(exc, httpx2.HTTPStatusError):
        return error_from_status(exc.response.status_code, exc.response.reason_phrase, exc.response.text[:200], what)
    return ServerError(
        f"{what}: no answer from the API server: {no_answer_cause(exc)}", code=0, reason=type(exc).__name__
    )


@contextmanager
def api_errors(what: str) -> Iterator[None]:
    """Translate any API failure inside the block into a :class:`KubeApiError` naming ``what``."""
    try:
        yield
    except (ApiError, httpx2.HTTPError, OSError) as exc:
        raise translate(exc, what) from exc


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter: attempt n waits ``uniform(0, min(cap, base * 2**n))``."""

    base: float = 0.2
    cap: float = 10.0
    attempts: int = 6
    """Total tries (the first included); ``0`` retries forever."""

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.cap, self.base * (2.0**attempt)))


@dataclass(slots=True)
class Retrier:
    """Runs an operation again on :class:`~spotgpu.core.errors.TemporaryError`, sleeping with backoff."""

    backoff: Backoff = field(default_factory=Backoff)
    rng: random.Random = field(default_factory=random.Random)
    sleep: Callable[[float], None] = time.sleep
    on_retry: Callable[[str, BaseException], None] | None = None

    def __call__(self, what: str, op: Callable[[], T]) -> T:
        attempt = 0
        while True:
            try:
                with api_errors(what):
                    return op()
            except TemporaryError as exc:
                attempt += 1
                if self.backoff.attempts and attempt >= self.backoff.attempts:
                    raise
                if self.on_retry is not None:
                    self.on_retry(what, exc)
                delay = self.backoff.delay(attempt, self.rng)
                log.info("%s: %s; retry %d in %.2fs", what, exc, attempt, delay)
                self.sleep(delay)


def json_answer(resp: httpx2.Response, what: str) -> dict[str, Any]:
    """The JSON object of a response, or the :class:`KubeApiError` its status and Status body mean."""
    try:
        payload = resp.json()
    except ValueError:
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    if resp.status_code >= 300:
        raise error_from_status(
            resp.status_code,
            str(payload.get("reason") or resp.reason_phrase),
            str(payload.get("message") or resp.text[:200]),
            what,
        )
    return payload


@dataclass(frozen=True, slots=True)
class Connection:
    """A configured API connection: typed client plus the settings to open raw watch streams."""

    config: SingleConfig
    client: Client
    rest: httpx2.Client
    """Raw JSON requests with the same server, TLS and credentials (for endpoints whose answer
    is a ``Status`` lightkube's typed decoding cannot take, such as ``pods/binding``)."""
    timeout: float = DEFAULT_TIMEOUT

    def http(self, read_timeout: float) -> httpx2.Client:
        """A new HTTP client with the same server, TLS and credentials, for long-running watches."""
        params = ConnectionParams(timeout=httpx2.Timeout(self.timeout, read=read_timeout))
        return http_client_for(self.config, params)

    def post(self, path: str, body: Mapping[str, object], what: str) -> dict[str, Any]:
        """POST ``body`` as JSON to ``path``; the answer's JSON, or a :class:`KubeApiError` naming
        ``what`` and the server."""
        what = f"{what} at {self.server}"
        with api_errors(what):
            resp = self.rest.post(path, json=dict(body))
        return json_answer(resp, what)

    def get(self, path: str, params: Mapping[str, str], what: str) -> dict[str, Any]:
        """GET ``path`` as raw JSON (lists stay plain JSON: no typed decoding of every item); errors
        name ``what`` and the server."""
        what = f"{what} at {self.server}"
        with api_errors(what):
            resp = self.rest.get(path, params=dict(params))
        return json_answer(resp, what)

    @property
    def server(self) -> str:
        """The API server's URL (error messages name it)."""
        return str(self.config.cluster.server)

    @property
    def namespace(self) -> str:
        return str(self.client.namespace)

    def close(self) -> None:
        self.client.close()
        self.rest.close()


def connect(
    *,
    url: str | None = None,
    kubeconfig: Path | None = None,
    context: str | None = None,
    namespace: str | None = None,
    field_manager: str = "spotgpu",
    timeout: float = DEFAULT_TIMEOUT,
) -> Connection:
    """Connect to the API: an explicit server ``url`` (no credentials; tests and proxies), a
    ``kubeconfig`` file (and ``context``), or else the environment: the in-cluster service
    account, ``$KUBECONFIG``, ``~/.kube/config``, in that order."""
    try:
        if url is not None:
            kc = KubeConfig.from_one(cluster=Cluster(server=url), user=User(), namespace=namespace)
        elif kubeconfig is not None:
            kc = KubeConfig.from_file(kubeconfig)
        else:
            kc = KubeConfig.from_env()
        single = kc.get(context_name=context) if context else kc.get()
        if single is None:
            raise PermanentError("no current context")
    except Exception as exc:
        source = (
            f"--server {url}" if url is not None else str(kubeconfig or "$KUBECONFIG, ~/.kube/config or in-cluster")
        )
        raise PermanentError(f"cannot load Kubernetes configuration from {source}: {exc}") from exc
    client = Client(
        config=single,
        namespace=namespace,
        timeout=httpx2.Timeout(timeout),
        field_manager=field_manager,
        lazy=False,
    )
    rest = http_client_for(single, ConnectionParams(timeout=httpx2.Timeout(timeout)))
    return Connection(single, client, rest, timeout)


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """``--kubeconfig``, ``--context``, ``--server``: how a CLI command reaches the cluster."""
    group = parser.add_argument_group("cluster connection (default: in-cluster, $KUBECONFIG, ~/.kube/config)")
    group.add_argument("--kubeconfig", type=Path, help="kubeconfig file")
    group.add_argument("--context", help="kubeconfig context")
    group.add_argument("--server", help="API server URL without credentials (a local proxy such as kubectl proxy)")
    group.add_argument("--request-timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per API request")


def connect_from_args(args: argparse.Namespace, field_manager: str, namespace: str | None = None) -> Connection:
    return connect(
        url=args.server,
        kubeconfig=args.kubeconfig,
        context=args.context,
        namespace=namespace,
        field_manager=field_manager,
        timeout=args.request_timeout,
    )


__all__ = [
    "add_connection_arguments",
    "connect_from_args",
    "AlreadyExists",
    "Backoff",
    "Conflict",
    "Connection",
    "Gone",
    "KubeApiError",
    "NotFound",
    "Rejected",
    "Retrier",
    "ServerError",
    "TooManyRequests",
    "api_errors",
    "connect",
    "error_from_status",
    "json_answer",
    "no_answer_cause",
    "translate",
]
