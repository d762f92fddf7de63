"""Small standard-library helpers with side effects, shared by every layer but the core.

Imports nothing of spotgpu and nothing outside the standard library (an import-linter contract
in pyproject.toml keeps it so), so the fd holder, the runtime and the agent can all use it
without pulling in each other. The decision core does no I/O and may not import it.
"""
