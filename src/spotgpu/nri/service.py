"""spotgpu-runtime as the agent hosts it in NRI mode: the wrapper's service and the NRI plugin.

Decides nothing. Side effects: those of :class:`~spotgpu.runtime.service.RuntimeService` (the
wrapper's unix socket, kept so that pods still created through the ``spotgpu`` handler during
a roll-out or roll-back keep working) and of :class:`~spotgpu.nri.plugin.NriPlugin` (a session
with the runtime's NRI socket, reconnecting).

Both paths run the same modifier chain on the same node lookups; the NRI one with the guard's
functions wrapped by :func:`~spotgpu.nri.host.nri_guard_functions`. Hosting it in the agent
(``spotgpu.agent.build.runtime_service_factory`` does this when ``nri.enabled``)::

    service = NriRuntimeService.for_agent(agent_config, runtime_config, nri_config, owner_of=...,
                                          own_plugin_sockets=(...), lendable=...)
    service.start()
    ...
    service.stop()
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Self

from spotgpu.core.config import AgentConfig
from spotgpu.nri.config import NriConfig
from spotgpu.nri.host import NriRuntime, nri_guard_functions
from spotgpu.nri.plugin import NriPlugin
from spotgpu.runtime.config import RuntimeConfig
from spotgpu.runtime.engine import SpecEngine
from spotgpu.runtime.node import LendableOf, OwnerOf
from spotgpu.runtime.service import RuntimeService


class NriRuntimeService:
    """The wrapper's :class:`RuntimeService` plus the NRI plugin (module docstring)."""

    def __init__(self, wrapper: RuntimeService, nri_engine: SpecEngine, config: NriConfig) -> None:
        self.wrapper = wrapper
        self.nri_engine = nri_engine
        self.runtime = NriRuntime(nri_engine)
        self.plugin = NriPlugin(
            config.socket_path,
            self.runtime,
            name=config.plugin_name,
            index=config.plugin_index,
            call_timeout=config.call_timeout,
        )

    @classmethod
    def for_agent(
        cls,
        agent: AgentConfig,
        runtime: RuntimeConfig,
        nri: NriConfig,
        *,
        owner_of: OwnerOf,
        own_plugin_sockets: Sequence[str] = (),
        lendable: LendableOf | None = None,
    ) -> NriRuntimeService:
        wrapper = RuntimeService.for_agent(
            agent, runtime, owner_of=owner_of, own_plugin_sockets=own_plugin_sockets, lendable=lendable
        )
        base = wrapper.engine
        engine = SpecEngine(base.config, base.lookup, base.host, guard=nri_guard_functions(base.guard))
        return cls(wrapper, engine, nri)

    @property
    def engine(self) -> SpecEngine:
        return self.nri_engine

    def start(self) -> Self:
        self.wrapper.start()
        self.plugin.start()
        return self

    def stop(self) -> None:
        self.plugin.stop()
        self.runtime.close()
        self.wrapper.stop()

    def counts(self) -> dict[str, int]:
        """Answers of both paths, by ``status`` or ``status:reason``."""
        total: Counter[str] = Counter(self.wrapper.engine.counts())
        total.update(self.nri_engine.counts())
        return dict(total)

    def status(self) -> dict[str, Any]:
        nri = {**self.plugin.status(), "synchronized_with": self.runtime.synchronized}
        return {"answers": self.counts(), "nri": nri}


__all__ = ["NriRuntimeService"]
