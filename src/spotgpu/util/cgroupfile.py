"""The text of ``/proc/<pid>/cgroup``, parsed (pure; no side effects).

Shared by process attribution (:mod:`spotgpu.adapters.procattr`) and the CPU-weight raise of
a return (:mod:`spotgpu.util.cpuboost`).
"""

from __future__ import annotations


def cgroup_lines(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` as ``{controller: path}``; the v2 line's controller is ``""``.

    A v1 line naming several controllers (``4:cpu,cpuacct:/x``) appears once per controller.
    Malformed lines are skipped (the kernel never writes them; a truncated read might).
    """
    result: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        _, controllers, path = parts
        if not controllers:
            result.setdefault("", path)
            continue
        for controller in controllers.split(","):
            result.setdefault(controller, path)
    return result


__all__ = ["cgroup_lines"]
