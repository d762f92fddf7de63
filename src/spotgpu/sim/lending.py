"""The node agent's lending, as the simulator runs it: the shared state machine per owner.

No I/O. One :class:`OwnerAgent` per simulated owner holds its
:class:`~spotgpu.core.lending.OwnerLending` and feeds it the events the agent would: detection
samples built by :func:`spotgpu.agent.detect.owner_samples` (as the agent builds them), the
guard's signal, the end of an eviction, and (for tests) an agent restart. Every decision is
:func:`spotgpu.core.lending.transition`'s, the function the agent's solver calls; the
simulation (:mod:`spotgpu.sim.simulation`) applies the returned actions to its model (a lend
makes the twins Healthy, an ``Evict`` schedules the kill) and asks :meth:`OwnerAgent.judge_at`
when the next poll that can change anything is due.

What the simulator does not model: the guard's coverage changing (an owner is covered exactly
when the policy has the guard: ``guard: false`` stands for owners the guard does not cover,
lent under ``unguardedPolicy: pollOnly``), arming failures, and measurement failures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from spotgpu.agent.detect import WatchedOwner, owner_samples
from spotgpu.core.config import LendingConfig, LendPolicyKind, PredictiveConfig, UnguardedPolicy
from spotgpu.core.ids import DeviceID
from spotgpu.core.lending import (
    Action,
    Actions,
    Event,
    EvictionDone,
    GuardSignal,
    LendRules,
    LendState,
    Recovered,
    Sample,
    idle_forecast,
    judge_at,
    new_owner,
    transition,
)
from spotgpu.core.refs import ContainerRef

_OWNER_PID: Final = 1
_SPOT_PID: Final = 2
_PIDS: Final = {_OWNER_PID: "owner", _SPOT_PID: "spot"}


def policy_rules(
    max_inactive_time: float, lend_policy: LendPolicyKind, predictive: PredictiveConfig, guard: bool
) -> LendRules:
    """The state machine's rules for a simulated policy (see module docstring for ``guard``)."""
    unguarded = UnguardedPolicy.REFUSE if guard else UnguardedPolicy.POLL_ONLY
    return LendRules(max_inactive_time, LendingConfig(lend_policy, unguarded, predictive))


class OwnerAgent:
    """The agent's lending state for one owner (see module docstring)."""

    __slots__ = ("covered", "log", "rules", "state")

    def __init__(
        self,
        owner: ContainerRef,
        devices: tuple[DeviceID, ...],
        rules: LendRules,
        now: float,
        *,
        covered: bool = True,
        log: list[Action] | None = None,
    ) -> None:
        self.rules = rules
        self.covered = covered
        self.state = new_owner(owner, devices, now)
        self.log = log
        """When a list, every action returned is appended (tests compare it with the agent's)."""

    @property
    def lend(self) -> LendState:
        return self.state.state

    def feed(self, event: Event, now: float) -> Actions:
        self.state, actions = transition(self.state, event, now, self.rules)
        if self.log is not None:
            self.log.extend(actions)
        return actions

    def poll(self, at: float, owner_active: bool, spot_running: Sequence[bool]) -> Actions:
        """One detection round at ``at``, measured the way the agent measures: the owner's
        process on its GPUs when it is active, a spot process on each GPU running spot work,
        utilization wherever a process runs."""
        pids: dict[DeviceID, list[int]] = {}
        util: dict[DeviceID, float | None] = {}
        for device, spot in zip(self.state.devices, spot_running, strict=True):
            on = ([_OWNER_PID] if owner_active else []) + ([_SPOT_PID] if spot else [])
            pids[device] = on
            util[device] = 100.0 if on else 0.0
        ref = self.state.owner
        sample = owner_samples(at, [WatchedOwner(ref, self.state.devices, "owner")], util, pids, _PIDS)[ref]
        return self.feed(Sample(sample, self.covered), at)

    def guard_signal(self, now: float) -> Actions:
        return self.feed(GuardSignal(), now)

    def eviction_done(self, now: float) -> Actions:
        return self.feed(EvictionDone(), now)

    def restart(self, now: float, *, spot_users: bool = False) -> Actions:
        """An agent restart: the state is rebuilt from what the lending record holds (the agent
        writes it after every change: lent or not, the learned history and backoff) and the
        recovery's evidence (the record, or spot users on the owner's GPUs)."""
        old = self.state
        lent = old.state is not LendState.ACTIVE or spot_users  # an eviction in flight is still recorded lent
        self.state = new_owner(old.owner, old.devices, now, old.history, old.backoff)
        return self.feed(Recovered(lent, self.covered, old.lent_at), now)

    def judge_at(self) -> float:
        """When the next poll can lend this owner, if it stays idle (``inf``: not by waiting)."""
        return judge_at(self.state, self.rules)

    def forecast(self, now: float) -> dict[DeviceID, tuple[int, int]]:
        """``{real device id: (expected, p20)}`` seconds of idle remainder while lent (else ``{}``):
        what the agent publishes in ``spotgpu.io/idle-forecast``, from the same function."""
        f = idle_forecast(self.state, now, self.rules)
        if f is None:
            return {}
        return dict.fromkeys(self.state.devices, (f.expected, f.p20))


__all__ = ["OwnerAgent", "policy_rules"]
