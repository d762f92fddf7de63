"""The simulator applies each cycle's decisions as the model-level applier says, and its trimming
reads nodes through the scheduler's own GPU rules.

After every cycle of a run (lending, a returning owner, reserved preemption, ShadowPods), the
simulated model is compared with :class:`spotgpu.scheduler.apply.ModelApplier` applied to the
cycle's snapshot (evicted pods still terminating: ``evicted="evicting"``): pods' nodes, devices,
eviction state and nominations, ShadowPods' devices and deletion, GPUs' owners.
"""

from __future__ import annotations

from typing import Any

from spotgpu.core.types import NodeStrategy
from spotgpu.scheduler.apply import ModelApplier
from spotgpu.scheduler.decisions import CycleResult
from spotgpu.scheduler.model import Snapshot
from spotgpu.sim.scenario import build_workload, parse_scenario
from spotgpu.sim.simulation import Simulation


def _scenario(strategy: str) -> Any:
    return parse_scenario(
        {
            "name": "apply",
            "duration": "4h",
            "cluster": {"nodes": 3, "gpusPerNode": 4},
            "owners": [
                {
                    "name": "dev",
                    "source": "inline",
                    "nodes": 2,
                    "gpusPerOwner": 4,
                    "inline": {
                        "owners": [
                            {"active": [{"start": "0s", "end": "30m"}, {"start": "2h", "end": "3h"}]},
                            {"active": [{"start": "3h", "end": "4h"}]},
                        ]
                    },
                }
            ],
            "spotJobs": [
                {
                    "name": "s",
                    "source": "inline",
                    "inline": {
                        "jobs": [{"arrival": f"{i * 7}m", "duration": "50m", "gpus": 1 + i % 3} for i in range(20)]
                    },
                }
            ],
            "reservedJobs": [
                {
                    "name": "r",
                    "source": "inline",
                    "inline": {"jobs": [{"arrival": "1h", "duration": "1h", "gpus": 4}]},
                }
            ],
            "policies": [{"name": "p", "maxInactiveTime": "5m", "strategy": strategy}],
        }
    )


def _model_of(sim: Simulation, snapshot: Snapshot) -> dict[str, Any]:
    pods = {}
    for p in snapshot.pods:
        live = sim.pods.get(p.ref)
        if live is not None:
            node = live.node.name if live.node is not None else None
            pods[p.ref] = (node, live.devices, live.evicting, live.nominated)
    names = {x.name for x in snapshot.nodes}
    shadows = {
        ref: (sh.node.name, tuple(g.id for g in sh.gpus), sh.deleting)
        for ref, sh in sim.shadows.items()
        if sh.node.name in names
    }
    owners = {g.id: g.owner for n in sim.nodes for g in n.gpus if n.name in names}
    return {"pods": pods, "shadows": shadows, "owners": owners}


def _expected(snapshot: Snapshot, result: CycleResult, now: float) -> dict[str, Any]:
    after = ModelApplier(snapshot, now, evicted="evicting").apply(result).snapshot()
    return {
        "pods": {p.ref: (p.node, p.devices, p.evicting, p.nominated) for p in after.pods},
        "shadows": {s.ref: (s.node, s.devices, s.deleting) for s in after.shadows},
        "owners": {g.id: g.owner for n in after.nodes for g in n.gpus},
    }


def test_the_simulator_applies_decisions_as_the_model_applier_does() -> None:
    for strategy in ("lowpower", "auto"):
        s = _scenario(strategy)
        assert s.policies[0].strategy is NodeStrategy(strategy)  # auto is selectable in a policy
        sim = Simulation(s, build_workload(s), s.policies[0])
        original = sim._apply
        checked: list[CycleResult] = []

        def apply(
            result: CycleResult,
            snapshot: Snapshot,
            sim: Simulation = sim,
            original: Any = original,
            checked: list[CycleResult] = checked,
        ) -> None:
            original(result, snapshot)
            if any(True for _ in result.decisions()):
                got = _model_of(sim, snapshot)
                want = _expected(snapshot, result, sim.engine.now)
                # whole gangs are evicted: the model's evicted pods are the scheduler's
                want["pods"] = {r: v for r, v in want["pods"].items() if r in got["pods"]}
                assert got == want
                checked.append(result)

        sim._apply = apply  # type: ignore[method-assign]
        sim.run()
        kinds = {type(d).__name__ for r in checked for d in r.decisions()}
        assert {"Bind", "CreateShadowPod", "PodGroupStatus", "Evict", "Nominate", "DeleteShadowPod"} <= kinds, kinds
        assert len(checked) > 5
