"""Fixtures for the return guard's tests: the stand-in GPU client built into a busybox rootfs,
and a per-test "node" that starts holders, guards and runc owner containers and cleans up."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from spotgpu.core.config import GuardConfig
from spotgpu.core.configfile import Seconds
from spotgpu.core.refs import ContainerRef
from spotgpu.guard.service import GuardService
from spotgpu.guard.support import probe
from spotgpu.testing.containerd import make_rootfs
from spotgpu.testing.standin import build_probe

from .harness import GuardProcess, HolderProcess, OwnerContainer

OWNER = ContainerRef("team-a", "dev-0", "main")
OTHER = ContainerRef("team-b", "dev-1", "main")


@pytest.fixture(scope="session")
def probe_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc (with static libc) is needed to build the stand-in GPU client")
    return build_probe(tmp_path_factory.mktemp("guardprobe"))


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory: pytest.TempPathFactory, probe_binary: Path) -> Path:
    return make_rootfs(tmp_path_factory.mktemp("rootfs"), [(probe_binary, "/bin/guardprobe")])


class OwnerBacks:
    """Records the guard's owner-back signals (thread-safe) with their arrival time."""

    def __init__(self) -> None:
        self.items: list[tuple[ContainerRef, int]] = []
        self._cond = threading.Condition()

    def __call__(self, owner: ContainerRef) -> None:
        with self._cond:
            self.items.append((owner, time.monotonic_ns()))
            self._cond.notify_all()

    def wait(self, count: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.items) >= count, timeout)


class Node:
    """One test's guard node: sockets under a short private directory, everything torn down."""

    def __init__(self, base: Path, rootfs: Path) -> None:
        self.base = base
        self.rootfs = rootfs
        self.listener = base / "guard.sock"
        self.control = base / "holder.sock"
        self._holders: list[HolderProcess] = []
        self._guard_procs: list[GuardProcess] = []
        self._guards: list[GuardService] = []
        self._containers: list[OwnerContainer] = []

    def holder(self, guard_timeout: float = 1.0, handover_timeout: float = 30.0, inherit: bool = True) -> HolderProcess:
        holder = HolderProcess(
            self.listener,
            self.control,
            guard_timeout=guard_timeout,
            handover_timeout=handover_timeout,
            inherit=inherit,
            log=self.base / f"holder{len(self._holders)}.log",
        )
        self._holders.append(holder)
        return holder.start()

    def guard_process(self, *, fail_open: float = 5.0, holder_timeout: float = 1.0) -> GuardProcess:
        proc = GuardProcess(
            self.listener,
            self.control,
            fail_open=fail_open,
            holder_timeout=holder_timeout,
            log=self.base / f"guard{len(self._guard_procs)}.log",
        )
        self._guard_procs.append(proc)
        return proc.start()

    def guard(
        self,
        on_owner_back: Callable[[ContainerRef], None] | None = None,
        *,
        fail_open: float = 5.0,
        holder_timeout: float = 1.0,
        wait_attached: bool = True,
        realtime: bool = False,
        boost_cpu: bool = False,
    ) -> GuardService:
        config = GuardConfig(
            listener_path=self.listener,
            holder_path=self.control,
            fail_open_timeout=Seconds(fail_open),
            holder_timeout=Seconds(holder_timeout),
        )
        guard = GuardService(
            config,
            on_owner_back or (lambda _o: None),
            registry=CollectorRegistry(),
            support=probe("runc"),
            realtime=realtime,
            boost_cpu=boost_cpu,
        )
        self._guards.append(guard)
        guard.start()
        if wait_attached:
            assert guard.wait_until(lambda g: g.attached, 10), "guard did not attach to the holder"
        return guard

    def container(self, name: str, owner: ContainerRef | None = OWNER, **kwargs: object) -> OwnerContainer:
        container = OwnerContainer(
            self.base, self.rootfs, name, listener=self.listener if owner else None, owner=owner, **kwargs
        )  # type: ignore[arg-type]
        self._containers.append(container)
        return container.start()

    def guarded_owner(
        self, name: str, on_owner_back: Callable[[ContainerRef], None] | None = None, **guard_args: float
    ) -> tuple[GuardService, OwnerContainer]:
        """Holder, in-process guard and one owner container whose notify fd the guard holds."""
        self.holder()
        guard = self.guard(on_owner_back, **guard_args)  # type: ignore[arg-type]
        owner = self.container(name)
        assert guard.wait_until(lambda g: len(g.fds()) == 1, 10), "the owner's notify fd never reached the guard"
        return guard, owner

    def process_guarded_owner(
        self, name: str, *, holder_timeout: float = 1.0, handover_timeout: float = 30.0
    ) -> tuple[HolderProcess, GuardProcess, OwnerContainer]:
        """Holder process, guard process (so a test can kill either) and one owner container
        whose notify fd the guard holds."""
        holder = self.holder(guard_timeout=holder_timeout, handover_timeout=handover_timeout)
        guard = self.guard_process(holder_timeout=holder_timeout)
        owner = self.container(name)
        assert guard.command("wait-fds 1")["ok"], "the owner's notify fd never reached the guard"
        return holder, guard, owner

    def logs(self) -> str:
        parts = [f"--- holder {i}\n{h.log()}" for i, h in enumerate(self._holders)]
        parts += [f"--- guard process {i}\n{g.log()}" for i, g in enumerate(self._guard_procs)]
        return "\n".join(parts)

    def close(self) -> None:
        for container in self._containers:
            container.close()
        for guard in self._guards:
            guard.stop()
        for proc in self._guard_procs:
            proc.kill()
        for holder in self._holders:
            holder.kill()


@pytest.fixture
def node(rootfs: Path, request: pytest.FixtureRequest) -> Iterator[Node]:
    base = Path(tempfile.mkdtemp(prefix="sg6-", dir="/tmp"))
    n = Node(base, rootfs)
    try:
        yield n
    finally:
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(n.logs())
        n.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report
