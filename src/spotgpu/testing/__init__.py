"""Test doubles and harness pieces shipped with spotgpu.

Used by the test suite and by ``spotgpu node-e2e``, which runs the whole node side on one
machine. Each double speaks the real wire format of the component it stands in for:

* :mod:`~spotgpu.testing.containerd`: a private, real containerd instance and busybox root
  filesystems / OCI bundles (not a double: the real daemon with private paths).
* :mod:`~spotgpu.testing.kubelet`: the kubelet's side of the device plugin API (Registration,
  then GetDevicePluginOptions, ListAndWatch and Allocate calls, admission, restarts);
  :mod:`~spotgpu.testing.podresources`: the pod-resources API server;
  :mod:`~spotgpu.testing.vendorplugin`: a vendor device plugin (NVIDIA-like); all over real gRPC
  on unix sockets (:mod:`~spotgpu.testing.grpcserver`).
* :mod:`~spotgpu.testing.kubeapi`: an HTTP Kubernetes API double.
"""
