"""Typed configuration: a small loader from YAML/JSON mappings into frozen dataclasses.

Pure apart from :func:`load_yaml_file`, which reads one file. Any frozen dataclass can be
loaded with :func:`from_mapping`; YAML keys are the camelCase spelling of the field names
(``max_inactive_time`` <-> ``maxInactiveTime``). Supported field types: ``str``, ``int``,
``float``, ``bool``, :class:`pathlib.Path`, :data:`Seconds` (``"10s"``, ``"5m"``, ``"1h30m"``,
``"250ms"`` or a number of seconds), ``StrEnum`` subclasses, ``Literal[...]``, nested
dataclasses, ``tuple[X, ...]``, ``dict[str, X]`` and ``X | None``.

Every error is a :class:`ConfigError` whose message starts with the full key path
(``agent.guard.failOpenTimeout: ...``); unknown keys are errors too (with a suggestion), so a
typo never silently falls back to a default. The configurations themselves live with their
components (the node agent's in :mod:`spotgpu.core.config`).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import math
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal, NewType, TypeVar

from spotgpu.core.errors import ValidationError
from spotgpu.core.ids import (
    ResourceName,
    validate_resource_name,
)

Seconds = NewType("Seconds", float)
"""A duration in seconds; in YAML a number or a Go-style duration string."""

T = TypeVar("T")

_DURATION_PART: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")
_UNIT_SECONDS: Final = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


class ConfigError(ValidationError):
    """A configuration value is missing, unknown or malformed; the message names the key."""


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def parse_duration(value: object, key: str = "duration") -> Seconds:
    """``"1h30m"``, ``"250ms"``, ``"10s"`` or a non-negative number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a duration like '10s' or a number of seconds, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        pos, seconds = 0, 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if text.startswith("-"):
            raise ConfigError(f"{key}: duration must not be negative, got {value!r}")
        if pos != len(text) or pos == 0:
            try:
                seconds = float(text)
            except ValueError:
                raise ConfigError(
                    f"{key}: {value!r} is not a duration; use e.g. '30s', '5m', '1h30m', '250ms' or a number of seconds"
                ) from None
    else:
        raise ConfigError(f"{key}: expected a duration like '10s' or a number of seconds, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"{key}: duration must be finite and not negative, got {value!r}")
    return Seconds(seconds)


def _convert(hint: Any, value: object, key: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return _convert(non_none[0], value, key)
        errors = []
        for arg in non_none:
            try:
                return _convert(arg, value, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError("; ".join(errors))
    if value is None:
        raise ConfigError(f"{key}: must not be null")
    if hint is Seconds:
        return parse_duration(value, key)
    if hint is ResourceName:
        try:
            return validate_resource_name(value)
        except ValidationError as exc:
            raise ConfigError(f"{key}: {exc}") from None
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, allowed))}")
        return value
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__}")
        return tuple(_convert(args[0], item, f"{key}[{i}]") for i, item in enumerate(value))
    if origin is dict:
        kt, vt = typing.get_args(hint)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return {_convert(kt, k, f"{key}"): _convert(vt, v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        scalar = getattr(hint, "from_config_scalar", None)
        if scalar is not None and not isinstance(value, Mapping):
            return scalar(value, key)  # a dataclass that also has a one-value spelling
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return from_mapping(hint, value, key)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(repr(m.value) for m in hint)}") from None
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if hint is Path:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}: expected a path, got {value!r}")
        return Path(value)
    raise ConfigError(f"{key}: unsupported configuration type {hint!r}")  # a programming error


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    # Resolving a dataclass's annotations is most of a large file's loading time (a scenario
    # with tens of thousands of inline spans); classes do not change, so resolve each once.
    return typing.get_type_hints(cls)


def from_mapping(cls: type[T], data: object, path: str = "") -> T:
    """Build dataclass ``cls`` from ``data`` (camelCase keys), validating every value.

    After conversion, the dataclass's own ``__post_init__`` may raise :class:`ConfigError` for
    cross-field rules; such errors are re-raised with ``path`` prepended when they lack it.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or '<root>'}: expected a mapping, got {type(data).__name__}")
    hints = _type_hints(cls)
    fields = {camel(f.name): f for f in dataclasses.fields(cls) if f.init}
    prefix = f"{path}." if path else ""
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(sorted(fields))}"
            raise ConfigError(f"{prefix}{key}: unknown key{hint}")
    kwargs: dict[str, Any] = {}
    for yaml_key, field in fields.items():
        if yaml_key in data:
            kwargs[field.name] = _convert(hints[field.name], data[yaml_key], prefix + yaml_key)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{prefix}{yaml_key}: required key is missing")
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        msg = str(exc)
        raise ConfigError(msg if not path or msg.startswith(path) else f"{path}: {msg}") from None


def read_yaml(path: Path, what: str = "configuration") -> object:
    """Read and parse one YAML file; errors name the file (``what`` says what it should hold).

    Safe loading only (plain data, no Python objects), through libyaml's C parser when PyYAML
    was built with it (``yaml.CSafeLoader``, about five times faster on a 1.1 MB scenario),
    else the pure-Python ``yaml.SafeLoader``; both build the same data.
    """
    import yaml

    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader)  # a safe loader, C or Python
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def load_yaml_file(path: Path, cls: type[T], section: str | None = None) -> T:
    """Read a YAML file and load ``cls`` from it (or from its top-level ``section``)."""
    data = read_yaml(path)
    if data is None:
        data = {}
    if section is not None:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        data = data.get(section, {})
        if data is None:
            data = {}
    return from_mapping(cls, data, section or "")


__all__ = [
    "ConfigError",
    "Seconds",
    "camel",
    "from_mapping",
    "load_yaml_file",
    "parse_duration",
    "read_yaml",
]
