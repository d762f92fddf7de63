"""The cluster simulator behind ``spotgpu simulate``: traces through the real scheduler and lending policy."""
