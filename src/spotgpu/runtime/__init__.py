"""spotgpu-runtime: the OCI runtime wrapper between containerd's runc shim and runc."""
