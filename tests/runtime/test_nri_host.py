"""NRI mode's answers (:class:`spotgpu.nri.host.NriRuntime`): the chain's verdicts as NRI
adjustments or error statuses, on the fakes of :mod:`fakes`."""

from __future__ import annotations

import time
from typing import Any

import pytest

from spotgpu.adapters.proto import nri_v1alpha1_pb2 as nri
from spotgpu.core import keys
from spotgpu.core.errors import TemporaryError
from spotgpu.core.refs import ContainerRef
from spotgpu.nri.config import NriConfig
from spotgpu.nri.host import NriRuntime
from spotgpu.nri.transport import FAILED_PRECONDITION, PERMISSION_DENIED, UNAVAILABLE, RpcError
from spotgpu.ports.lookup import PodAssignment

from .fakes import NS, OWNER, SPOT_CTR, FakeGuard, FakeLookup, devices_from, engine, standard_lookup


def request(ref: ContainerRef, **annotations: str) -> tuple[nri.PodSandbox, nri.Container]:
    pod = nri.PodSandbox(id="s" * 64, name=ref.pod, namespace=ref.namespace, uid="u")
    container = nri.Container(id="c" * 64, name=ref.name, annotations=annotations, env=["PATH=/bin"])
    container.linux.seccomp_profile.profile_type = nri.SecurityProfile.UNCONFINED
    return pod, container


def sync(*ids: str) -> dict[str, str]:
    return {keys.DEVICES_FROM_PREFIX: devices_from({"_/dev-box/main": {"nvidia.com/gpu": list(ids)}})}


def test_a_granted_sync_is_an_adjustment() -> None:
    adjust = NriRuntime(engine()).decide(*request(SPOT_CTR, **sync("GPU-a")))
    assert ("NVIDIA_VISIBLE_DEVICES", "GPU-a") in [(kv.key, kv.value) for kv in adjust.env]
    assert [d.path for d in adjust.linux.devices] == ["/dev/nvidia0"]
    assert not adjust.linux.HasField("seccomp_policy")


def test_an_unchanged_container_gets_an_empty_adjustment() -> None:
    web = ContainerRef(NS, "web", "nginx")
    assert NriRuntime(engine()).decide(*request(web)) == nri.ContainerAdjustment()


def test_a_refused_sync_is_an_error_status_with_the_reason() -> None:
    runtime = NriRuntime(engine())
    with pytest.raises(RpcError) as info:
        runtime.decide(*request(SPOT_CTR, **sync("GPU-b")))
    assert info.value.code == PERMISSION_DENIED
    assert info.value.message.startswith("spotgpu-runtime: container team-a/spot-job/worker")
    assert "twin-not-allocated" in info.value.message
    assert runtime.engine.counts() == {"refused:twin-not-allocated": 1}


def test_denied_env_is_refused() -> None:
    env = {keys.CONTAINER_ENV_PREFIX: '{"NVIDIA_VISIBLE_DEVICES": "all"}'}
    with pytest.raises(RpcError, match="selects devices") as info:
        NriRuntime(engine()).decide(*request(SPOT_CTR, **env))
    assert info.value.code == PERMISSION_DENIED


def test_a_temporary_failure_asks_for_a_retry() -> None:
    lookup = standard_lookup()
    lookup.fail_pods = TemporaryError("pod-resources: UNAVAILABLE")
    with pytest.raises(RpcError) as info:
        NriRuntime(engine(lookup)).decide(*request(SPOT_CTR, **sync("GPU-a")))
    assert info.value.code == UNAVAILABLE and "temporary" in info.value.message


def test_what_nri_cannot_carry_is_refused_not_dropped() -> None:
    """Without replace-mounts the chain keeps the image's mount next to the synced one at the same
    destination; NRI cannot have two there, so the container is refused."""
    pod, container = request(SPOT_CTR, **sync("GPU-a"))
    container.mounts.add(destination="/usr/local/nvidia", type="bind", source="/image", options=["rbind"])
    with pytest.raises(RpcError) as info:
        NriRuntime(engine(modifiers=("devices",))).decide(pod, container)
    assert info.value.code == FAILED_PRECONDITION and "mounts" in info.value.message


class SlowLookup(FakeLookup):
    def pod(self, namespace: str, name: str) -> PodAssignment | None:
        time.sleep(1.0)
        return super().pod(namespace, name)


def test_no_answer_within_the_runtime_timeout_asks_for_a_retry() -> None:
    """Answering after containerd's request timeout would make it drop us and create the
    container unadjusted: we answer UNAVAILABLE before that."""
    slow = SlowLookup(**{k: getattr(standard_lookup(), k) for k in ("pods", "owners")})
    runtime = NriRuntime(engine(slow))
    began = time.monotonic()
    with pytest.raises(RpcError) as info:
        runtime.create_container(*request(SPOT_CTR, **sync("GPU-a")), timeout=0.8)
    assert info.value.code == UNAVAILABLE and time.monotonic() - began < 0.8
    runtime.close()


def test_synchronize_counts_guarded_owners() -> None:
    runtime = NriRuntime(engine(guard=FakeGuard()))
    policy = nri.LinuxSeccomp(listener_path="/run/test/guard.sock")
    guarded = nri.Container(id="o", linux=nri.LinuxContainer(seccomp_policy=policy))
    runtime.synchronize([nri.PodSandbox(id="p")], [guarded, nri.Container(id="x")])
    assert runtime.synchronized == {"pods": 1, "containers": 2, "guarded": 1}


@pytest.mark.parametrize(
    ("yaml", "text"),
    [
        ("socketPath: relative.sock", "absolute"),
        ("pluginIndex: '7'", "two digits"),
        ("pluginName: Bad Name", "pluginName"),
    ],
)
def test_nri_config_errors_name_the_key(tmp_path: Any, yaml: str, text: str) -> None:
    from spotgpu.core.configfile import ConfigError
    from spotgpu.nri.config import load_nri_config

    path = tmp_path / "c.yaml"
    path.write_text(f"nri:\n  {yaml}\n")
    with pytest.raises(ConfigError, match=text):
        load_nri_config(path)
    (tmp_path / "other.yaml").write_text("agent: {}\n")
    assert NriConfig().enabled is False and load_nri_config(tmp_path / "other.yaml").enabled is False


def test_owner_in_nri_mode_is_guarded() -> None:
    adjust = NriRuntime(engine(guard=FakeGuard())).decide(*request(OWNER))
    assert adjust.linux.seccomp_policy.listener_path == "/run/test/guard.sock"
    assert not any(s.HasField("errno_ret") for s in adjust.linux.seccomp_policy.syscalls)
    assert not adjust.linux.seccomp_policy.HasField("default_errno")
    assert adjust.annotations[keys.GUARDED] == OWNER.format()


@pytest.mark.parametrize(
    ("name", "version", "guarded"),
    [
        ("containerd", "v2.2.7", True),
        ("containerd", "v2.3.0", True),
        ("containerd", "v2.1.4", False),
        ("containerd", "1.7.27", False),
        ("cri-o", "1.31.0", False),
    ],
)
def test_the_guard_needs_a_runtime_that_applies_seccomp_from_nri(name: str, version: str, guarded: bool) -> None:
    """An older runtime's NRI would drop the policy it does not know: the owner would run
    without the rule while its spec said it had one."""
    runtime = NriRuntime(engine(guard=FakeGuard()))
    runtime.configure(name, version)
    adjust = runtime.decide(*request(OWNER))
    assert adjust.linux.HasField("seccomp_policy") is guarded
    if not guarded:
        assert "does not apply seccomp policies from NRI" in adjust.annotations[keys.GUARD_SKIPPED]


def test_the_agent_hosts_nri_mode_next_to_the_wrappers_socket(tmp_path: Any) -> None:
    """``spotgpu.agent.build.runtime_service_factory`` with ``nri.enabled``: the wrapper's service
    and the NRI plugin, registered with the runtime, answers of both counted together."""
    from pathlib import Path
    from types import SimpleNamespace

    from spotgpu.agent.build import runtime_service_factory
    from spotgpu.core.config import AgentConfig, GuardConfig
    from spotgpu.nri.service import NriRuntimeService
    from spotgpu.runtime.config import RuntimeConfig

    from .nri_runtime import FakeRuntime

    base = Path(tmp_path)
    runtime_side = FakeRuntime(base / "nri.sock")
    agent = AgentConfig(
        node_name="n",
        device_plugin_dir=base / "plugins",
        pod_resources_socket=base / "pr.sock",
        runtime_socket=base / "agent.sock",
        guard=GuardConfig(listener_path=base / "guard.sock"),
    )
    make = runtime_service_factory(agent, RuntimeConfig(), NriConfig(enabled=True, socket_path=runtime_side.path))
    service = make(SimpleNamespace(owner_of=lambda d: None, lendable=lambda d: None))  # type: ignore[arg-type]
    assert isinstance(service, NriRuntimeService)
    try:
        service.start()
        runtime_side.accept()
        assert (base / "agent.sock").is_socket()  # the wrapper's socket stays served
        deadline = time.monotonic() + 5
        while not runtime_side.registered and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runtime_side.registered[0].plugin_name == "spotgpu"
        assert service.status()["nri"]["plugin"] == "50-spotgpu" and service.counts() == {}
    finally:
        service.stop()
        runtime_side.close()


# --- StartContainer: the lend rule asked again ----------------------------------------------------

SYNCED = '{"nvidia.com/gpu":["GPU-a"]}'


def started(runtime: NriRuntime, ref: ContainerRef, **annotations: str) -> None:
    runtime.check_start(*request(ref, **annotations))


def test_a_start_whose_synced_gpu_is_still_lent_passes() -> None:
    started(NriRuntime(engine()), SPOT_CTR, **{keys.SYNCED_DEVICES: SYNCED})


@pytest.mark.parametrize("lent", [False, None])
def test_a_start_whose_synced_gpu_is_not_lent_now_is_refused(lent: bool | None) -> None:
    """The owner came back (False) or the agent cannot say (None): fail closed."""
    lookup = standard_lookup()
    lookup.lendable["GPU-a"] = lent  # type: ignore[assignment]
    with pytest.raises(RpcError) as info:
        started(NriRuntime(engine(lookup)), SPOT_CTR, **{keys.SYNCED_DEVICES: SYNCED})
    assert info.value.code == PERMISSION_DENIED and "start refused" in info.value.message
    assert ("is not lent out now" if lent is False else "cannot say") in info.value.message


def test_the_create_decision_is_remembered_for_the_start() -> None:
    """The start is checked even if the container's annotations at start do not show the sync."""
    lookup = standard_lookup()
    runtime = NriRuntime(engine(lookup))
    runtime.decide(*request(SPOT_CTR, **sync("GPU-a")))
    lookup.lendable["GPU-a"] = False
    with pytest.raises(RpcError, match="GPU-a"):
        started(runtime, SPOT_CTR)  # no synced-devices annotation in this start event


def test_a_malformed_synced_record_refuses_the_start() -> None:
    with pytest.raises(RpcError) as info:
        started(NriRuntime(engine()), SPOT_CTR, **{keys.SYNCED_DEVICES: '{"nvidia.com/gpu": "GPU-a"}'})
    assert info.value.code == PERMISSION_DENIED and "not a map of resource to device IDs" in info.value.message


def test_a_container_that_synced_nothing_starts_without_asking() -> None:
    lookup = standard_lookup()
    lookup.lendable.clear()  # the agent could not answer about any GPU
    started(NriRuntime(engine(lookup)), ContainerRef(NS, "web", "nginx"))


def test_a_lookup_that_fails_refuses_the_start() -> None:
    lookup = standard_lookup()

    def broken(device: str) -> bool | None:
        raise OSError("agent socket gone")

    lookup.device_lendable = broken  # type: ignore[method-assign]
    with pytest.raises(RpcError) as info:
        started(NriRuntime(engine(lookup)), SPOT_CTR, **{keys.SYNCED_DEVICES: SYNCED})
    assert info.value.code == UNAVAILABLE and "cannot check" in info.value.message


def test_a_start_with_nothing_to_check_does_not_wait_for_a_busy_pool() -> None:
    """Every container's StartContainer reaches the plugin: one that synced nothing must not
    queue behind slow create decisions (a refusal by timeout would fail a CPU pod's start)."""
    runtime = NriRuntime(engine(), workers=1)
    blocker = runtime._pool.submit(time.sleep, 1.0)
    began = time.monotonic()
    runtime.start_container(*request(ContainerRef(NS, "web", "nginx")), timeout=1.0)
    assert time.monotonic() - began < 0.2
    with pytest.raises(RpcError) as info:  # a synced one waits, and past the deadline is refused
        runtime.start_container(*request(SPOT_CTR, **{keys.SYNCED_DEVICES: SYNCED}), timeout=0.6)
    assert info.value.code == UNAVAILABLE and "no start decision" in info.value.message
    blocker.result()
    runtime.close()
