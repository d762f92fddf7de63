"""Every key of the agent's configuration is exercised: a document setting each one to a value
other than its default loads into exactly that value; a key added to the configuration without
being named here fails the test. Legacy keys warn once at the agent's start."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import yaml

from spotgpu.cli.agent import legacy_warnings
from spotgpu.core.config import AgentConfig
from spotgpu.core.configfile import camel, from_mapping

EVERY_KEY = """
nodeName: gpu-7
detectInterval: 2s
maxInactiveTime: 5m
utilizationSource: exporter
exporters: [{vendor: dcgm, url: "http://127.0.0.1:9400/metrics", timeout: 3s}]
gpuResource: example.com/gpu
spotResource: example.com/spot-gpu
gpuBackend: devnode
deviceNodes: [{id: GPU-a, path: /dev/nvidia0, index: 0, numaNode: 1, containerPaths: [/dev/gpu0]}]
podResourcesSocket: /run/pr/kubelet.sock
devicePluginDir: /run/dp
containerdSocket: /run/ctd/containerd.sock
containerdNamespace: other.io
containerdStateDir: /run/ctd-state
sigtermGrace: 1s
metricsAddress: 127.0.0.1:9000
debugAddress: 127.0.0.1:9001
runtimeSocket: /run/x/agent.sock
utilizationDir: /run/util
pluginSocketName: other.sock
evictionTimeout: 20s
eviction:
  realtime: false
  pinPidfds: false
  verifyByPidfd: false
  boostCpu: false
  holdMountNs: false
  deferDetection: false
  releaseCheck:
    enabled: false
    cgroupMount: /host/cgroup
    cgroupRoots: [k8s.slice]
    controlDevices: [{path: /dev/ctl0, containerPaths: [/dev/nvidiactl]}]
    exemptNamespaces: [gpu-operator]
    watchInterval: 1s
    watchWindow: 1m
twinReplicas: 1
sharedReplicas: 2
guard:
  enabled: false
  listenerPath: /run/g/guard.sock
  holderPath: /run/g/holder.sock
  failOpenTimeout: 9s
  holderTimeout: 4s
  runtimeBinary: /usr/bin/crun
  handoverTimeout: 30s
lending:
  policy: timer
  unguardedPolicy: pollOnly
  predictive:
    minExpectedIdle: 10m
    minLikelyIdle: 5m
    priorMean: 1h
    priorWeight: 2.0
    memory: 10.0
    quickReturn: 5m
    backoffStep: 1m
    backoffMax: 30m
    backoffHalfLife: 1h
shadowNamespace: shadows
stateFile: /run/x/state.json
mode: dra
dra:
  driverName: gpu.spotgpu.example.com
  pluginsDir: /var/lib/kubelet/plugins-x
  registryDir: /var/lib/kubelet/plugins_registry-x
  cdiDir: /var/run/cdi-x
  vendorCdiDirs: [/etc/cdi-x]
  vendorCdiKind: example.com/gpu
  podUid: 0b4e7a0c-3a48-4c3e-9d2a-1f2e3d4c5b6a
  republishInterval: 30s
"""


def _leaves(cls: type, prefix: str = "") -> set[str]:
    hints = typing.get_type_hints(cls)
    keys = set()
    for field in dataclasses.fields(cls):
        key = prefix + camel(field.name)
        kind = hints[field.name]
        keys |= _leaves(kind, key + ".") if dataclasses.is_dataclass(kind) else {key}
    return keys


def _named(data: Any, prefix: str = "") -> set[str]:
    if not isinstance(data, dict):
        return set()
    keys = set()
    for key, value in data.items():
        keys.add(prefix + key)
        keys |= _named(value, f"{prefix}{key}.")
    return keys


def _values(obj: object, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for field in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, field.name)
        key = prefix + camel(field.name)
        out |= _values(value, key + ".") if dataclasses.is_dataclass(value) else {key: value}
    return out


def test_every_key_is_named_and_loads_to_a_value_other_than_its_default() -> None:
    data = yaml.safe_load(EVERY_KEY)
    missing = _leaves(AgentConfig) - _named(data)
    assert not missing, f"keys no test names: {sorted(missing)}"
    loaded, default = _values(from_mapping(AgentConfig, data)), _values(AgentConfig())
    same = sorted(k for k in loaded if loaded[k] == default[k] and k != "twinReplicas")
    assert not same, f"set to their defaults (so not exercised): {same}"
    assert loaded["eviction.releaseCheck.cgroupMount"] == Path("/host/cgroup")
    assert loaded["eviction.releaseCheck.watchInterval"] == 1.0


def test_the_legacy_twin_replicas_key_warns_with_its_removal_note() -> None:
    assert legacy_warnings(AgentConfig()) == []
    (warning,) = legacy_warnings(AgentConfig(twin_replicas=4))
    assert "twinReplicas is legacy" in warning and "sharedReplicas" in warning and "removed" in warning
