"""The lend rule for unguarded owners on the real guard (root): the agent's solver with the REAL
GuardService, attached to a real fd holder, and real runc owner containers: one started with
the guard's rule (its notify fd reaches the guard), one without (what spotgpu-runtime does when
it skips the rule). The Kubernetes API, pod-resources, GPUs and tasks are the agent's in-memory
fakes (tests/agent covers those paths). Without the rule the owner would be lent and its
return found only by polling; with it, only the covered owner is lent, and when its notify fd
goes away (the container's processes exit) the loan ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.agent.service import Agent
from spotgpu.core.allocations import AllocatedDevices
from spotgpu.core.clock import ManualClock
from spotgpu.core.config import AgentConfig
from spotgpu.core.configfile import Seconds
from spotgpu.core.ids import NVIDIA_GPU_RESOURCE, NodeName
from spotgpu.core.lending import LendState
from spotgpu.core.refs import ContainerRef
from spotgpu.ports.kube import ContainerInfo, PodInfo
from spotgpu.testing.fakes import FakeAttributor, FakeGpuBackend, FakeKube, FakePodResources, FakeTasks, fake_devices

from .conftest import OTHER, OWNER, Node

pytestmark = pytest.mark.root
NODE = NodeName("gpu-node")


def agent_for(node: Node, tmp_path: Path, owners: list[ContainerRef]) -> tuple[Agent, ManualClock, FakeKube]:
    devices = fake_devices(2 * len(owners))
    pods = [PodInfo(o.pod_ref, f"uid-{i}", NODE, "Running", containers=((ContainerInfo(o.name, f"cid-{i}")),))
            for i, o in enumerate(owners)]  # fmt: skip
    allocations = [
        AllocatedDevices(o.pod_ref, o.name, NVIDIA_GPU_RESOURCE, (devices[2 * i].id, devices[2 * i + 1].id))
        for i, o in enumerate(owners)
    ]
    clock, kube = ManualClock(start=1000.0), FakeKube(pods)
    holder: list[Agent] = []

    def owner_back(owner: ContainerRef) -> None:
        holder[0].on_owner_back(owner)

    guard = node.guard(owner_back)
    config = AgentConfig(
        node_name=NODE,
        max_inactive_time=Seconds(60),
        device_plugin_dir=tmp_path / "dp",
        metrics_address="127.0.0.1:0",
        debug_address="127.0.0.1:0",
    )
    agent = Agent(
        config,
        node=NODE,
        kube=kube,
        backend=FakeGpuBackend(devices),
        tasks=FakeTasks(),
        pod_resources=FakePodResources(allocations),
        guard=guard,
        clock=clock,
        metrics=AgentMetrics(),
        serve_device_plugin=False,
        attributor=FakeAttributor(),
    )
    holder.append(agent)
    return agent, clock, kube


def cycle(agent: Agent, clock: ManualClock, seconds: float) -> None:
    clock.advance(seconds)
    agent.detect_once()


def test_only_the_owner_whose_notify_fd_the_guard_holds_is_lent(node: Node, tmp_path: Path) -> None:
    node.holder()
    agent, clock, kube = agent_for(node, tmp_path, [OWNER, OTHER])
    guarded = node.container("guarded")  # with the guard's rule: its fd reaches the guard
    node.container("unguarded", owner=None)  # without it (the runtime skipped the rule)
    assert agent.guard is not None
    assert node._guards[0].wait_until(lambda g: len(g.fds()) == 1, 10)
    agent.start(serve_metrics=False, loops=False)
    cycle(agent, clock, 61)
    states = agent.solver.state().lend_states
    assert states[OWNER] is LendState.LENT and agent.guard.is_armed(OWNER)
    assert states[OTHER] is LendState.ACTIVE and not agent.guard.is_armed(OTHER)
    assert [(r, OTHER.format() in m) for _, r, m in kube.node_events] == [("OwnerUnguarded", True)]
    assert agent.metrics.sample("spotgpu_agent_not_lent_total", {"reason": "unguarded"}) == 1
    # the covered owner's container goes away: its notify fd closes, the guard no longer covers it
    guarded.send("exit")
    assert node._guards[0].wait_until(lambda g: not g.fds(), 10)
    cycle(agent, clock, 10)
    assert agent.solver.state().lend_states[OWNER] is LendState.ACTIVE
    assert not agent.guard.is_armed(OWNER)
    assert agent.metrics.sample("spotgpu_agent_not_lent_total", {"reason": "unguarded"}) == 2
    assert "its loan ends" in kube.node_events[-1][2]
    agent.stop()
