"""The agent's ``spotgpu.io/spot-gpu-state`` node annotation, as the scheduler reads it.

Pure: annotation text in, per real GPU its owner, its twin's health and its spot use out; no I/O.
The agent writes it (:func:`spotgpu.agent.model.node_state_annotation`); every part of it is
checked here, and a malformed entry makes the whole node's state an :class:`ObjectError` (the
snapshot then leaves that node out, :mod:`spotgpu.kube.snapshot`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from spotgpu.core import keys
from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import DeviceID, validate_device_id
from spotgpu.core.mapping_cache import IDLE_SPACE
from spotgpu.core.refs import ContainerRef, PodRef
from spotgpu.core.types import Health
from spotgpu.kube.resources import ObjectError


@dataclass(frozen=True, slots=True)
class SpotUse:
    """What the agent's node state says about spot use of one real GPU."""

    pods: tuple[PodRef, ...] = ()
    """Spot pods holding its twins (pod-resources: the kubelet's real allocation)."""
    replicas: int = 0
    """Shared replicas the agent serves per GPU (0: none)."""


def parse_node_state(node: str, text: str) -> dict[DeviceID, tuple[ContainerRef | None, Health]]:
    """The agent's ``spotgpu.io/spot-gpu-state``: real device -> (owner or None, twin health)."""
    return {d: (owner, health) for d, (owner, health, _) in parse_spot_state(node, text).items()}


def parse_spot_state(node: str, text: str) -> dict[DeviceID, tuple[ContainerRef | None, Health, SpotUse]]:
    """The whole annotation: real device -> (owner or None, twin health, spot use)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ObjectError(f"node {node}: annotation {keys.NODE_SPOT_GPU_STATE} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ObjectError(f"node {node}: annotation {keys.NODE_SPOT_GPU_STATE} must be a JSON object")
    out: dict[DeviceID, tuple[ContainerRef | None, Health, SpotUse]] = {}
    for raw_id, entry in data.items():
        where = f"node {node}: {keys.NODE_SPOT_GPU_STATE}[{raw_id!r}]"
        try:
            device = validate_device_id(raw_id)
        except ValidationError as exc:
            raise ObjectError(f"{where}: {exc}") from None
        if not isinstance(entry, dict):
            raise ObjectError(f"{where}: must be an object")
        raw_owner = entry.get("owner")
        owner: ContainerRef | None = None
        if raw_owner not in (None, "", IDLE_SPACE.format()):
            try:
                owner = ContainerRef.parse(raw_owner)
            except ValidationError as exc:
                raise ObjectError(f"{where}: owner: {exc}") from None
        try:
            health = Health(entry.get("health", Health.UNHEALTHY.value))
        except ValueError:
            raise ObjectError(f"{where}: health {entry.get('health')!r} is not Healthy or Unhealthy") from None
        raw_pods, replicas = entry.get("pods", []), entry.get("replicas", 0)
        if not isinstance(raw_pods, list) or not all(isinstance(p, str) for p in raw_pods):
            raise ObjectError(f"{where}: pods must be a list of 'namespace/name'")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ObjectError(f"{where}: replicas must be a whole number >= 0")
        try:
            pods = tuple(PodRef.parse(p) for p in raw_pods)
        except ValidationError as exc:
            raise ObjectError(f"{where}: pods: {exc}") from None
        out[device] = (owner, health, SpotUse(pods, replicas))
    return out


__all__ = ["SpotUse", "parse_node_state", "parse_spot_state"]
