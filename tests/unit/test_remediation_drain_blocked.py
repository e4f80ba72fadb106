"""A drain that only PodDisruptionBudgets hold up: no escalation past its rung and no pod
forced out, however long it lasts; the episode says so once (issue 28, item 6)."""

from __future__ import annotations

import dataclasses

import pytest

from gpuguard.model import Action
from gpuguard.remediation.model import BreakerState, DecisionKind, Phase
from gpuguard.remediation.policy import Policy
from gpuguard.remediation.reconciler import Reconciler
from tests.unit.remediation_builders import T0, bad, fleet, node
from tests.unit.test_remediation_reconciler import Recorder


def _draining(policy: Policy) -> tuple[Reconciler, dict]:
    sick = fleet(node("n1", bad(Action.REBOOT, since=T0), pods_to_move=2))
    reconciler = Reconciler(policy)
    reconciler.load({}, [], BreakerState())
    now = T0
    while (
        reconciler.episodes.get("n1") is None
        or reconciler.episodes["n1"].phase is not Phase.DRAINING
    ):
        reconciler.reconcile(sick, now, Recorder())
        now += 1
    return reconciler, sick


@pytest.mark.parametrize("on_timeout", ["quarantine", "force"])
def test_a_drain_blocked_by_a_budget_holds_its_rung_and_forces_nothing(on_timeout):
    policy = Policy(tolerance_s=0, drain_timeout_s=900, on_drain_timeout=on_timeout)
    reconciler, sick = _draining(policy)
    blocked = {"n1": dataclasses.replace(sick["n1"], drain_blocked=True)}
    started = reconciler.episodes["n1"].phase_since
    kinds: list[DecisionKind] = []
    for hours in range(1, 25):  # a day of a budget that never allows
        recorder = Recorder()
        reconciler.reconcile(blocked, started + 3600 * hours, recorder)
        kinds += [d.kind for plan in recorder.plans for d in plan.decisions]
    episode = reconciler.episodes["n1"]
    assert (episode.phase, episode.rung) == (Phase.DRAINING, Action.REBOOT)
    assert DecisionKind.KILL_PODS not in kinds and DecisionKind.REQUEST_ACTION not in kinds
    assert DecisionKind.EVICT_PODS in kinds  # still asked, as the budget may allow
    said = [s for s in episode.steps if "PodDisruptionBudget" in s.message]
    assert len(said) == 1 and "no escalation" in said[0].message


def test_a_drain_that_fails_otherwise_still_times_out():
    policy = Policy(tolerance_s=0, drain_timeout_s=900)
    reconciler, sick = _draining(policy)
    started = reconciler.episodes["n1"].phase_since
    reconciler.reconcile(sick, started + 901, Recorder())
    assert any("timed out" in s.message for s in reconciler.episodes["n1"].steps)
