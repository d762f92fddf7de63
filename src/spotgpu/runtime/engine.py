"""The spec engine: one ``create``'s spec in, the modified spec (or a refusal) out.

Decides through the modifier chain (:mod:`spotgpu.runtime.modifiers`); the only side effects
are the chain's lookups (kubelet, device plugins, owners, host) and log lines. Hosted by the
agent's runtime service (:mod:`spotgpu.runtime.service`), or run inside the wrapper in the
``local`` fallback (:mod:`spotgpu.runtime.local`).

For each spec: the container's identity and its ``container-devices-from`` request are read
from the annotations; on a copy, :mod:`spotgpu.runtime.sanitize` removes what only we may
write and the env that selects devices for non-holders, then (for any spec but a sandbox's) the
chain runs; the copy is returned. :meth:`SpecEngine.handle` speaks the wire protocol: it answers
``unchanged`` when the copy equals the input, ``modified`` with the new JSON otherwise,
``refused`` for permanent errors (malformed annotations, refused syncs) and ``retry`` for
temporary ones (kubelet socket down), and never raises.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Literal

from spotgpu.core.codec import SyncKind, devices_from_for_container
from spotgpu.core.errors import SpotgpuError, TemporaryError
from spotgpu.ports.lookup import HostPort, NodeLookup
from spotgpu.runtime import protocol
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.modifiers import CachedLookup, Chain, GuardFunctions, ModifyContext, build_chain
from spotgpu.runtime.modifiers import load_guard_functions as _load_guard
from spotgpu.runtime.providers import default_providers
from spotgpu.runtime.sanitize import sanitize
from spotgpu.runtime.spec import ContainerIdentity, ContainerKind, Spec, SpecError, string_annotations
from spotgpu.runtime.sync import Provider, SyncRefused

log = logging.getLogger(__name__)


class SpecEngine:
    """Runs the configured modifier chain; thread-safe when its lookups are.

    ``guard="auto"`` loads the return guard's functions from :mod:`spotgpu.guard.rule`.
    """

    def __init__(
        self,
        config: RuntimeConfig,
        lookup: NodeLookup,
        host: HostPort,
        *,
        guard: GuardFunctions | Literal["auto"] | None = "auto",
        chain: Chain | None = None,
        providers: Mapping[SyncKind, Provider] | None = None,
    ) -> None:
        self.config = config
        self.lookup = lookup
        self.host = host
        self.guard = _load_guard() if isinstance(guard, str) else guard
        self.chain = chain if chain is not None else build_chain(config.modifiers)
        self.providers = dict(providers) if providers is not None else default_providers()
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def context(self, spec: Mapping[str, object]) -> ModifyContext:
        """The per-call context for ``spec`` (parses the identity and the sync request)."""
        annotations = string_annotations(spec)
        identity = ContainerIdentity.from_annotations(annotations)
        request = None
        if identity.kind is not ContainerKind.SANDBOX:
            request = devices_from_for_container(annotations, identity.container_name or "")
        return ModifyContext(
            identity=identity,
            config=self.config,
            lookup=CachedLookup(self.lookup),
            host=self.host,
            providers=self.providers,
            devices_from=request,
            guard=self.guard,
        )

    def modify(self, spec: Spec) -> tuple[Spec, ModifyContext]:
        """A modified copy of ``spec`` and the context; raises :class:`SpotgpuError` to refuse.

        The single entry point of "how must this spec change, or is it refused": the wrapper's
        service calls it, and so can any other front end (an NRI plugin) with the same lookups.
        It runs :func:`~spotgpu.runtime.sanitize.sanitize` (forged annotations, device-selecting
        env) on every spec, then the modifier chain on every spec but a sandbox's."""
        if not isinstance(spec, dict):
            raise SpecError(f"config.json must be a JSON object, got {type(spec).__name__}")
        ctx = self.context(spec)
        result = copy.deepcopy(spec)
        sanitize(result, ctx)  # always, before the configurable chain (sanitize's docstring)
        if ctx.identity.kind is not ContainerKind.SANDBOX:
            self.chain.modify(result, ctx)
        return result, ctx

    def handle(self, container_id: str, bundle: str, data: bytes) -> tuple[bytes, bytes]:
        """Answer one wire-protocol request: ``(status, body)``. Never raises."""
        who = f"container {container_id}"
        try:
            try:
                spec = json.loads(data)
            except (ValueError, RecursionError) as exc:
                raise SpecError(f"{bundle}/config.json is not valid JSON: {exc}") from None
            if isinstance(spec, dict):
                who = ContainerIdentity.from_annotations(string_annotations(spec)).describe() + f" ({container_id})"
            new, ctx = self.modify(spec)
        except TemporaryError as exc:
            log.warning("%s: create must be retried: %s", who, exc)
            return self._count(protocol.RETRY, "temporary"), f"{who}: {exc} (temporary; retried)".encode()
        except SpotgpuError as exc:
            reason = exc.reason.value if isinstance(exc, SyncRefused) else type(exc).__name__
            log.warning("%s: refused: %s", who, exc)
            return self._count(protocol.REFUSED, reason), f"{who}: {exc}".encode()
        except Exception as exc:  # a bug must fail the create with a message, not kill the service
            log.exception("%s: internal error", who)
            return self._count(protocol.RETRY, "internal"), f"{who}: spotgpu-runtime internal error: {exc!r}".encode()
        for note in ctx.notes:
            log.info("%s: %s", who, note)
        if new == spec:
            return self._count(protocol.UNCHANGED), b""
        log.info("%s: spec modified (%s)", who, ", ".join(self.chain.names))
        return self._count(protocol.MODIFIED), json.dumps(new, separators=(",", ":")).encode()

    def _count(self, status: bytes, reason: str = "") -> bytes:
        with self._lock:
            self._counts[status.decode() + (f":{reason}" if reason else "")] += 1
        return status

    def counts(self) -> dict[str, int]:
        """Answers so far by ``status`` or ``status:reason`` (for the agent's metrics)."""
        with self._lock:
            return dict(self._counts)


__all__ = ["SpecEngine"]
