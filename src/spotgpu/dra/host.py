"""``agent.mode: dra``: the DRA driver as the agent hosts it.

Side effects: the kubelet plugin's sockets (:class:`~spotgpu.dra.plugin.DraPlugin`), CDI spec
files and the checkpoint (:class:`~spotgpu.dra.driver.DraDriver`), ResourceSlice writes
(:class:`~spotgpu.dra.publisher.SlicePublisher`), one worker thread.

The agent hands every twin list it publishes to :meth:`DraHost.twins_changed` (under the
solver's lock, so it only records and wakes the worker; the worker may call back into the agent
through ``owner_of``/``lendable``); a twin turning not lendable has the CDI specs of the claims
on its GPU unlinked right there, before the agent goes on to kill the spot tasks. Each twin's
state for the slices:

* Healthy (lendable now): no taint;
* not lendable, and a prepared claim still holds its GPU: the owner came back and the eviction is
  not done: ``NoSchedule`` and ``NoExecute`` (the control plane deletes the pods using it, no
  scheduler places new ones); the claims' CDI specs are removed at once (:meth:`DraDriver.revoke`,
  so a container (re)created from them fails in containerd);
* not lendable otherwise: ``NoSchedule``.

On every change, and every ``republish_interval`` (which also brings slices back after the
kubelet deleted them), the worker re-publishes the slices and tells the health streams.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from spotgpu.core.config import DraConfig
from spotgpu.core.errors import SpotgpuError
from spotgpu.core.ids import DeviceID, NodeName, ResourceName, real_of_twin, shared_resource_of
from spotgpu.core.lending import IdleForecast
from spotgpu.core.mapping_cache import Owner
from spotgpu.core.types import Health
from spotgpu.dra.cdi import CdiDir
from spotgpu.dra.checkpoint import Checkpoint
from spotgpu.dra.claim import DriverName
from spotgpu.dra.decide import NodeView
from spotgpu.dra.driver import AllocateFn, DraDriver
from spotgpu.dra.plugin import DeviceHealth, DraPlugin
from spotgpu.dra.ports import DraApi
from spotgpu.dra.publisher import SlicePublisher
from spotgpu.dra.slices import Publication, TwinDevice, TwinState, publication
from spotgpu.ports.node import GpuDevice
from spotgpu.runtime.sync import ANY_NAMESPACE, SyncPolicy

log = logging.getLogger(__name__)

TwinList = Sequence[tuple[DeviceID, Health, int | None]]


class DraHost:
    def __init__(
        self,
        config: DraConfig,
        *,
        node: NodeName,
        gpu_resource: ResourceName,
        spot_resource: ResourceName,
        api: DraApi,
        owner_of: Callable[[DeviceID], Owner | None],
        lendable: Callable[[DeviceID], bool | None],
        allocate: AllocateFn,
        devices: Callable[[], Sequence[GpuDevice]],
        forecasts: Callable[[], Mapping[DeviceID, IdleForecast]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.driver_name = DriverName(config.driver_name)
        self.node = node
        self._gpu_resource = gpu_resource
        self._spot_resource = spot_resource
        self._owner_of = owner_of
        self._lendable = lendable
        self._devices = devices
        self._forecasts = forecasts
        self._policy = SyncPolicy(spot_resource, frozenset({gpu_resource}), frozenset({ANY_NAMESPACE}))
        data_dir = config.plugins_dir / config.driver_name
        cdi = CdiDir(config.cdi_dir, vendor_dirs=config.vendor_cdi_dirs, vendor_kind=config.vendor_cdi_kind or None)
        self.driver = DraDriver(
            api,
            self.view,
            allocate,
            cdi,
            Checkpoint(data_dir / "checkpoint.json"),
            lock_file=data_dir / "serialize.lock",
        )
        self.plugin = DraPlugin(
            self.driver_name,
            self.driver,
            self.health,
            registry_dir=config.registry_dir,
            plugins_dir=config.plugins_dir,
            pod_uid=config.pod_uid or None,
            clock=clock,
        )
        self.publisher = SlicePublisher(api, self.driver_name, node, self.publication, clock)
        self._lock = threading.Lock()
        self._twins: dict[ResourceName, dict[DeviceID, Health]] = {}
        self._numa: dict[DeviceID, int | None] = {}
        self._revoked: set[DeviceID] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the agent's side ----------------------------------------------------------------------
    def twins_changed(self, resource: ResourceName, twins: TwinList) -> None:
        with self._lock:
            self._twins[resource] = {t: h for t, h, _ in twins}
            self._numa.update({t: n for t, _, n in twins})
        held = {d.real for c in self.driver.prepared().values() for d in c.devices}
        taken = {r for t, h, _ in twins if h is not Health.HEALTHY and (r := real_of_twin(t, held)) is not None}
        if taken:
            self.driver.drop_specs(taken)  # at once: containerd resolves specs at CreateContainer
        self._wake.set()

    def start(self) -> DraHost:
        self.plugin.start()
        self._thread = threading.Thread(target=self._run, name="dra-host", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.plugin.stop()

    # -- state -------------------------------------------------------------------------------
    def _twin_devices(self) -> list[TwinDevice]:
        known = {d.id for d in self._devices()}
        held = {d.real for c in self.driver.prepared().values() for d in c.devices}
        out: list[TwinDevice] = []
        forecasts = self._forecasts() if self._forecasts is not None else {}
        with self._lock:
            lists = sorted(self._twins.items())
            numa = dict(self._numa)
        for resource, twins in lists:
            shared = resource == shared_resource_of(self._spot_resource)
            for twin, health in twins.items():
                real = real_of_twin(twin, known)
                if real is None:
                    continue
                if health is Health.HEALTHY:
                    state = TwinState.LENDABLE
                else:
                    state = TwinState.RETURNING if real in held else TwinState.NOT_LENDABLE
                forecast = forecasts.get(real) if state is TwinState.LENDABLE else None
                out.append(
                    TwinDevice(
                        twin,
                        real,
                        state,
                        shared=shared,
                        numa_node=numa.get(twin),
                        idle_forecast_s=forecast.expected if forecast is not None else None,
                    )
                )
        return out

    def publication(self) -> Publication:
        return publication(self._twin_devices())

    def view(self) -> NodeView:
        return NodeView(
            self.driver_name,
            self.node,
            self.publication(),
            self._owner_of,
            self._lendable,
            self._policy,
            self._gpu_resource,
        )

    def health(self) -> list[DeviceHealth]:
        return [
            DeviceHealth(self.node, name, t.state is not TwinState.RETURNING, t.state.value)
            for name, t in self.publication().devices
        ]

    # -- the worker ------------------------------------------------------------------------------
    def step(self) -> None:
        """Revoke claims on GPUs no longer lendable, re-publish, notify the health streams."""
        pub = self.publication()
        returning = {t.real for _, t in pub.devices if t.state is TwinState.RETURNING}
        fresh = returning - self._revoked
        if fresh:
            revoked = self.driver.revoke(fresh)
            log.info("DRA: GPUs %s taken back; CDI specs of %d claim(s) removed", sorted(fresh), len(revoked))
        self._revoked = returning
        try:
            self.publisher.sync()
        except SpotgpuError as exc:
            log.warning("DRA: publishing ResourceSlices failed (retried): %s", exc)
        self.plugin.health_changed()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.step()
            except (SpotgpuError, OSError) as exc:
                log.warning("DRA host step failed: %s", exc)
            self._wake.wait(self.config.republish_interval)


__all__ = ["DraHost", "TwinList"]
