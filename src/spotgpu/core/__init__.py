"""The shared core model: pure data and decisions, no I/O.

Used alike by the scheduler, the agent, spotgpu-runtime and the simulator. Modules:

* :mod:`~spotgpu.core.ids`: device IDs, resource names, real <-> twin IDs.
* :mod:`~spotgpu.core.refs`: pod and container references.
* :mod:`~spotgpu.core.keys`: every annotation key and label name.
* :mod:`~spotgpu.core.codec`: the ``container-devices-from`` annotation codec.
* :mod:`~spotgpu.core.types`: enums and small value types.
* :mod:`~spotgpu.core.mapping_cache`: owner -> device -> spot users.
* :mod:`~spotgpu.core.lending`: the lending state machine; :mod:`~spotgpu.core.idle_forecast`: the owner-return model.
* :mod:`~spotgpu.core.config`: typed configuration loaded from YAML.
* :mod:`~spotgpu.core.clock`, :mod:`~spotgpu.core.registry`, :mod:`~spotgpu.core.errors`.

An import-linter contract (pyproject.toml) keeps I/O libraries out of this package.
"""
