"""The node agent: spot-gpu device plugin, idle/return detection, lending, eviction, metrics, recovery."""
