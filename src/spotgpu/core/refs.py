"""References to pods and containers: ``ns/pod`` and ``ns/pod/container``.

Pure parsing and formatting; no side effects. A namespace written as ``_`` means "the
namespace of the pod that carries the reference" and is kept unresolved (``namespace=None``)
until :meth:`ContainerRef.resolve` / :meth:`PodRef.resolve` is given that namespace; this is
how the ``container-devices-from`` annotation names a ShadowPod in the spot pod's namespace.

Names are checked against Kubernetes' rules: namespace and container names are DNS-1123
labels (at most 63 characters of ``[a-z0-9-]``, alphanumeric at both ends); pod names are
DNS-1123 subdomains (at most 253 characters, dot-separated labels).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from spotgpu.core.errors import ValidationError

SAME_NAMESPACE: Final = "_"

_LABEL_RE: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN_RE: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class RefError(ValidationError):
    """A pod or container reference is malformed; the message names the part."""


def label_problem(what: str, value: str, limit: int = 63) -> str | None:
    """Why ``value`` is not a DNS-1123 label of at most ``limit`` characters, or None; ``what``
    names the value in the message (``GangJob name 'X'``)."""
    if not value:
        return f"{what} is empty"
    if len(value) > limit:
        return f"{what} is {len(value)} characters; at most {limit} allowed"
    if _LABEL_RE.fullmatch(value) is None:
        return (
            f"{what} is not a DNS-1123 label "
            "(lowercase letters, digits and '-', starting and ending with a letter or digit)"
        )
    return None


def _check_label(kind: str, value: str, text: str) -> str:
    what = f"{kind} {value[:70]!r} in reference {text!r}" if value else f"{kind} in reference {text!r}"
    problem = label_problem(what, value)
    if problem is not None:
        raise RefError(problem)
    return value


def _check_pod_name(value: str, text: str) -> str:
    if not value:
        raise RefError(f"pod name in reference {text!r} is empty")
    if len(value) > 253:
        raise RefError(f"pod name in reference {text!r} is {len(value)} characters; at most 253 allowed")
    if _SUBDOMAIN_RE.fullmatch(value) is None:
        raise RefError(
            f"pod name {value!r} in reference {text!r} is not a DNS-1123 subdomain "
            "(lowercase letters, digits, '-' and '.')"
        )
    return value


def _check_namespace(value: str, text: str) -> str | None:
    if value == SAME_NAMESPACE:
        return None
    return _check_label("namespace", value, text)


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    """A pod, ``namespace/name``; ``namespace is None`` means "same namespace" (``_``)."""

    namespace: str | None
    name: str

    def __post_init__(self) -> None:
        text = self.format()
        if self.namespace is not None:
            _check_label("namespace", self.namespace, text)
        _check_pod_name(self.name, text)

    @classmethod
    def parse(cls, text: object) -> PodRef:
        """Parse ``ns/pod`` or ``_/pod``; raise :class:`RefError` naming the bad part."""
        if not isinstance(text, str):
            raise RefError(f"pod reference must be a string, got {type(text).__name__}")
        parts = text.split("/")
        if len(parts) != 2:
            raise RefError(f"pod reference {text!r} must have the form 'namespace/pod' ('_' for the same namespace)")
        return cls(_check_namespace(parts[0], text), parts[1])

    @property
    def is_relative(self) -> bool:
        return self.namespace is None

    def resolve(self, namespace: str) -> PodRef:
        """Return the reference with ``_`` replaced by ``namespace`` (no-op when absolute)."""
        return self if self.namespace is not None else PodRef(namespace, self.name)

    def container(self, name: str) -> ContainerRef:
        return ContainerRef(self.namespace, self.name, name)

    def format(self) -> str:
        return f"{SAME_NAMESPACE if self.namespace is None else self.namespace}/{self.name}"

    def __str__(self) -> str:
        return self.format()


@dataclass(frozen=True, slots=True, order=True)
class ContainerRef:
    """A container, ``namespace/pod/container``; ``namespace is None`` means ``_``."""

    namespace: str | None
    pod: str
    name: str

    def __post_init__(self) -> None:
        text = self.format()
        if self.namespace is not None:
            _check_label("namespace", self.namespace, text)
        _check_pod_name(self.pod, text)
        _check_label("container name", self.name, text)

    @classmethod
    def parse(cls, text: object) -> ContainerRef:
        """Parse ``ns/pod/container`` or ``_/pod/container``; raise :class:`RefError` otherwise."""
        if not isinstance(text, str):
            raise RefError(f"container reference must be a string, got {type(text).__name__}")
        parts = text.split("/")
        if len(parts) != 3:
            raise RefError(
                f"container reference {text!r} must have the form 'namespace/pod/container'"
                " ('_' for the same namespace)"
            )
        return cls(_check_namespace(parts[0], text), parts[1], parts[2])

    @property
    def is_relative(self) -> bool:
        return self.namespace is None

    @property
    def pod_ref(self) -> PodRef:
        return PodRef(self.namespace, self.pod)

    def resolve(self, namespace: str) -> ContainerRef:
        """Return the reference with ``_`` replaced by ``namespace`` (no-op when absolute)."""
        return self if self.namespace is not None else ContainerRef(namespace, self.pod, self.name)

    def format(self) -> str:
        return f"{SAME_NAMESPACE if self.namespace is None else self.namespace}/{self.pod}/{self.name}"

    def __str__(self) -> str:
        return self.format()


__all__ = ["SAME_NAMESPACE", "ContainerRef", "PodRef", "RefError", "label_problem"]
