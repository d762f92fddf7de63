"""Can the return guard work on this node? Decided once at start, with reasons.

Needs: Linux >= 5.5 (``SECCOMP_USER_NOTIF_FLAG_CONTINUE``), runc >= 1.1 (``listenerPath``,
``SCMP_ACT_NOTIFY``) built with libseccomp >= 2.5 (API level 6). :func:`evaluate` is the pure
decision; :func:`probe` gathers its inputs: ``uname``, ``<runtime> --version``, and a self-test
that installs a notify filter on a short-lived thread of this process, catches one harmless
``ioctl`` on ``/dev/null`` and lets it continue. When the guard is not available the agent
falls back to polling detection only (``GuardPort.available`` is False) and the fd holder
does not open the listener socket, so spotgpu-runtime never injects the rule.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import select
import subprocess
import threading
from dataclasses import dataclass
from typing import Final

from spotgpu.guard import seccomp

MIN_KERNEL: Final = (5, 5)
MIN_RUNC: Final = (1, 1, 0)
MIN_LIBSECCOMP: Final = (2, 5, 0)
SELF_TEST_REQUEST: Final = 0x5350_4730  # "SPG0": no driver uses it; /dev/null answers ENOTTY


@dataclass(frozen=True, slots=True)
class GuardSupport:
    available: bool
    kernel: str
    runtime: str
    runtime_version: str | None
    libseccomp_version: str | None
    reasons: tuple[str, ...] = ()

    def summary(self) -> str:
        head = "available" if self.available else "NOT available"
        facts = (
            f"kernel {self.kernel}, {self.runtime or 'runtime unchecked'} {self.runtime_version or '?'}, "
            f"libseccomp {self.libseccomp_version or '?'}"
        )
        return f"return guard {head} ({facts})" + (f": {'; '.join(self.reasons)}" if self.reasons else "")


def parse_version(text: str) -> tuple[int, ...] | None:
    """Leading dotted number of ``text``: ``"1.1.5+ds1"`` -> (1, 1, 5); ``"6.18.44-fc"`` -> (6, 18, 44)."""
    match = re.match(r"\s*(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


def parse_runtime_version(output: str) -> tuple[str | None, str | None]:
    """(runc version, libseccomp version) from ``runc --version``."""
    runc = re.search(r"^runc version\s+(\S+)", output, re.MULTILINE)
    lib = re.search(r"^libseccomp:\s+(\S+)", output, re.MULTILINE)
    return (runc.group(1) if runc else None, lib.group(1) if lib else None)


def evaluate(
    kernel_release: str,
    runtime: str,
    runtime_output: str | None,
    self_test_error: str | None,
) -> GuardSupport:
    """The decision: every requirement met, or unavailable with one reason per failed one.

    ``runtime`` empty means the operator vouched for it (no runtime check); ``runtime_output``
    None means ``<runtime> --version`` could not be run.
    """
    reasons = []
    kernel = parse_version(kernel_release)
    if kernel is None or kernel[:2] < MIN_KERNEL:
        reasons.append(f"kernel {kernel_release} is older than {'.'.join(map(str, MIN_KERNEL))}")
    runc_version = lib_version = None
    if runtime:
        if runtime_output is None:
            reasons.append(f"cannot run {runtime!r} --version to check runc >= 1.1 and libseccomp >= 2.5")
        else:
            runc_version, lib_version = parse_runtime_version(runtime_output)
            runc = parse_version(runc_version or "")
            lib = parse_version(lib_version or "")
            if runc is None:
                reasons.append(f"{runtime!r} is not runc (no 'runc version' line); only runc >= 1.1 is supported")
            elif runc < MIN_RUNC:
                reasons.append(f"runc {runc_version} is older than 1.1 (no seccomp listener support)")
            if lib is None:
                reasons.append(f"{runtime!r} reports no libseccomp version")
            elif lib < MIN_LIBSECCOMP:
                reasons.append(f"libseccomp {lib_version} is older than 2.5 (no user notification)")
    if self_test_error:
        reasons.append(f"seccomp user notification self-test failed: {self_test_error}")
    return GuardSupport(
        available=not reasons,
        kernel=kernel_release,
        runtime=runtime,
        runtime_version=runc_version,
        libseccomp_version=lib_version,
        reasons=tuple(reasons),
    )


def self_test(timeout: float = 2.0) -> str | None:
    """Catch one ioctl of a helper thread with a notify filter and let it continue.

    Returns None on success, else what went wrong. The filter lives on the helper thread only
    and dies with it.
    """
    result: dict[str, object] = {}
    ready = threading.Event()

    def target() -> None:
        try:
            result["fd"] = seccomp.install_notify_filter([(0xFFFF_FFFF, SELF_TEST_REQUEST)])
        except OSError as exc:
            result["error"] = f"cannot install a notify filter: {exc}"
            ready.set()
            return
        ready.set()
        null = os.open("/dev/null", os.O_RDONLY)
        try:
            fcntl.ioctl(null, SELF_TEST_REQUEST, bytearray(8), True)
        except OSError as exc:
            result["errno"] = exc.errno
        else:
            result["errno"] = 0
        finally:
            os.close(null)

    thread = threading.Thread(target=target, name="guard-self-test", daemon=True)
    thread.start()
    ready.wait(timeout)
    if "error" in result:
        thread.join(timeout)
        return str(result["error"])
    listener = result.get("fd")
    if not isinstance(listener, int):
        return "the test thread did not install its filter"
    try:
        readable, _, _ = select.select([listener], [], [], timeout)
        if not readable:
            return f"no notification within {timeout}s"
        notification = seccomp.recv(listener)
        if notification is None or notification.request != SELF_TEST_REQUEST:
            return f"unexpected notification {notification!r}"
        if not seccomp.send_continue(listener, notification.id):
            return "CONTINUE was refused (kernel < 5.5?)"
    except OSError as exc:
        return str(exc)
    finally:
        os.close(listener)  # a still-blocked test ioctl now fails with ENOSYS and the thread ends
        thread.join(timeout)
    if result.get("errno") != errno.ENOTTY:
        return f"the continued ioctl ended with errno {result.get('errno')}, expected ENOTTY"
    return None


def probe(runtime: str = "runc", *, run_self_test: bool = True) -> GuardSupport:
    """Gather the facts for :func:`evaluate` on this machine."""
    output: str | None
    if runtime:
        try:
            proc = subprocess.run([runtime, "--version"], capture_output=True, text=True, timeout=10, check=False)
            output = proc.stdout if proc.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            output = None
    else:
        output = ""
    error = self_test() if run_self_test else None
    return evaluate(os.uname().release, runtime, output, error)


__all__ = [
    "MIN_KERNEL",
    "MIN_LIBSECCOMP",
    "MIN_RUNC",
    "GuardSupport",
    "evaluate",
    "parse_runtime_version",
    "parse_version",
    "probe",
    "self_test",
]
