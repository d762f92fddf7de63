"""The agent reads the kubelet's pod-resources API through the same client as spotgpu-runtime's
service (:class:`~spotgpu.adapters.kubelet.PodResourcesView`), over real gRPC against the
pod-resources double (no kubelet can run here; the double speaks pod-resources v1)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from spotgpu.adapters.kubelet import PodResourcesView
from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.errors import TemporaryError
from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, SPOT_GPU_RESOURCE, DeviceID
from spotgpu.core.refs import PodRef
from spotgpu.testing.podresources import ContainerDevices, ContainerResources, PodResources, PodResourcesDouble


def twins(*ids: str) -> ContainerDevices:
    return ContainerDevices(SPOT_GPU_RESOURCE, ids)


def test_list_gives_one_row_per_container_and_resource(tmp_path: Path) -> None:
    with PodResourcesDouble(tmp_path / "kubelet.sock") as double:
        double.set_pods(
            [
                PodResources(
                    "dev",
                    "devbox",
                    (
                        ContainerResources(
                            "main",
                            (
                                ContainerDevices(NVIDIA_GPU_RESOURCE, ("GPU-0", "GPU-1"), (0,)),
                                ContainerDevices("example.com/nic", ("nic-0",)),
                            ),
                        ),
                        ContainerResources("sidecar"),
                    ),
                ),
                PodResources("spot", "job", (ContainerResources("w", (twins("spot-GPU-0::1"),)),)),
                PodResources("Not_A_Namespace", "x", (ContainerResources("c", (twins("spot-GPU-1"),)),)),
            ]
        )
        view = PodResourcesView(double.socket)
        try:
            rows = view.list()
        finally:
            view.close()
    assert rows == [
        AllocatedDevices(PodRef("dev", "devbox"), "main", NVIDIA_GPU_RESOURCE, (DeviceID("GPU-0"), DeviceID("GPU-1"))),
        AllocatedDevices(PodRef("dev", "devbox"), "main", "example.com/nic", (DeviceID("nic-0"),)),  # type: ignore[arg-type]
        AllocatedDevices(PodRef("spot", "job"), "w", SPOT_GPU_RESOURCE, (DeviceID("spot-GPU-0::1"),)),
    ]  # the pod whose name cannot be a reference is skipped (it cannot hold our devices)


def test_a_kubelet_that_is_down_is_a_temporary_error(tmp_path: Path) -> None:
    view = PodResourcesView(tmp_path / "absent.sock")
    try:
        with pytest.raises(TemporaryError, match="no such socket"):
            view.list(timeout=1.0)
    finally:
        view.close()


def test_a_restarted_kubelet_socket_is_used_again_at_once(tmp_path: Path) -> None:
    """A kubelet restart deletes and re-creates the socket; a call made meanwhile waits for the
    new one (within its deadline) instead of failing, and the client does not back off for long."""
    double = PodResourcesDouble(tmp_path / "kubelet.sock").start()
    double.set_pods([PodResources("spot", "job", (ContainerResources("w", (twins("spot-GPU-0"),)),))])
    view = PodResourcesView(double.socket, timeout=5.0)
    try:
        assert len(view.list()) == 1
        double.stop()
        double.socket.unlink(missing_ok=True)
        with pytest.raises(TemporaryError):
            view.list(timeout=0.3)  # nothing there: a temporary error after the deadline
        threading.Timer(0.3, double.start).start()  # the kubelet comes back while the next call waits
        began = time.monotonic()
        assert len(view.list()) == 1
        assert time.monotonic() - began < 3.0
    finally:
        view.close()
        double.stop()
