"""What a plugin answers at an extension point: a :class:`Status` with a :class:`Code` and a reason.

Pure data; no side effects. The codes follow kube-scheduler's framework (``Success``,
``Unschedulable``, ``UnschedulableAndUnresolvable``, ``Wait``, ``Error``) and tell the cycle what
may change the answer, which decides how it treats the gang (docs/scheduler.md, "Statuses"):

* ``Unschedulable``: not now, but possibly once capacity grows (GPUs freed by placements undone,
  by preemption, by pods ending). The gang is retried; a failed reserved gang preempts.
* ``UnschedulableAndUnresolvable``: not as the cluster is built (a pool without such nodes, a pod
  larger than any node, the wrong GPU resource). Freeing capacity cannot help: no preemption is
  tried for it, and within a cycle the answer is kept even when capacity grows.
* ``Wait``: nothing is wrong with the gang, it waits for something already under way (its
  members to be created, its evicted pods to go, the GPUs nominated for it to be released).
* ``Error``: a plugin could not decide (a bug or bad data it detected). The gang is not placed
  and not preempted for in this cycle; the reason says what failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final


class Code(StrEnum):
    SUCCESS = "Success"
    UNSCHEDULABLE = "Unschedulable"
    """Might fit once capacity grows (retry; reserved gangs preempt)."""
    UNRESOLVABLE = "UnschedulableAndUnresolvable"
    """Cannot fit as the cluster is built; freeing capacity does not help (no preemption)."""
    WAIT = "Wait"
    """Waits for something already under way (members being created or evicted, nominated GPUs)."""
    ERROR = "Error"
    """A plugin failed to decide; the gang is skipped in this cycle."""


_SEVERITY: Final = {Code.SUCCESS: 0, Code.WAIT: 1, Code.UNSCHEDULABLE: 2, Code.UNRESOLVABLE: 3, Code.ERROR: 4}


@dataclass(frozen=True, slots=True)
class Status:
    """An extension point's answer. ``reason`` is empty exactly for ``Success``."""

    code: Code = Code.SUCCESS
    reason: str = ""
    ok: bool = field(init=False, repr=False, compare=False)
    """``code is Success`` (a field: read on every task's admission)."""

    def __post_init__(self) -> None:
        if not isinstance(self.code, Code):
            raise TypeError(f"Status code must be a Code, got {self.code!r}")
        if not isinstance(self.reason, str):
            raise TypeError(f"Status reason must be a string, got {type(self.reason).__name__}")
        if (self.code is Code.SUCCESS) != (not self.reason):
            raise ValueError(f"a {self.code.value} status {'has no' if self.reason else 'needs a'} reason")
        object.__setattr__(self, "ok", self.code is Code.SUCCESS)

    @property
    def resolvable(self) -> bool:
        """Whether freeing capacity could change the answer (everything but Unresolvable and Error)."""
        return self.code not in (Code.UNRESOLVABLE, Code.ERROR)

    @classmethod
    def unschedulable(cls, reason: str) -> Status:
        return cls(Code.UNSCHEDULABLE, reason)

    @classmethod
    def unresolvable(cls, reason: str) -> Status:
        return cls(Code.UNRESOLVABLE, reason)

    @classmethod
    def wait(cls, reason: str) -> Status:
        return cls(Code.WAIT, reason)

    @classmethod
    def error(cls, reason: str) -> Status:
        return cls(Code.ERROR, reason)


OK: Final = Status()
"""The one ``Success`` status (compare with ``status.ok``)."""


def combine(codes: list[Code]) -> Code:
    """The code of a gang that failed for several reasons: the one that leaves it least hope.

    Unresolvable only when every cause is (one Unschedulable cause means freeing capacity may
    help); Error when any plugin failed; Wait when every cause is a wait.
    """
    if not codes:
        return Code.SUCCESS
    if Code.ERROR in codes:
        return Code.ERROR
    if all(c is Code.UNRESOLVABLE for c in codes):
        return Code.UNRESOLVABLE
    if all(c is Code.WAIT for c in codes):
        return Code.WAIT
    return max((c for c in codes if c is not Code.UNRESOLVABLE), key=_SEVERITY.__getitem__)


__all__ = ["OK", "Code", "Status", "combine"]
