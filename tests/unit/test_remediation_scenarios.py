"""Whole episodes over simulated time: Xid 79, a transient fault, a storm."""

from __future__ import annotations

from collections import Counter

from gpuguard.model import Action
from gpuguard.remediation.budget import holds_slot
from gpuguard.remediation.model import Phase, Resolution
from gpuguard.remediation.policy import Policy
from tests.unit.remediation_builders import (
    DISRUPTIVE,
    GPU0,
    K,
    Sim,
    bad,
    fleet,
    kinds,
    node,
)


def _actions(sim: Sim, name: str) -> list[K]:
    return [d.kind for plan in sim.plans for d in plan.decisions if d.node == name]


def test_xid_79_reboots_at_once_then_verifies_and_returns_the_node():
    sim = Sim(fleet(node("n1"), node("n2")))
    sim.set_gpu("n1", bad(Action.REBOOT, ("XID_79",), (GPU0,)))
    sim.set("n1", pods_to_move=2)
    plan = sim.step()
    assert kinds(plan) == [K.RECORD, K.TAINT, K.RECORD, K.CORDON, K.EVICT_PODS]
    assert sim.episodes["n1"].phase is Phase.DRAINING

    assert kinds(sim.step()) == [K.EVICT_PODS]  # still draining
    sim.set("n1", pods_to_move=0)
    plan = sim.step()
    assert kinds(plan) == [K.RECORD, K.REQUEST_ACTION]
    request = plan.decisions[1]
    assert (request.action, request.attempt) == (Action.REBOOT, 1)

    assert kinds(sim.step()) == [K.REQUEST_ACTION]  # re-sent until answered
    sim.answer("n1", succeeded=True)
    sim.heal(["n1"])
    assert kinds(sim.step()) == [K.RECORD]  # verifying
    assert sim.episodes["n1"].phase is Phase.VERIFYING
    plan = sim.step()  # healthy for clear_after_s, and a report newer than the reboot
    assert kinds(plan) == [K.RECORD, K.UNTAINT, K.UNCORDON]
    assert sim.history[-1].resolution is Resolution.REPAIRED
    assert not sim.nodes["n1"].tainted and not sim.nodes["n1"].unschedulable
    assert _actions(sim, "n2") == []


def test_transient_fault_is_only_tainted_and_untainted():
    sim = Sim(fleet(node("n1")))
    sim.set_gpu("n1", bad(Action.REBOOT, ("XID_74",)))  # default tolerance 120 s
    sim.step()
    sim.step()
    sim.heal(["n1"])
    for _ in range(4):
        sim.step()
    assert [k for k in _actions(sim, "n1") if k is not K.RECORD] == [K.TAINT, K.UNTAINT]
    assert sim.history[-1].resolution is Resolution.TRANSIENT
    assert not sim.episodes


def _storm_fleet() -> Sim:
    pools = ("pool-a", "pool-b")
    return Sim(fleet(*(node(f"n{i:02}", pool=pools[i % 2]) for i in range(50))))


def test_storm_taints_everything_opens_the_breaker_and_closes_when_it_passes():
    sim = _storm_fleet()
    sick = [f"n{i:02}" for i in range(20)]  # 40 % of the fleet at once
    sim.break_(sick)
    plan = sim.step()
    assert sorted(d.node for d in plan.decisions if d.kind is K.TAINT) == sick
    assert plan.breaker.open
    assert not DISRUPTIVE & set(kinds(plan))
    assert any("circuit breaker opened" in note for note in plan.notes)

    sim.heal(sick)
    for _ in range(25):  # 12.5 min: the nodes recover, the wave leaves the window
        plan = sim.step()
        assert not DISRUPTIVE & set(kinds(plan))
    assert not sim.breaker.open
    assert not sim.episodes
    assert {e.resolution for e in sim.history} == {Resolution.TRANSIENT}
    assert any("circuit breaker closed" in n for p in sim.plans for n in p.notes)
    assert not any(n.tainted for n in sim.nodes.values())


def test_storm_that_persists_is_repaired_within_the_budget_after_the_breaker():
    sim = _storm_fleet()
    sick = [f"n{i:02}" for i in range(20)]
    sim.break_(sick)
    for _ in range(120):  # an hour
        plan = sim.step()
        if plan.breaker.open:
            assert not DISRUPTIVE & set(kinds(plan))
        busy = Counter(sim.nodes[n].pool for n, e in sim.episodes.items() if holds_slot(e))
        assert max(busy.values(), default=0) <= Policy().budget.allowed(25) == 2
        for name, episode in list(sim.episodes.items()):
            if episode.phase is Phase.ACTING:  # the agent reboots; the node comes back
                sim.answer(name, succeeded=True)
                sim.heal([name])
    assert any(d.kind is K.REQUEST_ACTION for p in sim.plans for d in p.decisions)
    repaired = [e for e in sim.history if e.resolution is Resolution.REPAIRED]
    assert len(repaired) == 20


def test_storm_with_the_breaker_off_drains_at_most_the_budget_per_pool():
    sim = _storm_fleet()
    sim.policy = Policy(breaker={"threshold_percent": 100})
    sim.break_([f"n{i:02}" for i in range(20)])
    plan = sim.step()
    drained = Counter(sim.nodes[d.node].pool for d in plan.decisions if d.kind is K.EVICT_PODS)
    assert drained == {"pool-a": 2, "pool-b": 2}
    assert sum("budget" in n for n in plan.notes) == 16
