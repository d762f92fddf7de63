"""The idle forecast the agent publishes per lent twin (``spotgpu.io/idle-forecast``), written with
the state annotation in one patch, from the shared pure function."""

from __future__ import annotations

import json
from pathlib import Path

from spotgpu.core import keys
from spotgpu.core.ids import to_spot_id
from spotgpu.core.lending import idle_forecast

from .helpers import NODE, OWNER, Rig, make_rig


def forecast(rig: Rig) -> dict[str, dict[str, int]]:
    value: dict[str, dict[str, int]] = json.loads(rig.kube.node_annotations[NODE][keys.NODE_IDLE_FORECAST])
    return value


def test_only_lent_twins_carry_a_forecast_written_with_the_state(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.cycle(0)
    assert forecast(rig) == {}
    rig.cycle(61)
    got = forecast(rig)
    assert set(got) == {to_spot_id(rig.d[0]), to_spot_id(rig.d[1])}  # not the unallocated GPUs 2 and 3
    solver = rig.agent.solver
    expected = idle_forecast(solver.lending_states()[OWNER], rig.clock.monotonic(), solver.rules)
    assert expected is not None
    assert got[to_spot_id(rig.d[0])] == {"expected": expected.expected, "p20": expected.p20}
    assert 0 < expected.p20 <= expected.expected  # a new owner: the prior's exponential
    node, patch = rig.kube.patches[-1]
    assert node == NODE and set(patch) == {keys.NODE_SPOT_GPU_STATE, keys.NODE_IDLE_FORECAST}
    rig.guard.owner_back(OWNER)
    assert forecast(rig) == {}


def test_an_unchanged_forecast_is_not_patched_again(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.cycle(0)
    rig.cycle(61)
    patches = len(rig.kube.patches)
    rig.cycle(10)
    rig.cycle(10)
    assert len(rig.kube.patches) == patches  # values are floored to 20% steps: they change rarely
