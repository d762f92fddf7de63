"""``spotgpu soak``: lend/return cycles with seeded random faults on the node harness, the node's
invariants checked after every cycle, until the duration is over or the first violation.

Decides what a cycle strikes (:func:`draw`, from a :class:`random.Random` of the seed alone: the
same seed gives the same schedule of kinds) and what counts as a violation (:class:`Invariants`).
Side effects: everything :class:`~spotgpu.e2e.run.Run` and the faults do; reads of ``/proc`` and
the run's cgroups; the agent's state file.

One cycle is one lend and one return: a plain cycle (:meth:`Run.cycle`) or a fault, each of
which lends, starts spot work and brings the owner back in its own way
(:data:`spotgpu.e2e.faults.FAULTS`, :data:`spotgpu.e2e.soakfaults.SOAK_FAULTS`). After each:

* the cycle's own checks (no owner error, no spot process alive or on the owner's GPUs when its
  call returned, twins Unhealthy, every spot pod deleted, MappingCache equal to the node);
* **no leaked container or process**: the run's pod cgroups hold only the owner pod's processes
  and the API only the owner pod;
* **the agent's state file** loads (the agent's own decoder) and agrees with the node: the
  owner, back on its GPUs, is not recorded as lent, and ``/debug/state`` says the same;
* **no zombies**: no process in state Z for over a second whose parent is the soak, the agent,
  the holder or containerd, or inside the run's cgroups;
* **resources flat**: agent and holder RSS, open fds and threads, per process instance (a
  restart starts a new one): the least of its latest :data:`WARMUP_SAMPLES` samples may exceed
  the most seen during its warm-up (its first :data:`WARMUP_SAMPLES` samples) by at most 10 %.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from spotgpu.adapters.agent_state import LendStateFile
from spotgpu.adapters.holderscan import cgroup_pids, hierarchy
from spotgpu.adapters.procattr import identity_of_path
from spotgpu.bench.agent import percentile
from spotgpu.e2e.faults import FAULTS
from spotgpu.e2e.node import OWNER
from spotgpu.e2e.run import FaultOutcome, Run
from spotgpu.e2e.soakfaults import SOAK_FAULTS, Fault

FAULT_RATE: Final = 0.4
"""Share of cycles that strike a fault (the rest are plain cycles)."""
WARMUP_SAMPLES: Final = 5
GROWTH: Final = 0.10
CLEAN_TIMEOUT_S: Final = 15.0
ZOMBIE_GRACE_S: Final = 1.0
RESOURCES: Final = ("rss_kb", "fds", "threads")

Say = Callable[[str], None]


def all_faults() -> dict[str, Fault]:
    """Every fault kind the soak draws from."""
    kinds = {name: _seedless(fn) for name, fn in FAULTS}
    return {**kinds, **SOAK_FAULTS}


def _seedless(fault: Callable[[Run], FaultOutcome]) -> Fault:
    def strike(run: Run, _rng: random.Random) -> FaultOutcome:
        return fault(run)

    return strike


def draw(rng: random.Random, kinds: list[str]) -> str | None:
    """The next cycle's fault (None: a plain cycle)."""
    return rng.choice(kinds) if rng.random() < FAULT_RATE else None


def parse_duration(text: str) -> float:
    """Seconds of ``90``, ``90s``, ``10m``, ``1h``, ``1.5h``."""
    text = text.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(text[-1:])
    value = float(text[:-1] if scale is not None else text) * (scale or 1.0)
    if value <= 0:
        raise ValueError(f"duration must be > 0: {text!r}")
    return value


def process_resources(pid: int) -> dict[str, int] | None:
    """RSS (kB), open fds and threads of ``pid``; None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_kb": int(fields["VmRSS"].split()[0]), "fds": fds, "threads": int(fields["Threads"])}


@dataclass(slots=True)
class Instance:
    """One agent or holder process's samples (a restart is a new instance)."""

    pid: int
    samples: list[dict[str, int]] = field(default_factory=list)

    def growth(self) -> str | None:
        """What grew beyond :data:`GROWTH` over the warm-up's peak (None: flat). The level is the
        least of the latest :data:`WARMUP_SAMPLES` samples: a leak raises it, a connection or a
        pidfd open for a moment at one sample does not."""
        if len(self.samples) < 2 * WARMUP_SAMPLES:
            return None
        for key in RESOURCES:
            peak = max(s[key] for s in self.samples[:WARMUP_SAMPLES])
            level = min(s[key] for s in self.samples[-WARMUP_SAMPLES:])
            if level > peak * (1 + GROWTH):
                return f"{key} {level} (least of the latest {WARMUP_SAMPLES}) > warm-up peak {peak} + {GROWTH:.0%}"
        return None


class Invariants:
    """The node's invariants after each cycle (module docstring); :meth:`check` returns the
    violations found (empty: all hold)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.node = run.node
        self.instances: dict[str, Instance] = {}
        self.first: dict[str, dict[str, int]] = {}
        self.last: dict[str, dict[str, int]] = {}

    def check(self) -> list[str]:
        violations = self._leaks()
        violations += self._state_file()
        violations += self._zombies()
        violations += self._resources()
        return violations

    def _foreign(self) -> list[str]:
        mount = hierarchy()
        found = []
        for folder, pids in cgroup_pids(mount / self.node.cgroup_root):
            identity = identity_of_path("/" + os.path.relpath(folder, mount))
            if identity.pod_uid != self.node.owner_uid:
                found.append(f"pids {pids} in {identity.path}")
        pods = [
            f"{p['metadata'].get('namespace')}/{p['metadata']['name']}"
            for p in self.node.api.objects("", "pods")
            if p["metadata"].get("uid") != self.node.owner_uid
        ]
        return found + [f"pod {p} in the API" for p in pods]

    def _leaks(self) -> list[str]:
        deadline = time.monotonic() + CLEAN_TIMEOUT_S
        while (left := self._foreign()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [f"leaked: {x}" for x in left]

    def _state_file(self) -> list[str]:
        path = self.node.paths.run / "agent-state.json"
        deadline = time.monotonic() + CLEAN_TIMEOUT_S
        while True:
            try:
                lent = [e.owner.format() for e in LendStateFile(path).load()] if path.exists() else []
            except Exception as exc:
                return [f"the agent's state file does not load: {type(exc).__name__}: {exc}"]
            state = self.node.agent_state() or {}
            said = state.get("owners", {}).get(OWNER.format())
            if OWNER.format() not in lent and said not in (None, "lent"):
                return []
            if time.monotonic() > deadline:
                return [f"state file lists {lent} lent, /debug/state says the owner is {said}; the owner is active"]
            time.sleep(0.1)

    def _parents(self) -> set[int]:
        pids = {os.getpid()}
        for child in (self.node.agent, self.node.holder):
            if child.pid is not None:
                pids.add(child.pid)
        daemon = self.node.containerd.pid
        if daemon is not None:
            pids.add(daemon)
        return pids

    def _zombie_pids(self) -> set[int]:
        parents = self._parents()
        inside = {p for _, pids in cgroup_pids(hierarchy() / self.node.cgroup_root) for p in pids}
        found = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if state == "Z" and (int(ppid) in parents or int(entry) in inside):
                found.add(int(entry))
        return found

    def _zombies(self) -> list[str]:
        first = self._zombie_pids()
        if not first:
            return []
        time.sleep(ZOMBIE_GRACE_S)
        still = first & self._zombie_pids()
        return [f"zombie process(es) {sorted(still)}"] if still else []

    def sample(self) -> None:
        for name, child in (("agent", self.node.agent), ("holder", self.node.holder)):
            pid = child.pid
            got = process_resources(pid) if pid is not None and child.running else None
            if pid is None or got is None:
                continue
            instance = self.instances.get(name)
            if instance is None or instance.pid != pid:
                instance = self.instances[name] = Instance(pid)
            instance.samples.append(got)
            self.first.setdefault(name, got)
            self.last[name] = got

    def _resources(self) -> list[str]:
        self.sample()
        return [f"{name} (pid {i.pid}) grew: {g}" for name, i in self.instances.items() if (g := i.growth())]


@dataclass(slots=True)
class SoakResult:
    cycles: int = 0
    faults: int = 0
    fault_kinds: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    holds_ms: list[float] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    longest_instance_samples: dict[str, int] = field(default_factory=dict)


def soak(run: Run, duration_s: float, seed: int, say: Say) -> tuple[SoakResult, Invariants]:
    """Cycles until ``duration_s`` is over or the first violation (module docstring)."""
    rng = random.Random(seed)
    faults = all_faults()
    kinds = sorted(faults)
    invariants = Invariants(run)
    invariants.sample()
    result = SoakResult()
    end = time.monotonic() + duration_s
    while time.monotonic() < end and not result.violations:
        kind = draw(rng, kinds)
        number = result.cycles
        outcome = _strike(run, number, kind, faults, rng)
        result.cycles += 1
        if kind is not None:
            result.faults += 1
            result.fault_kinds[kind] = result.fault_kinds.get(kind, 0) + 1
        if outcome.hold_ms is not None:
            result.holds_ms.append(outcome.hold_ms)
        violations = [] if outcome.passed else [f"{kind or 'cycle'}: {outcome.detail}"]
        violations += invariants.check()
        if violations:
            result.violations = [f"cycle {number}: {v}" for v in violations]
        say(f"cycle {number} {kind or 'plain'}: {'PASS' if not violations else 'VIOLATION'}: {outcome.detail}")
    for name, instance in invariants.instances.items():
        result.longest_instance_samples[name] = len(instance.samples)
    return result, invariants


def _strike(run: Run, number: int, kind: str | None, faults: dict[str, Fault], rng: random.Random) -> FaultOutcome:
    try:
        if kind is not None:
            return faults[kind](run, rng)
        record = run.cycle(number)
    except Exception as exc:
        _revive(run)
        return FaultOutcome(kind or "cycle", False, f"{type(exc).__name__}: {exc}")
    problems = [*record.leaked, *record.problems] + ([record.owner_error] if record.owner_error else [])
    detail = f"held {record.hold_ms:.1f} ms" + (f"; {'; '.join(problems)}" if problems else "")
    return FaultOutcome("cycle", not problems, detail, record.hold_ms)


def _revive(run: Run) -> None:
    """After a raised error: the agent and the owner's hold back, so the violation can be read."""
    try:
        if not run.node.agent.running:
            run.node.start_agent()
        if not run.owner_holding:
            run.owner_hold()
    except Exception as exc:
        run.say(f"could not revive the node: {exc}")


def summarize(result: SoakResult, invariants: Invariants, duration_s: float, seed: int) -> dict[str, Any]:
    holds = result.holds_ms

    def p(q: float) -> float | None:
        return round(percentile(holds, q), 2) if holds else None

    return {
        "duration_s": duration_s,
        "seed": seed,
        "cycles": result.cycles,
        "faults": result.faults,
        "fault_kinds": dict(sorted(result.fault_kinds.items())),
        "fault_kind_count": len(result.fault_kinds),
        "violations": result.violations,
        "hold_ms_p50": p(50),
        "hold_ms_p99": p(99),
        "hold_ms_max": round(max(holds), 2) if holds else None,
        "hold_ms_median": round(statistics.median(holds), 2) if holds else None,
        "resources": {"start": invariants.first, "end": invariants.last},
        "resource_samples_of_last_instance": result.longest_instance_samples,
    }


__all__ = [
    "FAULT_RATE",
    "Instance",
    "Invariants",
    "SoakResult",
    "all_faults",
    "draw",
    "parse_duration",
    "process_resources",
    "soak",
    "summarize",
]
