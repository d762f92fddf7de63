"""The guard's seccomp rule: which GPU calls of an owner container are held, and how the rule
is composed into the container's OCI spec.

Decides what an owner container's seccomp filter sends to the guard. Pure apart from
:func:`listener_ready`, which connects to a unix socket. spotgpu-runtime calls
:func:`apply_guard_rule` on the ``config.json`` of an owner container at ``create``, after
checking :func:`listener_ready`; runc then hands the guard one notify fd per container process
it starts (``create`` and every ``exec``).

What the rule matches, and why (details and the NVIDIA facts in ``docs/guard.md``)
---------------------------------------------------------------------------------
Only ``ioctl`` requests whose low 32 bits satisfy ``(request & 0xC000FFFF) == 0xC00046D2``:
``_IOWR('F', NV_ESC_CHECK_VERSION_STR = 210, <any size>)``. Every NVIDIA userspace client
(libcuda's ``cuInit``, libnvidia-ml's ``nvmlInit`` and so nvidia-smi, DCGM) issues this version
check on ``/dev/nvidiactl`` as the first ioctl of a new RM session, before it allocates an RM
client, so before it can list GPU processes or read memory usage (a failing check is the
familiar "Driver/library version mismatch"). The owner's steady-state work (RM_CONTROL,
RM_ALLOC, MAP_MEMORY, ... and all of UVM's raw-numbered ioctls) never matches, so it pays only
the filter's few BPF instructions, never a notification. The mask keeps both ``_IOC`` direction
bits, so the un-encoded framebuffer ioctls that share type ``'F'`` (``0x46xx``) never match, and
it ignores bits 32-63, so a request that a caller sign-extended to 64 bits still matches.

Composition with an existing profile (measured with runc 1.1.5 and libseccomp 2.5.4)
------------------------------------------------------------------------------------
libseccomp lets an unconditional rule for a syscall win over every conditional rule of the
same syscall, whatever their order: a RuntimeDefault profile's ``ioctl`` ALLOW would silently
disable a conditional NOTIFY. So when the profile allows ``ioctl`` unconditionally with an
action other than its default, the rule takes ``ioctl`` out of that entry and adds, besides the
NOTIFY rule, the exact complement of the match with the entry's action: one rule per masked
bit, ``(request & bit) == (~value & bit)``, 18 rules that together cover every request the
NOTIFY rule does not. Profiles the rule cannot compose with exactly are refused with
:class:`GuardRuleConflict` and left unchanged: an existing listener or NOTIFY rule (one
listener per filter), conditional ``ioctl`` rules that may overlap the match, or a profile that
does not allow the matched requests at all (the guard's CONTINUE would widen it).
"""

from __future__ import annotations

import copy
import os
import platform
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from spotgpu.core import keys
from spotgpu.core.errors import ValidationError
from spotgpu.core.refs import ContainerRef, RefError

_U64: Final = (1 << 64) - 1

# Linux _IOC layout: dir << 30 | size << 16 | type << 8 | nr (asm-generic/ioctl.h). The one home
# of NVIDIA's ioctl numbering in spotgpu: the stand-in client, the GPU check, the benchmark and
# the node end-to-end run all take their numbers from here.
IOC_READ_WRITE: Final = 0xC000_0000
NV_IOCTL_MAGIC: Final = 0x46  # 'F'
NV_ESC_CHECK_VERSION_STR: Final = 210


def nv_ioctl(nr: int, size: int) -> int:
    """``_IOWR('F', nr, size)``, as NVIDIA's userspace encodes frontend and RM escapes."""
    if not 0 <= size < 1 << 14:
        raise ValueError(f"_IOC size {size} does not fit 14 bits")
    return IOC_READ_WRITE | size << 16 | NV_IOCTL_MAGIC << 8 | nr


NOTIFY: Final = "SCMP_ACT_NOTIFY"
ALLOW: Final = "SCMP_ACT_ALLOW"
LOG: Final = "SCMP_ACT_LOG"
_ALLOWING: Final = frozenset({ALLOW, LOG})
_ACTIONS: Final = frozenset(
    {
        "SCMP_ACT_KILL",
        "SCMP_ACT_KILL_PROCESS",
        "SCMP_ACT_KILL_THREAD",
        "SCMP_ACT_TRAP",
        "SCMP_ACT_ERRNO",
        "SCMP_ACT_TRACE",
        ALLOW,
        LOG,
        NOTIFY,
    }
)
_OPS: Final = frozenset(
    {
        "SCMP_CMP_NE",
        "SCMP_CMP_LT",
        "SCMP_CMP_LE",
        "SCMP_CMP_EQ",
        "SCMP_CMP_GE",
        "SCMP_CMP_GT",
        "SCMP_CMP_MASKED_EQ",
    }
)

SECCOMP_ARCHES: Final[Mapping[str, tuple[str, ...]]] = {
    "x86_64": ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"),
    "aarch64": ("SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"),
    "ppc64le": ("SCMP_ARCH_PPC64LE",),
    "s390x": ("SCMP_ARCH_S390X", "SCMP_ARCH_S390"),
}
"""Architectures listed when the rule creates a profile from scratch (as Docker's default does),
keyed by ``platform.machine()``; other machines get the native architecture only."""


class GuardRuleError(ValidationError):
    """The spec or an argument is malformed; the spec is left unchanged."""


class GuardRuleConflict(GuardRuleError):
    """The spec's seccomp profile cannot carry the guard's rule exactly; the spec is unchanged."""


@dataclass(frozen=True, slots=True)
class IoctlMatch:
    """``ioctl`` requests with ``(request & mask) == value`` (``SCMP_CMP_MASKED_EQ`` on ``args[1]``)."""

    name: str
    mask: int
    value: int

    def __post_init__(self) -> None:
        if not 0 < self.mask <= _U64 or not 0 <= self.value <= _U64 or self.value & ~self.mask:
            raise ValueError(f"{self.name}: value {self.value:#x} must lie within mask {self.mask:#x}")

    def matches(self, request: int) -> bool:
        return (request & self.mask) == self.value

    @property
    def complement_bits(self) -> tuple[tuple[int, int], ...]:
        """(bit, datum) pairs; a request matches none of ``(request & bit) == datum`` iff it matches."""
        return tuple((1 << i, ~self.value & (1 << i)) for i in range(64) if self.mask >> i & 1)


GUARD_MATCH: Final = IoctlMatch(
    "NV_ESC_CHECK_VERSION_STR",
    mask=0xC000_FFFF,
    value=IOC_READ_WRITE | NV_IOCTL_MAGIC << 8 | NV_ESC_CHECK_VERSION_STR,
)
"""What the guard holds: the RM API version check that opens every NVIDIA userspace session."""


# --- listener metadata --------------------------------------------------------------------


def format_listener_metadata(owner: ContainerRef) -> str:
    """The ``listenerMetadata`` string naming ``owner`` (see :data:`keys.GUARD_METADATA_OWNER`)."""
    return f"{keys.GUARD_METADATA_OWNER}={owner.format()}"


def parse_listener_metadata(metadata: object) -> ContainerRef | None:
    """The owner named in a ``listenerMetadata`` string; None when it names none.

    Raises :class:`GuardRuleError` when the owner entry is present but malformed.
    """
    if not isinstance(metadata, str):
        return None
    for item in metadata.split():
        key, sep, value = item.partition("=")
        if sep and key == keys.GUARD_METADATA_OWNER:
            try:
                owner = ContainerRef.parse(value)
            except RefError as exc:
                raise GuardRuleError(f"listenerMetadata {metadata!r}: {exc}") from None
            if owner.is_relative:
                raise GuardRuleError(f"listenerMetadata {metadata!r}: owner must name its namespace")
            return owner
    return None


# --- spec composition ---------------------------------------------------------------------


def _condition(entry_index: int, arg: object) -> tuple[int, str, int, int]:
    where = f"linux.seccomp.syscalls[{entry_index}].args"
    if not isinstance(arg, Mapping):
        raise GuardRuleError(f"{where}: expected objects, got {arg!r}")
    index, op = arg.get("index"), arg.get("op")
    value, value_two = arg.get("value", 0), arg.get("valueTwo", 0)
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= 5:
        raise GuardRuleError(f"{where}: index {index!r} is not 0..5")
    if op not in _OPS:
        raise GuardRuleError(f"{where}: op {op!r} is not one of {', '.join(sorted(_OPS))}")
    for name, number in (("value", value), ("valueTwo", value_two)):
        if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number <= _U64:
            raise GuardRuleError(f"{where}: {name} {number!r} is not an unsigned 64-bit integer")
    assert isinstance(value, int) and isinstance(value_two, int)
    return index, str(op), value, value_two


def _rules(entry_index: int, entry: Mapping[str, Any]) -> list[list[tuple[int, str, int, int]]]:
    """The libseccomp rules runc makes of one entry: conditions on distinct indices are ANDed
    into one rule; if an index repeats, every condition becomes a rule of its own (OR)."""
    args = entry.get("args") or []
    if not isinstance(args, list):
        raise GuardRuleError(f"linux.seccomp.syscalls[{entry_index}].args: expected a list")
    conditions = [_condition(entry_index, a) for a in args]
    if not conditions:
        return [[]]
    if len({c[0] for c in conditions}) == len(conditions):
        return [conditions]
    return [[c] for c in conditions]


def _disjoint(condition: tuple[int, str, int, int], match: IoctlMatch) -> bool:
    """True when no request that ``match`` selects can satisfy ``condition``."""
    index, op, value, value_two = condition
    if index != 1:
        return False
    lowest = match.value  # the smallest and largest 64-bit requests ``match`` selects
    highest = match.value | (~match.mask & _U64)
    if op == "SCMP_CMP_EQ":
        return not match.matches(value)
    if op == "SCMP_CMP_MASKED_EQ":  # runc: value = mask, valueTwo = datum
        return bool(value_two & ~value) or bool((match.value ^ value_two) & match.mask & value)
    if op == "SCMP_CMP_LT":
        return lowest >= value
    if op == "SCMP_CMP_LE":
        return lowest > value
    if op == "SCMP_CMP_GT":
        return highest <= value
    if op == "SCMP_CMP_GE":
        return highest < value
    return False  # SCMP_CMP_NE: overlaps unless the match is a single value, never the case here


def _arches(machine: str) -> list[str]:
    return list(SECCOMP_ARCHES.get(machine, ()))


def _notify_entry(match: IoctlMatch) -> dict[str, Any]:
    return {
        "names": ["ioctl"],
        "action": NOTIFY,
        "args": [{"index": 1, "op": "SCMP_CMP_MASKED_EQ", "value": match.mask, "valueTwo": match.value}],
    }


def _complement_entry(match: IoctlMatch, action: str) -> dict[str, Any]:
    return {
        "names": ["ioctl"],
        "action": action,
        "args": [
            {"index": 1, "op": "SCMP_CMP_MASKED_EQ", "value": bit, "valueTwo": datum}
            for bit, datum in match.complement_bits
        ],
    }


def guarded_owner(spec: Mapping[str, Any]) -> ContainerRef | None:
    """The owner whose guard rule ``spec`` carries (from its listener metadata), or None."""
    linux = spec.get("linux")
    seccomp = linux.get("seccomp") if isinstance(linux, Mapping) else None
    if not isinstance(seccomp, Mapping) or not seccomp.get("listenerPath"):
        return None
    return parse_listener_metadata(seccomp.get("listenerMetadata"))


def compose_seccomp(
    seccomp: Mapping[str, Any] | None,
    *,
    listener_path: str,
    metadata: str,
    match: IoctlMatch = GUARD_MATCH,
    machine: str = "",
) -> dict[str, Any]:
    """A new ``linux.seccomp`` object: ``seccomp`` (None = unconfined) plus the guard's rule.

    Pure; raises :class:`GuardRuleConflict` or :class:`GuardRuleError` as described in the
    module docstring.
    """
    profile, syscalls = _base_profile(seccomp, machine)
    default = str(profile.get("defaultAction"))
    unconditional, effective = _ioctl_action(syscalls, default, match)
    new_syscalls: list[Any] = []
    for i, entry in enumerate(syscalls):
        if i in unconditional:
            rest = [n for n in entry["names"] if n != "ioctl"]
            if rest:
                new_syscalls.append({**copy.deepcopy(dict(entry)), "names": rest})
        else:
            new_syscalls.append(copy.deepcopy(entry))
    new_syscalls.append(_notify_entry(match))
    if effective != default:
        new_syscalls.append(_complement_entry(match, effective))
    profile["syscalls"] = new_syscalls
    profile["listenerPath"] = listener_path
    profile["listenerMetadata"] = metadata
    return profile


def _base_profile(seccomp: Mapping[str, Any] | None, machine: str) -> tuple[dict[str, Any], list[Any]]:
    """A copy of the profile the rule composes with (unconfined when None), and its syscall
    entries; refused when it is malformed or already has a listener."""
    if seccomp is None:
        profile: dict[str, Any] = {"defaultAction": ALLOW, "syscalls": []}
        if arches := _arches(machine):
            profile["architectures"] = arches
    elif isinstance(seccomp, Mapping):
        profile = copy.deepcopy(dict(seccomp))
    else:
        raise GuardRuleError(f"linux.seccomp: expected an object, got {type(seccomp).__name__}")
    default = profile.get("defaultAction")
    if default not in _ACTIONS or default == NOTIFY:
        raise GuardRuleError(f"linux.seccomp.defaultAction: {default!r} is not a valid default action")
    if profile.get("listenerPath") or profile.get("listenerMetadata"):
        raise GuardRuleConflict(
            f"linux.seccomp already has a seccomp listener ({profile.get('listenerPath')!r}); "
            "a filter has one listener, so the guard cannot add its own"
        )
    syscalls = profile.get("syscalls")
    if syscalls is None:
        syscalls = []
    if not isinstance(syscalls, list):
        raise GuardRuleError("linux.seccomp.syscalls: expected a list")
    return profile, syscalls


def _ioctl_action(syscalls: list[Any], default: str, match: IoctlMatch) -> tuple[list[int], str]:
    """The entries that answer every ioctl unconditionally (the rule takes ioctl out of them), and
    the action the profile gives the guard's match; refused when the rule cannot compose."""
    unconditional: list[int] = []  # entries allowing ioctl without conditions
    matched_actions: set[str] = set()
    for i, entry in enumerate(syscalls):
        if not isinstance(entry, Mapping):
            raise GuardRuleError(f"linux.seccomp.syscalls[{i}]: expected an object")
        names, action = entry.get("names"), entry.get("action")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise GuardRuleError(f"linux.seccomp.syscalls[{i}].names: expected a non-empty list of names")
        if action not in _ACTIONS:
            raise GuardRuleError(f"linux.seccomp.syscalls[{i}].action: {action!r} is not a seccomp action")
        if action == NOTIFY:
            raise GuardRuleConflict(
                f"linux.seccomp.syscalls[{i}] already uses SCMP_ACT_NOTIFY ({', '.join(names)}); "
                "a filter has one listener, so the guard cannot add its own"
            )
        rules = _rules(i, entry)
        if "ioctl" not in names or action == default:  # runc drops rules equal to the default action
            continue
        overlapping = [r for r in rules if not any(_disjoint(c, match) for c in r)]
        if not overlapping:
            continue
        if any(r for r in overlapping):
            raise GuardRuleConflict(
                f"linux.seccomp.syscalls[{i}]: a conditional ioctl rule ({action}) may overlap the guard's "
                f"{match.name} match; libseccomp gives no defined order between them"
            )
        unconditional.append(i)
        matched_actions.add(str(action))
    if len(matched_actions) > 1:
        raise GuardRuleConflict(f"linux.seccomp: ioctl has several unconditional actions {sorted(matched_actions)}")
    effective = matched_actions.pop() if matched_actions else default
    if effective not in _ALLOWING:
        raise GuardRuleConflict(
            f"linux.seccomp: the profile answers {match.name} ioctls with {effective}; the guard's CONTINUE "
            "would let them through, widening the profile"
        )
    return unconditional, effective


def apply_guard_rule(spec: dict[str, Any], *, listener_path: str, owner: ContainerRef) -> None:
    """Add the guard's notify rule for ``owner`` to an OCI ``spec``, in place.

    Idempotent: a spec already carrying this rule for the same listener and owner is left
    as it is. On any error (:class:`GuardRuleConflict` for profiles the rule cannot compose
    with, :class:`GuardRuleError` for malformed input) the spec is unchanged. Also records
    the owner in the spec's annotations (:data:`keys.GUARDED`). Call it only when
    :func:`listener_ready` is true: runc refuses to start a container whose listener is down.
    """
    if not isinstance(spec, dict):
        raise GuardRuleError(f"spec: expected an object, got {type(spec).__name__}")
    if not isinstance(listener_path, str) or not os.path.isabs(listener_path):
        raise GuardRuleError(f"listener_path: {listener_path!r} must be an absolute path")
    if not isinstance(owner, ContainerRef) or owner.is_relative:
        raise GuardRuleError(f"owner: {owner!r} must be a container reference with its namespace")
    linux = spec.get("linux", {})
    if not isinstance(linux, dict):
        raise GuardRuleError(f"linux: expected an object, got {type(linux).__name__}")
    annotations = spec.get("annotations", {})
    if annotations is None:
        annotations = {}
    if not isinstance(annotations, dict):
        raise GuardRuleError(f"annotations: expected an object, got {type(annotations).__name__}")
    metadata = format_listener_metadata(owner)
    current = linux.get("seccomp")
    if isinstance(current, Mapping) and current.get("listenerPath") == listener_path:
        present = guarded_owner(spec)
        if present == owner and _notify_entry(GUARD_MATCH) in (current.get("syscalls") or []):
            if annotations.get(keys.GUARDED) != owner.format():
                spec["annotations"] = {**annotations, keys.GUARDED: owner.format()}
            return
        raise GuardRuleConflict(
            f"linux.seccomp: listener {listener_path!r} is already set for "
            f"{present.format() if present else 'another use'}, not for {owner.format()}"
        )
    profile = compose_seccomp(current, listener_path=listener_path, metadata=metadata, machine=platform.machine())
    # Nothing above touched ``spec``; apply all at once.
    spec["linux"] = {**linux, "seccomp": profile}
    spec["annotations"] = {**annotations, keys.GUARDED: owner.format()}


def listener_ready(listener_path: str, timeout: float = 0.5) -> bool:
    """True when something accepts connections on the unix socket ``listener_path``.

    The guard's fd holder treats a connection that closes without sending anything as such a
    probe. Never raises: any failure (missing file, not a socket, refused, timeout) is False.
    """
    try:
        if not stat.S_ISSOCK(os.stat(listener_path).st_mode):
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(listener_path)
    except (OSError, ValueError):
        return False
    return True


__all__ = [
    "GUARD_MATCH",
    "IOC_READ_WRITE",
    "NV_ESC_CHECK_VERSION_STR",
    "NV_IOCTL_MAGIC",
    "SECCOMP_ARCHES",
    "GuardRuleConflict",
    "GuardRuleError",
    "IoctlMatch",
    "apply_guard_rule",
    "compose_seccomp",
    "format_listener_metadata",
    "guarded_owner",
    "listener_ready",
    "nv_ioctl",
    "parse_listener_metadata",
]
