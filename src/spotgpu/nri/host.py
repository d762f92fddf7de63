"""NRI mode of spotgpu-runtime: the modifier chain's decision for one container, as an NRI
adjustment (or an error status that keeps the container from being created).

Decides nothing itself: the decision is the :class:`~spotgpu.runtime.engine.SpecEngine`'s,
through the same entry point the wrapper's service uses (:meth:`SpecEngine.handle`, the
wire protocol's bytes in and out), on the OCI-spec-shaped input of :func:`spotgpu.nri.spec.spec_of`;
:func:`spotgpu.nri.adjust.adjustment_for` turns the chain's output into the adjustment. So NRI
mode inherits every rule of the chain (device sync through the providers and the grant checks,
the guard's rule for owners with ``listener_path``, env denial) as the chain defines it.

Side effects: the engine's lookups (kubelet pod-resources, device plugins, the guard's listener
probe), log lines, a small thread pool that bounds how long one answer may take.

Answers, per container:

* chain unchanged: an empty adjustment;
* chain modified: the adjustment; if NRI cannot carry the change exactly, an error status
  (``FAILED_PRECONDITION``) naming it;
* refused (a sync the kubelet did not grant, a denied env, a malformed annotation): an error
  status (``PERMISSION_DENIED``) with the chain's message, so containerd fails CreateContainer
  and the kubelet reports it;
* temporary (kubelet down, or no answer within the runtime's request timeout minus a margin):
  ``UNAVAILABLE``; the kubelet retries. Answering late would make containerd drop the plugin
  and create the container without any adjustment.

At StartContainer (:meth:`NriRuntime.start_container`) a container whose devices were synced at
create (its ``synced-devices`` annotation, and the decision remembered per container ID) is
checked again with the sync's lend rule (:func:`spotgpu.runtime.sync.require_lent`): the kubelet
may start it long after the create, and an owner that came back in between (the eviction found
no task to kill, a created container has none until StartContainer) must not have its GPU run a
spot process. Any GPU not lent now, an agent that cannot say, a malformed record or no answer in
time: an error status, so containerd fails StartContainer before it starts the task's process
(containerd 2.2.7 calls NRI's StartContainer after creating the task, before starting it).

Owners whose seccomp profile NRI cannot carry with the guard's rule (an ``errnoRet`` or
``defaultErrnoRet``, e.g. containerd's RuntimeDefault with ``clone3`` -> ENOSYS), or whose
profile the runtime did not send at all (containerd 2.2.7 sends none for RuntimeDefault and
Localhost profiles: composing the rule into "nothing" would replace the real profile with an
allow-all one), are created without the rule and marked ``spotgpu.io/guard-skipped: conflict:
...`` by the chain itself:
:func:`nri_guard_functions` makes the guard's ``apply`` refuse such profiles, and the chain's
guard-rule modifier turns every refusal into a skip, never into a failed owner.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Final

from spotgpu.adapters.proto import nri_v1alpha1_pb2 as nri
from spotgpu.core import keys
from spotgpu.core.errors import SpotgpuError, ValidationError
from spotgpu.core.ids import DeviceID
from spotgpu.nri.adjust import NotExpressible, adjustment_for
from spotgpu.nri.spec import FACTS, spec_of
from spotgpu.nri.transport import FAILED_PRECONDITION, PERMISSION_DENIED, UNAVAILABLE, RpcError
from spotgpu.runtime import protocol
from spotgpu.runtime.engine import SpecEngine
from spotgpu.runtime.modifiers import GuardFunctions
from spotgpu.runtime.sync import require_lent

log = logging.getLogger(__name__)

ANSWER_MARGIN: Final = 0.5
"""Seconds kept in hand before the runtime's request timeout."""
REMEMBERED: Final = 4096
"""Synced containers remembered from create to start (the oldest are forgotten first; the
container's own annotation still names its devices)."""


def synced_devices(annotations: Mapping[str, str]) -> tuple[DeviceID, ...]:
    """The devices the ``synced-devices`` annotation (written by the chain at create) names;
    ValidationError when it is malformed (the start is refused: fail closed)."""
    raw = annotations.get(keys.SYNCED_DEVICES)
    if raw is None:
        return ()
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(
        isinstance(ids, list) and all(isinstance(i, str) and i for i in ids) for ids in value.values()
    ):
        raise ValidationError(f"{keys.SYNCED_DEVICES}: {raw[:200]!r} is not a map of resource to device IDs")
    return tuple(DeviceID(i) for ids in value.values() for i in ids)


class NriGuardConflict(ValidationError):
    """The guard's rule composed into this owner's profile is something NRI cannot carry."""


def nri_expressible(profile: Any) -> str | None:
    """Why NRI (containerd 2.2.7) cannot carry the seccomp ``profile`` unchanged; None if it can."""
    if not isinstance(profile, dict):
        return None
    if "defaultErrnoRet" in profile:
        return "its defaultErrnoRet would be dropped by containerd's NRI"
    calls = [s for s in profile.get("syscalls") or () if isinstance(s, dict)]
    errnos = sorted({str(s["errnoRet"]) for s in calls if "errnoRet" in s})
    if errnos:
        return f"its errnoRet ({', '.join(errnos)}) crashes containerd 2.2.7's NRI"
    return None


def seccomp_adjustable(runtime_name: str, runtime_version: str) -> bool:
    """Whether the runtime applies an NRI adjustment's seccomp policy: containerd from 2.2 on
    (NRI 0.10). Older containerd (and runtimes not verified here, CRI-O) would drop the field
    unknown to their NRI, and the owner would run without the rule."""
    if runtime_name != "containerd":
        return False
    match = re.match(r"v?(\d+)\.(\d+)", runtime_version)
    return match is not None and (int(match[1]), int(match[2])) >= (2, 2)


@dataclass(frozen=True, slots=True)
class NriGuardFunctions(GuardFunctions):
    """The guard's functions as NRI mode wraps them (:func:`nri_guard_functions`)."""


def nri_guard_functions(base: GuardFunctions | None) -> GuardFunctions | None:
    """The guard's functions, with ``apply`` refusing (as a conflict) what NRI cannot carry."""
    if base is None or isinstance(base, NriGuardFunctions):
        return base

    def apply(spec: dict[str, Any], **kwargs: Any) -> None:
        runtime = (spec.get(FACTS) or {}).get("runtime")
        if runtime is not None and not seccomp_adjustable(*runtime):
            raise NriGuardConflict(
                f"NRI mode cannot install the rule: {' '.join(runtime)} does not apply seccomp policies from NRI "
                "(containerd >= 2.2 does); use wrapper mode for GPU owners on this node"
            )
        if (spec.get(FACTS) or {}).get("seccomp") == "unknown":
            raise NriGuardConflict(
                "NRI mode cannot install the rule: the runtime did not send this container's seccomp policy "
                "(its profile is RuntimeDefault or Localhost), and the rule would replace that profile"
            )
        trial = copy.deepcopy(spec)
        base.apply(trial, **kwargs)
        problem = nri_expressible((trial.get("linux") or {}).get("seccomp"))
        if problem is not None:
            raise NriGuardConflict(f"NRI mode cannot install the rule into this seccomp profile: {problem}")
        spec.clear()
        spec.update(trial)

    return NriGuardFunctions(apply, base.ready)


class NriRuntime:
    """The :class:`~spotgpu.nri.plugin.ContainerHandler` of NRI mode (module docstring)."""

    def __init__(self, engine: SpecEngine, *, workers: int = 4) -> None:
        engine.guard = nri_guard_functions(engine.guard)  # the engine is NRI mode's own
        self.engine = engine
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nri-decide")
        self.synchronized: dict[str, int] = {}
        self.runtime: tuple[str, str] | None = None
        """``(name, version)`` of the runtime that configured us (None: not yet)."""
        self._synced: OrderedDict[str, tuple[DeviceID, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def configure(self, runtime_name: str, runtime_version: str) -> None:
        self.runtime = (runtime_name, runtime_version)
        if not seccomp_adjustable(runtime_name, runtime_version):
            log.warning(
                "NRI: %s %s does not apply seccomp policies from NRI: GPU owners get no return guard in NRI mode",
                runtime_name,
                runtime_version,
            )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def decide(self, pod: nri.PodSandbox, container: nri.Container) -> nri.ContainerAdjustment:
        """The answer for one container (no deadline; :meth:`create_container` adds it)."""
        spec = spec_of(pod, container)
        if self.runtime is not None:
            spec.setdefault(FACTS, {})["runtime"] = list(self.runtime)
        status, body = self.engine.handle(container.id, f"nri:{pod.namespace}/{pod.name}", json.dumps(spec).encode())
        if status == protocol.UNCHANGED:
            return nri.ContainerAdjustment()
        if status == protocol.MODIFIED:
            after = json.loads(body)
            try:
                adjust = adjustment_for(spec, after)
            except NotExpressible as exc:
                who = f"container {pod.namespace}/{pod.name}/{container.name} ({container.id})"
                log.warning("%s: refused: %s", who, exc)
                raise RpcError(FAILED_PRECONDITION, f"spotgpu-runtime: {who}: {exc}") from None
            self._remember(container.id, synced_devices(after.get("annotations") or {}))
            return adjust
        code = PERMISSION_DENIED if status == protocol.REFUSED else UNAVAILABLE
        raise RpcError(code, "spotgpu-runtime: " + body.decode(errors="replace"))

    def _remember(self, container_id: str, devices: tuple[DeviceID, ...]) -> None:
        if not devices or not container_id:
            return
        with self._lock:
            self._synced[container_id] = devices
            while len(self._synced) > REMEMBERED:
                self._synced.popitem(last=False)

    def check_start(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        """Refuse (RpcError) to start a synced container whose GPUs are not all lent now
        (module docstring); a container that synced nothing starts."""
        who = f"container {pod.namespace}/{pod.name}/{container.name} ({container.id})"
        with self._lock:
            remembered = self._synced.pop(container.id, ())
        try:
            devices = sorted(set(remembered) | set(synced_devices(container.annotations)))
            lookup = self.engine.lookup
            for device in devices:
                require_lent(device, lookup.device_owner(device), lookup.device_lendable)
        except SpotgpuError as exc:
            log.warning("%s: start refused: %s", who, exc)
            raise RpcError(PERMISSION_DENIED, f"spotgpu-runtime: {who}: start refused: {exc}") from None
        except Exception as exc:  # an agent we cannot ask: fail closed
            log.warning("%s: start refused, cannot check the lend rule: %r", who, exc)
            raise RpcError(UNAVAILABLE, f"spotgpu-runtime: {who}: start refused: cannot check: {exc!r}") from None

    def _answer(self, what: str, pod: nri.PodSandbox, container: nri.Container, timeout: float, call: Any) -> Any:
        deadline = max(0.2, timeout - ANSWER_MARGIN)
        future = self._pool.submit(call, pod, container)
        try:
            return future.result(deadline)
        except FutureTimeout:
            who = f"{pod.namespace}/{pod.name}/{container.name}"
            log.warning("container %s: no %s decision within %.1fs; refused (retried)", who, what, deadline)
            message = f"spotgpu-runtime: container {who}: no {what} decision within {deadline:.1f}s (temporary)"
            raise RpcError(UNAVAILABLE, message) from None

    def create_container(
        self, pod: nri.PodSandbox, container: nri.Container, timeout: float
    ) -> nri.ContainerAdjustment:
        adjust: nri.ContainerAdjustment = self._answer("create", pod, container, timeout, self.decide)
        return adjust

    def start_container(self, pod: nri.PodSandbox, container: nri.Container, timeout: float) -> None:
        with self._lock:
            remembered = container.id in self._synced
        if remembered or keys.SYNCED_DEVICES in container.annotations:  # else nothing to check: no wait
            self._answer("start", pod, container, timeout, self.check_start)

    def synchronize(self, pods: Sequence[nri.PodSandbox], containers: Sequence[nri.Container]) -> None:
        listener = str(self.engine.config.guard_listener_path)
        # containerd 2.2.7 sends no seccomp policy for existing containers; the annotation we
        # wrote with the rule is in their specs
        guarded = sum(
            1 for c in containers if keys.GUARDED in c.annotations or c.linux.seccomp_policy.listener_path == listener
        )
        synced = sum(1 for c in containers if keys.SYNCED_DEVICES in c.annotations)
        self.synchronized = {"pods": len(pods), "containers": len(containers), "guarded": guarded}
        log.info(
            "NRI: the runtime has %d pods, %d containers (%d with the guard's rule, %d with synced devices)",
            len(pods),
            len(containers),
            guarded,
            synced,
        )


__all__ = [
    "ANSWER_MARGIN",
    "REMEMBERED",
    "NriGuardConflict",
    "NriGuardFunctions",
    "NriRuntime",
    "nri_expressible",
    "nri_guard_functions",
    "seccomp_adjustable",
    "synced_devices",
]
