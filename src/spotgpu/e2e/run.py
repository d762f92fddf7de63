"""The lend/return cycles and the faults of ``spotgpu node-e2e``, their checks and figures.

Decides nothing about lending (the agent does); decides what the run checks and how it counts.
Side effects: everything :class:`~spotgpu.e2e.node.Node` does, driven in order; reads of
``/proc`` for the leak checks; lines of progress through the ``say`` callable.

One cycle (:meth:`Run.cycle`):

1. the owner uses its GPUs (holds them open), then closes them: idle from then on. The agent
   lends them after ``maxInactiveTime``: ``lend_detect_s`` is the time from the owner closing
   its GPUs to every twin Healthy in the kubelet double's ``ListAndWatch`` list;
2. N spot pods start, each as the kubelet starts it (its sandbox, Allocate of one twin, the
   pod-resources grant, CreateContainer and StartContainer through CRI, spotgpu-runtime's device
   sync of the owner's GPU in the wrapper or the NRI plugin): ``spot_start_ms`` per container,
   from the pod's creation to its container started (``--ctr``: ``ctr run`` instead of the CRI
   calls); each must then hold its synced GPU open (proof that the sync happened);
3. the owner starts a GPU session at once (no waiting for the agent to notice the spot pods):
   the guard holds the call, the agent evicts, the call returns: ``return_hold_ms`` is the
   call's duration inside the owner container;
4. checks at release, as the owner sees it: the call's errno is the stand-in's ENOTTY
   (anything else, ENOSYS in particular, is an owner error, as is a hold beyond the fail-open
   bound); every process of every spot container had exited, as the kernel reports it, before
   the owner's call returned (the exit watcher, :mod:`spotgpu.testing.exitwatch`, pinned each
   one when it started and timestamps its exit on the owner's clock), and none has a GPU open
   when the harness looks (``/proc``): ``leaked_containers`` counts containers failing either.
   containerd's own record of the exit (its shim's, after it reaped the process and told
   containerd) is no part of the check: it may come after the release although the process was
   gone before it, and is reported as ``containerd_exit_after_release_ms``. The spot pods are
   deleted, the twins Unhealthy, and the agent's eviction record names every spot pod
   (``eviction_ms``: the agent's trigger-to-tasks-stopped time); afterwards the agent's
   MappingCache (``/debug/state``) equals what the node says (pod-resources, API).
"""

from __future__ import annotations

import errno
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from spotgpu.adapters.procattr import container_processes
from spotgpu.bench.agent import percentile
from spotgpu.core.ids import SPOT_GPU_RESOURCE
from spotgpu.e2e.node import CTL_PATH, OWNER, Node, NodeSettings, Spot, gpu_fds, gpu_id, gpu_path, twin_of
from spotgpu.testing.standin import CHECK_VERSION_STR

TARGETS: Final = {"return_hold_ms_p99": 100.0, "leaked_containers": 0, "owner_errors": 0}
"""The general bars (the CRI issue's); :func:`targets` gives the ones of one run."""
EXIT_WAIT_S: Final = 10.0
"""How long the release check waits for a spot process still running to exit (then: leaked)."""
HOLD_SLACK_S: Final = 1.0
"""Allowed beyond ``failOpenTimeout`` before a hold counts as unbounded (scheduling on a busy node)."""

Say = Callable[[str], None]


@dataclass(slots=True)
class CycleRecord:
    """What one lend/return cycle measured and found."""

    cycle: int
    lend_detect_s: float
    spot_start_ms: list[float]
    hold_ms: float
    eviction_ms: float | None = None
    released_ms: float | None = None
    release_check_ms: float | None = None
    """The agent's release check (scan of the pod cgroups' holders) within ``released_ms``."""
    eviction_complete_ms: float | None = None
    leaked: list[str] = field(default_factory=list)
    owner_error: str | None = None
    problems: list[str] = field(default_factory=list)
    exit_to_release_ms: float | None = None
    """The owner's call returned this long after the last spot process exited (kernel times)."""
    exits_ms: tuple[float, float] | None = None
    """The first and the last spot process exit, ms after the owner's call started."""
    guard_signal_ms: float | None = None
    """The owner's call started -> the agent's owner-back signal (seccomp notification, guard)."""
    guard_release_ms: float | None = None
    """The agent released the owner (guard disarmed) -> the owner's call returned."""
    containerd_lag_ms: list[float] = field(default_factory=list)
    """Per spot container: containerd's recorded exit minus the owner's release (informative)."""


@dataclass(slots=True)
class FaultOutcome:
    name: str
    passed: bool
    detail: str
    hold_ms: float | None = None

    def line(self) -> str:
        return f"fault {self.name}: {'PASS' if self.passed else 'FAIL'}: {self.detail}"


@dataclass(slots=True)
class Release:
    """The owner's returning GPU session, as the owner's client saw it."""

    reply: dict[str, Any]
    started: float
    """Host monotonic seconds when the harness sent the command."""

    @property
    def hold_ms(self) -> float:
        return (int(self.reply["end_ns"]) - int(self.reply["start_ns"])) / 1e6

    @property
    def start_s(self) -> float:
        return int(self.reply["start_ns"]) / 1e9

    @property
    def end_real_s(self) -> float:
        return int(self.reply["end_real_ns"]) / 1e9

    @property
    def end_ns(self) -> int:
        """When the owner's call returned (its CLOCK_MONOTONIC, the host's)."""
        return int(self.reply["end_ns"])


class Run:
    """Drives a started :class:`Node` through cycles and faults (see module docstring)."""

    def __init__(self, node: Node, say: Say) -> None:
        self.node = node
        self.settings: NodeSettings = node.settings
        self.say = say
        self.owner_holding = False
        self._spot_seq = 0

    # -- the owner --------------------------------------------------------------------------------
    @property
    def bound_s(self) -> float:
        return self.settings.fail_open_timeout + HOLD_SLACK_S

    def owner(self, command: str, timeout: float = 10.0) -> dict[str, Any]:
        assert self.node.owner is not None
        return self.node.owner.command(command, timeout)

    def owner_hold(self) -> None:
        devices = " ".join(gpu_path(i) for i in range(self.settings.gpus))
        reply = self.owner(f"hold {devices}")
        if reply.get("opened") != self.settings.gpus:
            raise RuntimeError(f"the owner could not open its GPUs: {reply}")
        self.owner_holding = True

    def owner_session(self) -> Release:
        """A new GPU session: the version-check ioctl the guard's rule matches."""
        started = time.monotonic()
        reply = self.owner(f"session {CTL_PATH} {CHECK_VERSION_STR:#x}", timeout=self.bound_s + 15)
        if "end_ns" not in reply:
            raise RuntimeError(f"the owner's session failed to run: {reply}")
        return Release(reply, started)

    def owner_error(self, release: Release) -> str | None:
        code = int(release.reply.get("errno", 0))
        if code == errno.ENOSYS:
            return "ENOSYS: the GPU call failed (no guard listener held its notify fd)"
        if code != errno.ENOTTY:
            name = errno.errorcode.get(code, "?")
            return f"the GPU call failed with errno {code} ({name}), not the stand-in's ENOTTY"
        if release.hold_ms > self.bound_s * 1000:
            return f"held {release.hold_ms:.0f} ms, beyond the fail-open bound {self.bound_s:.1f} s"
        return None

    # -- lending ----------------------------------------------------------------------------------
    def twins(self) -> list[str]:
        r = self.settings.replicas
        return [twin_of(g, k, r) for g in range(self.settings.gpus) for k in range(r)]

    def twins_are(self, health: str) -> Callable[[dict[str, Any]], bool]:
        wanted = self.twins()
        return lambda devices: all(devices.get(t) is not None and devices[t].health == health for t in wanted)

    def lend(self) -> float:
        """Owner active, then idle; returns the seconds from idle to every twin Healthy."""
        if not self.owner_holding:
            self.owner_hold()
        time.sleep(self.settings.detect_interval * 2.5)  # let the agent see the owner active
        reply = self.owner("release")
        self.owner_holding = False
        idle_at = int(reply["at_ns"]) / 1e9
        self.node.kubelet.wait_devices(
            SPOT_GPU_RESOURCE, self.twins_are("Healthy"), timeout=self.settings.max_inactive_time + 30
        )
        return time.monotonic() - idle_at

    def start_spots(self, count: int | None = None, first: int = 0, args: Sequence[str] | None = None) -> list[Spot]:
        """Start the spot pods and wait until each has its synced GPU open: its init by default;
        with ``args`` (a spot that forks, execs, keeps the device in a child) any of its processes."""
        spots = []
        for index in range(first, first + (self.settings.spot_containers if count is None else count)):
            self._spot_seq += 1
            spots.append(self.node.start_spot(f"spot-{self._spot_seq}", index, args=args))
        deadline = time.monotonic() + 15
        for spot in spots:
            while True:
                spot.pid = self.node.init_pid(spot.cid)
                if spot.pid is not None and gpu_fds(spot.pid, [gpu_path(spot.gpu)]):
                    break
                if spot.pid is not None and args is not None and self.gpu_holders([spot]):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"spot container {spot.ref} ({spot.cid[:12]}) never held its synced GPU {gpu_path(spot.gpu)} "
                        "open: the device sync did not happen"
                    )
                time.sleep(0.01)
        self.watch_exits(spots)
        return spots

    def watch_exits(self, spots: list[Spot]) -> None:
        """Pin every process of the spot containers in the exit watcher (their init and anything
        their cgroup shows)."""
        assert self.node.exits is not None
        found = container_processes([s.cid for s in spots])
        for spot in spots:
            assert spot.pid is not None
            pids = sorted({spot.pid, *found.get(spot.cid, [])})
            spot.watched = tuple(sorted(self.node.exits.watch(pids)))
            if spot.pid not in spot.watched:
                raise RuntimeError(f"spot container {spot.ref} ({spot.cid[:12]}): its init exited before the return")

    # -- checks -------------------------------------------------------------------------------------
    def gpu_holders(self, spots: list[Spot]) -> dict[str, str]:
        """Spot containers with a process holding a stand-in GPU open now (``/proc``), by ID."""
        paths = [gpu_path(i) for i in range(self.settings.gpus)]
        found = container_processes([s.cid for s in spots])
        leaked = {}
        for spot in spots:
            pids = [p for p in found.get(spot.cid, []) if gpu_fds(p, paths)]
            if pids:
                leaked[spot.cid] = f"{spot.ref} ({spot.cid[:12]}) pid(s) {pids} had a GPU open at release"
        return leaked

    def expected_mapping(self, spots: list[Spot]) -> dict[str, dict[str, list[str]]]:
        """What the node says: the owner's GPUs and the spot pods that pod-resources and the API
        both still have."""
        live = {(p.namespace, p.name) for p in self.node.pod_resources.pods()}
        users: dict[str, list[str]] = {gpu_id(i): [] for i in range(self.settings.gpus)}
        for spot in spots:
            if (spot.ref.namespace, spot.ref.name) in live:
                users[gpu_id(spot.gpu)].append(spot.ref.format())
        return {OWNER.format(): {d: sorted(u) for d, u in users.items()}}

    def cache_matches(self, spots: list[Spot], timeout: float) -> str | None:
        """None when the agent's MappingCache equals the node's view within ``timeout``."""
        expected = self.expected_mapping(spots)
        state = self.node.wait_state(lambda s: s.get("mapping") == expected, timeout)
        if state is not None:
            return None
        last = self.node.agent_state()
        return f"MappingCache {last.get('mapping') if last else 'unreadable'} != node {expected}"

    def eviction_record(self, release: Release, timeout: float = 10.0) -> dict[str, Any] | None:
        def found(state: dict[str, Any]) -> bool:
            return any(self._is_this_eviction(e, release) for e in state.get("evictions", []))

        state = self.node.wait_state(found, timeout)
        if state is None:
            return None
        entry: dict[str, Any] = next(e for e in state["evictions"] if self._is_this_eviction(e, release))
        return entry

    @staticmethod
    def _is_this_eviction(entry: dict[str, Any], release: Release) -> bool:
        return entry.get("owner") == OWNER.format() and float(entry.get("at", 0)) >= release.start_s - 0.05

    def late_exits(self, spots: list[Spot], release: Release) -> tuple[dict[str, str], list[int]]:
        """Spot containers a process of which exited after the owner's call returned, or not at
        all within :data:`EXIT_WAIT_S` (kernel exit times from the watcher), by ID; and the exit
        times (CLOCK_MONOTONIC ns) of all of them when every one exited, else nothing."""
        assert self.node.exits is not None
        exits = self.node.exits.exits([p for s in spots for p in s.watched], EXIT_WAIT_S)
        late: dict[str, str] = {}
        for spot in spots:
            alive = [p for p in spot.watched if exits[p] is None]
            after = {p: (t - release.end_ns) / 1e6 for p in spot.watched if (t := exits[p]) is not None}
            if alive:
                late[spot.cid] = f"{spot.ref} ({spot.cid[:12]}) pid(s) {alive} still running after the owner's release"
            elif any(ms > 0 for ms in after.values()):
                worst = max(after.values())
                late[spot.cid] = f"{spot.ref} ({spot.cid[:12]}) exited {worst:.2f} ms after the owner's call returned"
        times = [t for t in exits.values() if t is not None]
        return late, times if len(times) == len(exits) else []

    def release_checks(self, spots: list[Spot], release: Release) -> tuple[dict[str, str], list[str]]:
        """``(leaks by container ID, problems)`` right after the owner's call returned."""
        leaked = self.gpu_holders(spots)
        late, _ = self.late_exits(spots, release)
        leaked |= {cid: text for cid, text in late.items() if cid not in leaked}
        problems = []
        try:
            self.node.kubelet.wait_devices(SPOT_GPU_RESOURCE, self.twins_are("Unhealthy"), timeout=2)
        except TimeoutError:
            problems.append("twins not Unhealthy after the return")
        return leaked, problems

    def settle(self, spots: list[Spot], release: Release | None) -> tuple[list[float], list[str]]:
        """The kubelet's clean-up after the eviction: ``(containerd's recorded exit minus the
        owner's release, ms, per container that has one; problems)``."""
        lags: list[float] = []
        problems: list[str] = []
        for spot in spots:
            if self.node.api.get("", "pods", spot.ref.name, spot.ref.namespace or "") is not None:
                problems.append(f"spot pod {spot.ref} not deleted")
                self.node.api.remove("", "pods", spot.ref.name, spot.ref.namespace or "")
            self.node.forget_pod(spot.ref)
            exited = self.node.remove_container(spot.cid)
            if release is not None and exited is not None:
                lags.append((exited - release.end_real_s) * 1000)
        return lags, problems

    # -- one cycle ----------------------------------------------------------------------------------
    def cycle(self, number: int, spot_args: Sequence[str] | None = None) -> CycleRecord:
        """One lend/return cycle (module docstring); ``spot_args``: what the spot containers run."""
        lend_s = self.lend()
        spots = self.start_spots(args=spot_args)
        release = self.owner_session()
        leaked, problems = self.release_checks(spots, release)
        _, exits = self.late_exits(spots, release)
        self.owner_hold()
        record = CycleRecord(number, lend_s, [s.start_ms for s in spots], release.hold_ms)
        if exits:
            start = int(release.reply["start_ns"])
            record.exit_to_release_ms = (release.end_ns - max(exits)) / 1e6
            record.exits_ms = ((min(exits) - start) / 1e6, (max(exits) - start) / 1e6)
        record.owner_error = self.owner_error(release)
        eviction = self.eviction_record(release)
        if eviction is None:
            problems.append("the agent recorded no eviction for the return")
        else:
            record.eviction_ms = float(eviction["tasks_stopped_ms"])
            record.released_ms = float(eviction["released_ms"])
            record.eviction_complete_ms = float(eviction["complete_ms"])
            check = eviction.get("release_check") or {}
            record.release_check_ms = float(check["ms"]) if "ms" in check else None
            if check.get("remaining"):
                problems.append(f"the release check left condemned process(es) {check['remaining']}")
            signal_ns = float(eviction["at"]) * 1e9  # the agent's monotonic clock: the owner's too
            record.guard_signal_ms = (signal_ns - int(release.reply["start_ns"])) / 1e6
            record.guard_release_ms = (release.end_ns - signal_ns) / 1e6 - record.released_ms
            missing = {s.ref.format() for s in spots} - set(eviction.get("victims", []))
            if missing:
                problems.append(f"eviction missed spot pod(s) {sorted(missing)}")
            if eviction.get("failed_tasks"):
                problems.append(f"tasks not verified stopped: {eviction['failed_tasks']}")
        record.containerd_lag_ms, unsettled = self.settle(spots, release)
        problems += unsettled
        mismatch = self.cache_matches([], timeout=self.settings.detect_interval * 4 + 5)
        if mismatch:
            problems.append(mismatch)
        record.leaked = [leaked[cid] for cid in sorted(leaked)]
        record.problems = problems
        return record


def summarize(records: list[CycleRecord], settings: NodeSettings) -> dict[str, Any]:
    """The JSON figures of a run (see docs/node-e2e.md for what each means)."""
    holds = [r.hold_ms for r in records]
    evictions = [r.eviction_ms for r in records if r.eviction_ms is not None]
    completes = [r.eviction_complete_ms for r in records if r.eviction_complete_ms is not None]
    releases = [r.released_ms for r in records if r.released_ms is not None]
    checks = [r.release_check_ms for r in records if r.release_check_ms is not None]
    lends = [r.lend_detect_s for r in records]
    starts = [s for r in records for s in r.spot_start_ms]

    def p(values: list[float], q: float, digits: int = 2) -> float | None:
        return round(percentile(values, q), digits) if values else None

    margins = [r.exit_to_release_ms for r in records if r.exit_to_release_ms is not None]
    signals = [r.guard_signal_ms for r in records if r.guard_signal_ms is not None]
    guard_releases = [r.guard_release_ms for r in records if r.guard_release_ms is not None]
    firsts = [r.exits_ms[0] for r in records if r.exits_ms is not None]
    lasts = [r.exits_ms[1] for r in records if r.exits_ms is not None]
    lags = [lag for r in records for lag in r.containerd_lag_ms]
    leaked = sum(len(r.leaked) for r in records)
    owner_errors = sum(1 for r in records if r.owner_error)
    return {
        "cycles": len(records),
        "spot_containers": settings.spot_containers,
        "gpus": settings.gpus,
        "twin_replicas": settings.replicas,
        "return_hold_ms_p50": p(holds, 50),
        "return_hold_ms_p99": p(holds, 99),
        "return_hold_ms_max": round(max(holds), 2) if holds else None,
        "return_hold_ms_by_cycle": [round(h, 2) for h in holds],
        "eviction_ms_p50": p(evictions, 50),
        "eviction_ms_p99": p(evictions, 99),
        "released_ms_p50": p(releases, 50),
        "released_ms_p99": p(releases, 99),
        "release_check_ms_p50": p(checks, 50, 3),
        "release_check_ms_p99": p(checks, 99, 3),
        "eviction_complete_ms_p99": p(completes, 99),
        "lend_detect_s": round(statistics.median(lends), 3) if lends else None,
        "lend_detect_s_max": round(max(lends), 3) if lends else None,
        "spot_start_ms_p50": p(starts, 50),
        "spot_start_ms_p99": p(starts, 99),
        "guard_signal_ms_p50": p(signals, 50, 3),
        "guard_signal_ms_p99": p(signals, 99, 3),
        "guard_release_ms_p50": p(guard_releases, 50, 3),
        "guard_release_ms_p99": p(guard_releases, 99, 3),
        "first_spot_exit_ms_p50": p(firsts, 50),
        "last_spot_exit_ms_p50": p(lasts, 50),
        "last_spot_exit_ms_p99": p(lasts, 99),
        "last_spot_exit_ms_by_cycle": [round(x, 2) for x in lasts],
        "exit_to_release_ms_p50": p(margins, 50, 3),
        "exit_to_release_ms_min": round(min(margins), 3) if margins else None,
        "containerd_exit_after_release_ms_p50": p(lags, 50),
        "containerd_exit_after_release_ms_max": round(max(lags), 2) if lags else None,
        "leaked_containers": leaked,
        "owner_errors": owner_errors,
        "problems": [f"cycle {r.cycle}: {x}" for r in records for x in [*r.leaked, *r.problems]]
        + [f"cycle {r.cycle}: owner error: {r.owner_error}" for r in records if r.owner_error],
        "settings": {
            "detect_interval_s": settings.detect_interval,
            "max_inactive_time_s": settings.max_inactive_time,
            "fail_open_timeout_s": settings.fail_open_timeout,
        },
    }


def targets(settings: NodeSettings, background_load: int) -> dict[str, Any]:
    """The bars of one run. Issue 15's on the default node (through CRI, containerd 1.6,
    wrapper mode): ``return_hold_ms_p99`` <= 30 ms with 8 spot containers quiet, <= 50 ms under
    background load 2; with 32 spot containers under load 2 (any node) <= 100 ms; otherwise the
    CRI issue's general 100 ms. Always ``leaked_containers`` 0 and ``owner_errors`` 0."""
    hold, bar = TARGETS["return_hold_ms_p99"], "the CRI issue's general bar"
    default_node = (settings.launcher, settings.containerd, settings.mode) == ("cri", "1.6", "wrapper")
    if default_node and settings.spot_containers == 8 and background_load in (0, 2):
        hold = 30.0 if background_load == 0 else 50.0
        bar = f"issue 15: 8 spot containers, background load {background_load}, containerd 1.6 wrapper"
    elif settings.spot_containers == 32 and background_load == 2:
        bar = "issue 15: 32 spot containers under background load 2"
    return {**TARGETS, "return_hold_ms_p99": hold, "bar": bar}


def run_cycles(run: Run, count: int) -> list[CycleRecord]:
    records = []
    for number in range(count):
        record = run.cycle(number)
        records.append(record)
        flags = [*record.leaked, *record.problems] + ([record.owner_error] if record.owner_error else [])
        run.say(
            f"cycle {number}: lend {record.lend_detect_s:.2f} s, spot start p50 "
            f"{statistics.median(record.spot_start_ms):.0f} ms, return held {record.hold_ms:.1f} ms, "
            f"eviction {record.eviction_ms if record.eviction_ms is not None else '?'} ms"
            + (f"; PROBLEMS: {'; '.join(flags)}" if flags else "")
        )
    return records


class Background:
    """Runs one call on a thread (the owner's held session while a fault strikes)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the background call did not finish within {timeout:.0f}s")
        if self.error is not None:
            raise self.error
        return self.result


__all__ = [
    "TARGETS",
    "Background",
    "CycleRecord",
    "FaultOutcome",
    "Release",
    "Run",
    "run_cycles",
    "summarize",
    "targets",
]
