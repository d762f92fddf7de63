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

Decides what every layer shares: device and twin IDs, references, the annotation codec, the
lending state machine and the owner-return model, the configuration's validation. No side
effects, except that :func:`~spotgpu.core.config.read_yaml` and
:func:`~spotgpu.core.config.load_yaml_file` read the one file they are given. An import-linter
contract (pyproject.toml) keeps I/O libraries and every other spotgpu package out of it; the
ports the agent and the runtime talk to the node through are in :mod:`spotgpu.ports`.
"""
