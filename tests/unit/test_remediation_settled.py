"""``decide`` skips an episode held unchanged since the last call (``Plan.settled``).

A rack's held nodes would otherwise be advanced again on every pass anywhere in the fleet.
Each call here is checked against the same call without ``settled``: the skip may save
work, never change a plan.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

import gpuguard.remediation.reconciler as reconciler_module
from gpuguard.model import Action
from gpuguard.remediation.decide import decide
from gpuguard.remediation.lifecycle import PlanBuilder
from gpuguard.remediation.model import Plan
from gpuguard.remediation.policy import Policy
from tests.unit.remediation_builders import Sim, bad, node, ok

LINK_DOWN = bad(Action.REBOOT, codes=("IB_LINK_DOWN",), gpus=())
XID_79 = bad(Action.REBOOT, codes=("XID_79",))
RACK = [f"a{i}" for i in range(4)]


class Checked:
    """Every call of ``decide`` by the reconciler, compared with one without ``settled``;
    counts the episodes advanced."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.advanced = self.skipped = 0
        self.counting = True
        monkeypatch.setattr(reconciler_module, "decide", self.decide)
        advance = PlanBuilder.advance

        def counted(builder: PlanBuilder, *args: Any, **kwargs: Any) -> None:
            self.advanced += self.counting
            advance(builder, *args, **kwargs)

        monkeypatch.setattr(PlanBuilder, "advance", counted)

    def decide(self, *args: Any, settled: Any = None, **kwargs: Any) -> Plan:
        self.counting = False
        fresh = decide(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        self.counting = True
        plan = decide(*args, settled=settled, **kwargs)
        assert plan.decisions == fresh.decisions
        assert plan.notes == fresh.notes
        assert plan.episodes == fresh.episodes
        assert plan.breaker == fresh.breaker
        carried = settled or {}
        self.skipped += sum(1 for n, held in plan.settled.items() if held is carried.get(n))
        return plan


def rack_sim(policy: Policy | None = None) -> Sim:
    nodes = [dataclasses.replace(node(n), domain="rack-a") for n in RACK]
    nodes += [node(f"spare-{i}") for i in range(20)]
    sim = Sim({n.name: n for n in nodes}, policy or Policy())
    for name in RACK:
        sim.set_gpu(name, ok())  # the network layer is the one that fails
        layers = {**sim.nodes[name].layers, "network": dataclasses.replace(LINK_DOWN, since=0)}
        sim.set(name, layers=layers)
    return sim


def test_a_held_rack_is_skipped_until_something_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    checked = Checked(monkeypatch)
    sim = rack_sim()
    for _ in range(40):  # tolerance passes, the rack is held
        sim.step(60.0, heartbeat=False)
    assert all(sim.nodes[n].tainted for n in RACK)
    assert {"a0", "a1", "a2", "a3"} <= sim.plans[-1].settled.keys()
    advanced, skipped = checked.advanced, checked.skipped
    sim.step(60.0, heartbeat=False)
    assert checked.advanced == advanced and checked.skipped == skipped + len(RACK)

    sim.break_(["spare-0"], action=Action.REBOOT, codes=("XID_79",))  # elsewhere
    sim.step(60.0, heartbeat=False)
    assert checked.advanced == advanced + 1  # only the new episode

    sim.set_gpu("a1", XID_79)  # a fault of its own: a1 is advanced again, the others not
    sim.step(60.0, heartbeat=False)
    assert "a1" not in sim.plans[-1].settled
    for _ in range(5):
        sim.step(60.0, heartbeat=True)  # every observation new: all advanced, same plans
    sim.policy = Policy(tolerance_s=1)  # another policy: nothing carried over
    sim.step(60.0, heartbeat=False)
    before, after = sim.plans[-2].settled, sim.plans[-1].settled
    assert after and not any(held is before.get(name) for name, held in after.items())


def test_a_failed_write_forgets_what_was_settled() -> None:
    sim = rack_sim()
    for _ in range(40):
        sim.step(60.0, heartbeat=False)
    assert sim.reconciler._settled
    reconciler = sim.reconciler

    class Failing:
        def apply(self, plan: Plan, opened: object) -> set[str]:
            return {"a0"}

    reconciler.reconcile(sim.nodes, sim.now + 60, Failing())
    assert reconciler.stale and not reconciler._settled


def test_an_episode_waiting_out_its_tolerance_is_skipped_until_it_runs_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checked = Checked(monkeypatch)
    policy = Policy(tolerance_s=200)  # its other timers (the unknown grace) come later
    sim = Sim({n.name: n for n in [node(f"n{i}") for i in range(10)]}, policy)
    sim.break_(["n0"], action=Action.REBOOT, codes=("SOME_FAULT",))
    sim.step(30.0, heartbeat=False)  # opened and tainted
    sim.step(30.0, heartbeat=False)  # tainted now: nothing to do but wait
    assert sim.episodes["n0"].rung is None and sim.plans[-1].settled["n0"].note == ""
    advanced = checked.advanced
    for _ in range(5):  # 180 s after it opened: still within the tolerance
        sim.step(30.0, heartbeat=False)
    assert checked.advanced == advanced and sim.episodes["n0"].rung is None
    sim.step(30.0, heartbeat=False)  # its tolerance has run out: advanced, a rung starts
    assert checked.advanced == advanced + 1
    assert sim.episodes["n0"].rung is Action.REBOOT


def test_an_untouched_episode_is_advanced_again_when_its_node_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checked = Checked(monkeypatch)
    sim = Sim({n.name: n for n in [node(f"n{i}") for i in range(10)]}, Policy(tolerance_s=300))
    sim.break_(["n0"], action=Action.REBOOT, codes=("SOME_FAULT",))
    sim.step(30.0, heartbeat=False)
    sim.step(30.0, heartbeat=False)
    advanced = checked.advanced
    sim.step(30.0, heartbeat=True)  # a fresh report: a new observation
    assert checked.advanced == advanced + 1
    sim.heal(["n0"])
    sim.step(30.0, heartbeat=False)
    assert checked.advanced == advanced + 2
