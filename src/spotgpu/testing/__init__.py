"""Test doubles and harness pieces shipped with spotgpu.

Decides nothing. Side effects: whatever each double or rig starts (private containerd
instances, gRPC and HTTP servers on unix sockets or loopback, runc containers, ``gcc``).

Used by the test suite, ``spotgpu node-e2e`` and ``spotgpu bench``; never by production code:
import-linter's contracts (``pyproject.toml``) let only ``spotgpu.testing``, ``spotgpu.e2e``,
``spotgpu.bench`` and the CLI modules of those two subcommands import it, and the production
image leaves this package out (``deploy/Dockerfile``). Each double speaks the real wire format
of the component it stands in for:

* :mod:`~spotgpu.testing.containerd`: a private, real containerd instance and busybox root
  filesystems / OCI bundles (not a double: the real daemon with private paths).
* :mod:`~spotgpu.testing.kubelet`: the kubelet's side of the device plugin API (Registration,
  then GetDevicePluginOptions, ListAndWatch and Allocate calls, admission, restarts);
  :mod:`~spotgpu.testing.podresources`: the pod-resources API server;
  :mod:`~spotgpu.testing.vendorplugin`: a vendor device plugin (NVIDIA-like); all over real gRPC
  on unix sockets (:mod:`~spotgpu.testing.grpcserver`).
* :mod:`~spotgpu.testing.kubeapi`: an HTTP Kubernetes API double.
* :mod:`~spotgpu.testing.cri` and :mod:`~spotgpu.testing.cri_rig`: the kubelet's side of CRI
  against a real containerd (:mod:`~spotgpu.testing.cri_containerd`: 1.6 and 2.2).
* :mod:`~spotgpu.testing.fakes`: in-memory implementations of the agent's ports.
* :mod:`~spotgpu.testing.standin` (a stand-in GPU client: NVIDIA session ioctl sequences and a
  static C program issuing them, built by :mod:`~spotgpu.testing.cbuild`) and
  :mod:`~spotgpu.testing.guard_testbed` (runc owner containers and the guard's fd holder as a
  child), for the guard's tests and ``spotgpu bench guard``.
"""
