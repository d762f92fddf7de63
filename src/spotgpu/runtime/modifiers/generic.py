"""Generic: environment variables from the ``platform.k8s.io/container-env`` annotation.

Pure. The value is a JSON object ``{"NAME": "value", ...}``; the key follows the same targeting
rule as the device-sync annotation (unsuffixed: the container whose spec carries it;
``.<container>``: only that container; see :mod:`spotgpu.core.codec`). Applied in order:
unsuffixed first, then the suffixed key; the two must not give one name different values.

Refused with :class:`GenericEnvError` (container creation fails, message names the key):
invalid JSON or duplicate keys, a value that is not an object of strings, more than
:data:`MAX_VARIABLES` names or :data:`~spotgpu.core.codec.MAX_VALUE_BYTES` bytes, a name that is
not ``[A-Za-z_][A-Za-z0-9_]*``, a name in ``runtime.deniedEnv`` (device selectors of
nvidia-container-runtime), or a name the device sync set (the synced GPU's env wins, always).
"""

from __future__ import annotations

import json
import re
from typing import Final

from spotgpu.core import keys
from spotgpu.core.codec import MAX_VALUE_BYTES, annotation_values_for
from spotgpu.core.errors import ValidationError
from spotgpu.runtime.modifiers.base import ModifyContext
from spotgpu.runtime.spec import ContainerKind, Spec, set_env, string_annotations

MAX_VARIABLES: Final = 256
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class GenericEnvError(ValidationError):
    """The container-env annotation is malformed, oversized or sets a forbidden name."""


def _pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise GenericEnvError(f"duplicate JSON key {key!r}")
        out[key] = value
    return out


def parse_env(key: str, value: str) -> list[tuple[str, str]]:
    """The ``(name, value)`` pairs of one annotation value, in order; raise :class:`GenericEnvError`."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_VALUE_BYTES:
        raise GenericEnvError(f"annotation {key!r} is {size} bytes; at most {MAX_VALUE_BYTES}")
    try:
        data = json.loads(value, object_pairs_hook=_pairs)
    except GenericEnvError as exc:
        raise GenericEnvError(f"annotation {key!r}: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise GenericEnvError(f"annotation {key!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise GenericEnvError(f"annotation {key!r} must be a JSON object of NAME: value, got {type(data).__name__}")
    if len(data) > MAX_VARIABLES:
        raise GenericEnvError(f"annotation {key!r} sets {len(data)} variables; at most {MAX_VARIABLES}")
    out: list[tuple[str, str]] = []
    for name, val in data.items():
        if _NAME.fullmatch(name) is None:
            raise GenericEnvError(f"annotation {key!r}: {name[:80]!r} is not an environment variable name")
        if not isinstance(val, str) or "\0" in val:
            raise GenericEnvError(f"annotation {key!r}: the value of {name} must be a string without NUL")
        out.append((name, val))
    return out


class Generic:
    name = "generic"

    def modify(self, spec: Spec, ctx: ModifyContext) -> None:
        if ctx.identity.kind is ContainerKind.SANDBOX:
            return
        found = annotation_values_for(
            string_annotations(spec), ctx.identity.container_name or "", keys.CONTAINER_ENV_PREFIX
        )
        if not found:
            return
        denied = set(ctx.config.denied_env)
        synced = ctx.sync.env_names if ctx.sync is not None else frozenset()
        env: dict[str, tuple[str, str]] = {}
        for key, value in found:
            for name, val in parse_env(key, value):
                if name in denied:
                    raise GenericEnvError(
                        f"annotation {key!r} may not set {name}: it selects devices (runtime.deniedEnv)"
                    )
                if name in synced:
                    raise GenericEnvError(f"annotation {key!r} may not set {name}: the synced devices set it")
                seen = env.setdefault(name, (val, key))
                if seen[0] != val:
                    raise GenericEnvError(f"{name} is set to different values by {seen[1]!r} and {key!r}")
        for name, (val, _) in env.items():
            set_env(spec, name, val)


__all__ = ["MAX_VARIABLES", "Generic", "GenericEnvError", "parse_env"]
