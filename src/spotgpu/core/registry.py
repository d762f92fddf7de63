"""A named registry for extension points (plugins, actions, modifiers, detectors, adapters).

In-memory only; no side effects beyond the registry object. Each extension module registers
its factory under a unique NAME; registering a name twice is an error (two modules claiming
the same plugin is always a bug), and looking up an unknown name lists the known ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from spotgpu.core.errors import ValidationError

F = TypeVar("F")


class RegistryError(ValidationError):
    """A duplicate registration or an unknown name."""


class Registry(Generic[F]):
    """Maps a name to a factory (or any object) of one extension point."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, F] = {}

    def register(self, name: str, item: F) -> F:
        if not name or not name.strip():
            raise RegistryError(f"{self.kind}: a registered name must not be empty")
        if name in self._items:
            raise RegistryError(f"{self.kind} {name!r} is already registered ({self._items[name]!r})")
        self._items[name] = item
        return item

    def decorator(self, name: str) -> Callable[[F], F]:
        """``@registry.decorator("gang")`` on a class or function registers it."""

        def wrap(item: F) -> F:
            return self.register(name, item)

        return wrap

    def get(self, name: str) -> F:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "none"
            raise RegistryError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._items))

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)


__all__ = ["Registry", "RegistryError"]
