"""The kubelet CRI double and the CRI containerd it drives.

Pure: the device manager's mapping of Allocate answers into a ContainerConfig (as the kubelet
maps them), the containerd configuration composed from the shipped snippets (only host facts
overridden). Real (root): Debian's containerd 1.6 and containerd 2.2.7 with those snippets run
pods through our CRI .proto; the snippets' annotation allow-lists and runtime handler do what
docs/runtime.md says.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spotgpu.adapters.proto import cri_runtime_v1_pb2 as cri
from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2 as dp
from spotgpu.testing.cri import ContainerSpec, KubeletCri, PodSpec, container_config, device_options
from spotgpu.testing.cri_containerd import (
    SPOTGPU_RUNTIME_PATH,
    Binaries,
    CriContainerd,
    CriSettings,
    compose,
    dumps_toml,
    snippet_dir,
)
from spotgpu.testing.cri_rig import snippets


def answer(ids: list[str], *, annotations: dict[str, str] | None = None) -> dp.ContainerAllocateResponse:
    return dp.ContainerAllocateResponse(
        envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ids)},
        mounts=[dp.Mount(container_path="/usr/local/nvidia", host_path="/opt/driver", read_only=True)],
        devices=[
            dp.DeviceSpec(container_path=f"/dev/nvidia{i}", host_path=f"/dev/nvidia{i}", permissions="rw")
            for i in range(len(ids))
        ],
        annotations=annotations or {},
        cdi_devices=[dp.CDIDevice(name=f"nvidia.com/gpu={i}") for i in ids],
    )


def test_allocate_answers_become_the_container_config_as_the_kubelet_maps_them() -> None:
    options = device_options(
        [answer(["GPU-0"]), answer(["GPU-1"], annotations={"platform.k8s.io/container-devices-from": "{}"})],
        [("nvidia.com/gpu", ["GPU-0"]), ("platform/spot-gpu", ["spot-GPU-1"])],
    )
    config = container_config(PodSpec("ns", "p", uid="u1"), ContainerSpec("c", env={"A": "1"}), options)
    assert [(e.key, e.value) for e in config.envs] == [("NVIDIA_VISIBLE_DEVICES", "GPU-1"), ("A", "1")]
    assert [(m.container_path, m.host_path, m.readonly) for m in config.mounts] == [
        ("/usr/local/nvidia", "/opt/driver", True)
    ]
    assert [d.container_path for d in config.devices] == ["/dev/nvidia0"]  # unique by container path
    assert config.annotations["platform.k8s.io/container-devices-from"] == "{}"
    assert [d.name for d in config.CDI_devices] == ["nvidia.com/gpu=GPU-0", "nvidia.com/gpu=GPU-1"]
    assert config.labels["io.kubernetes.pod.uid"] == "u1" and config.labels["io.kubernetes.container.name"] == "c"
    assert config.linux.security_context.seccomp.profile_type == cri.SecurityProfile.Unconfined


@pytest.mark.parametrize(("version", "mode"), [("1.6", "wrapper"), ("2.2", "wrapper"), ("2.2", "nri")])
def test_the_shipped_snippets_are_merged_with_only_host_facts_overridden(
    tmp_path: Path, version: str, mode: str
) -> None:
    binaries = Binaries(version, "/x/containerd", "/x/containerd-shim-runc-v2", "/x/ctr")  # type: ignore[arg-type]
    shipped = snippets(version, mode)  # type: ignore[arg-type]
    config, changed = compose(
        tmp_path, binaries, CriSettings(snippets=shipped, spotgpu_runtime="/t/shim", nri=mode == "nri")
    )
    assert tomllib.loads(dumps_toml(config)) == config  # what containerd reads is what we composed
    for snippet in shipped:
        layer = tomllib.loads(snippet.read_text())

        def walk(node: Any, got: Any, path: str) -> None:
            for key, value in node.items():
                where = f"{path}.{key}" if path else key
                if isinstance(value, dict):
                    walk(value, got[key], where)
                elif not any(where.endswith(c) for c in changed):
                    assert got[key] == value, where  # the snippet's own value reaches containerd

        walk(layer, config, "")
    overridden = {c.rsplit(".", 1)[-1] for c in changed}
    assert overridden <= {"Root", "SystemdCgroup", "runtime_path", "BinaryName", "socket_path"}
    text = "\n".join(s.read_text() for s in shipped)
    assert (SPOTGPU_RUNTIME_PATH in text) == (mode == "wrapper")


def test_every_shipped_snippet_is_used_by_a_test_node() -> None:
    used = {p.name for v, m in [("1.6", "wrapper"), ("2.2", "wrapper"), ("2.2", "nri")] for p in snippets(v, m)}  # type: ignore[arg-type]
    assert used == {p.name for p in snippet_dir().glob("*.toml")}


# --- real containerd -----------------------------------------------------------------------------


@pytest.mark.root
@pytest.mark.parametrize("version", ["1.6", "2.2"])
def test_the_spotgpu_handler_passes_only_our_annotations(
    version: str, tmp_path: Path, cri_images: list[Path], containerd_binaries: Callable[[str], Any]
) -> None:
    """deploy/containerd's allow-lists: pod annotations of platform.k8s.io/ and spotgpu.io/ reach
    a spotgpu container's spec, container (device plugin) annotations of platform.k8s.io/ too;
    nothing else, and nothing at all through a handler without the lists (runc)."""
    shim = tmp_path / "shim"
    shim.write_text('#!/bin/sh\nexec runc "$@"\n')
    shim.chmod(0o755)
    settings = CriSettings(snippets=snippets(version, "wrapper"), spotgpu_runtime=str(shim))  # type: ignore[arg-type]
    with CriContainerd(tmp_path / "ctd", containerd_binaries(version), settings, cri_images) as daemon:
        kubelet = KubeletCri(daemon.address, log_root=tmp_path / "logs", cgroup_root=f"sg-cri-{version}")
        try:
            pod_annotations = {"platform.k8s.io/a": "1", "spotgpu.io/b": "2", "example.com/c": "3"}
            seen = {}
            for handler in ("spotgpu", "runc"):
                pod = kubelet.run_pod(
                    PodSpec("ns", f"p-{handler}", runtime_handler=handler, annotations=pod_annotations)
                )
                pod.grants["c"] = device_options(
                    [dp.ContainerAllocateResponse(annotations={"platform.k8s.io/d": "4", "example.com/e": "5"})]
                )
                cid = kubelet.create_container(pod, ContainerSpec("c"))
                spec = kubelet.runtime_spec(cid)
                seen[handler] = {k for k in spec["annotations"] if not k.startswith("io.kubernetes.")}
                kubelet.delete_pod(pod)
            assert seen["spotgpu"] == {"platform.k8s.io/a", "spotgpu.io/b", "platform.k8s.io/d"}
            assert seen["runc"] == set()
            assert kubelet.version().runtime_api_version == "v1"
        finally:
            kubelet.close()
