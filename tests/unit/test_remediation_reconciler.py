"""The reconciler: the memory around decide(), and when it must look again."""

from __future__ import annotations

import math
from collections.abc import Collection

from gpuguard.contract.report import LayerReport
from gpuguard.model import Action
from gpuguard.remediation.model import ActionResult, BreakerState, DecisionKind, Phase, Plan
from gpuguard.remediation.policy import Policy
from gpuguard.remediation.reconciler import Reconciler, needs_attention
from tests.unit.remediation_builders import T0, bad, fleet, node, ok

POLICY = Policy(tolerance_s=120, clear_after_s=300, drain_timeout_s=600, unknown_grace_s=90)
LINGERING = ("TEST_FAULT",)  # a code with no tolerance of its own: it gets tolerance_s


class Recorder:
    def __init__(self, failing: Collection[str] = ()) -> None:
        self.plans: list[Plan] = []
        self.failing = set(failing)

    def apply(self, plan: Plan, opened: Collection[str]) -> set[str]:
        self.plans.append(plan)
        return {d.node for d in plan.decisions} & self.failing


def started(policy: Policy = POLICY) -> Reconciler:
    reconciler = Reconciler(policy)
    reconciler.load({}, [], BreakerState())
    return reconciler


def test_the_deadline_is_the_tolerance_of_a_fresh_fault_then_the_drain_timeout():
    reconciler = started()
    nodes = fleet(node("n1", bad(codes=LINGERING, since=T0)), node("n2"))
    for name, observed in nodes.items():
        reconciler.track(name, observed)
    assert reconciler.wanted() == {"n1"}  # the healthy node needs no decision
    first = reconciler.reconcile({"n1": nodes["n1"]}, T0, Recorder())
    assert first.opened == {"n1"} and reconciler.episodes["n1"].phase is Phase.QUARANTINED
    # With nothing new observed, passes at the deadlines alone reach the drain the
    # moment the tolerance runs out, and never skip past it.
    done, passes = first, 1
    while reconciler.episodes["n1"].phase is Phase.QUARANTINED:
        assert done.deadline <= T0 + POLICY.tolerance_s
        done = reconciler.reconcile({"n1": nodes["n1"]}, done.deadline, Recorder())
        passes += 1
    episode = reconciler.episodes["n1"]
    assert episode.phase is Phase.DRAINING and episode.phase_since == T0 + POLICY.tolerance_s
    assert passes <= 3
    assert done.deadline <= episode.phase_since + POLICY.drain_timeout_s + 1e-3


def test_a_healthy_fleet_has_no_deadline():
    reconciler = started()
    healthy = fleet(node("n1", ok(since=T0 - 10_000)))
    reconciler.track("n1", healthy["n1"])
    assert not reconciler.wanted()
    assert reconciler.reconcile({}, T0, Recorder()).deadline == math.inf


def test_a_failed_write_makes_the_episodes_stale_and_keeps_none_of_the_plan():
    reconciler = started()
    sick = fleet(node("n1", bad(since=T0)))
    done = reconciler.reconcile(sick, T0, Recorder(failing={"n1"}))
    assert done.failed == {"n1"} and reconciler.stale and not reconciler.episodes


def test_an_answer_is_folded_into_its_own_episode_only():
    reconciler = started(Policy(tolerance_s=0, min_action_interval_s=0))
    sick = fleet(node("n1", bad(Action.REBOOT, since=T0), pods_to_move=0))
    reconciler.reconcile(sick, T0, Recorder())
    for step in range(1, 4):  # quarantined -> draining -> acting
        reconciler.reconcile(sick, T0 + step, Recorder())
    episode = reconciler.episodes["n1"]
    assert episode.phase is Phase.ACTING and episode.rung is Action.REBOOT
    answer = ActionResult(episode.attempt, Action.REBOOT, True, T0 + 10)
    reconciler.take_result("n1", episode.opened_at - 1, answer)  # an older episode's
    reconciler.reconcile(sick, T0 + 11, Recorder())
    assert reconciler.episodes["n1"].phase is Phase.ACTING
    reconciler.take_result("n1", episode.opened_at, answer)
    plan = Recorder()
    reconciler.reconcile(sick, T0 + 12, plan)
    assert reconciler.episodes["n1"].phase is Phase.VERIFYING
    assert any(d.kind is DecisionKind.RECORD for d in plan.plans[0].decisions)


def test_attention_follows_the_projection():
    reconciler = started()
    reconciler.track("n1", node("n1", tainted=True))
    assert needs_attention(node("n1", tainted=True)) and reconciler.wanted() == {"n1"}
    reconciler.track("n1", node("n1"))
    assert not reconciler.wanted() and reconciler.population["pool-a"] == 1
    reconciler.track("n1", None)
    assert reconciler.population["pool-a"] == 0
    unknown = LayerReport("Unknown", "NoReport", T0)
    assert needs_attention(node("n2", unknown))
