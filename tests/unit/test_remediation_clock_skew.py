"""Clocks of controller replicas: a standby that takes over reads phase stamps written on
another replica's clock. Its deadlines run from when it first saw each phase, so a clock
an hour ahead neither escalates a repair under way nor forces a drain, and one an hour
behind waits one timeout, not an hour more (issue 28, chaos round 2, defect 1)."""

from __future__ import annotations

import pytest

from gpuguard.model import Action
from gpuguard.remediation.model import BreakerState, DecisionKind, Episode, Phase
from gpuguard.remediation.policy import Policy
from gpuguard.remediation.reconciler import Reconciler
from tests.unit.remediation_builders import T0, bad, fleet, node
from tests.unit.test_remediation_reconciler import Recorder

HOUR = 3600.0
POLICY = Policy(tolerance_s=0, drain_timeout_s=900, action_timeout_s=600, min_action_interval_s=60)


def _leader_until(phase: Phase, pods_to_move: int) -> tuple[dict, Episode, float]:
    """The first leader's passes, on its own clock, until the episode reaches ``phase``."""
    sick = fleet(node("n1", bad(Action.REBOOT, since=T0), pods_to_move=pods_to_move))
    leader = Reconciler(POLICY)
    leader.load({}, [], BreakerState())
    now = T0
    while leader.episodes.get("n1") is None or leader.episodes["n1"].phase is not phase:
        leader.reconcile(sick, now, Recorder())
        now += 1
        assert now < T0 + 100, "the leader never got there"
    return sick, leader.episodes["n1"], now


def _standby(episode: Episode) -> Reconciler:
    standby = Reconciler(POLICY)
    standby.load({"n1": episode}, [], BreakerState())
    return standby


def _kinds(standby: Reconciler, sick: dict, at: float) -> list[DecisionKind]:
    recorder = Recorder()
    standby.reconcile(sick, at, recorder)
    return [d.kind for plan in recorder.plans for d in plan.decisions]


@pytest.mark.parametrize("skew", [HOUR, -HOUR, 0.0])
def test_a_standby_taking_over_mid_reboot_waits_a_whole_action_timeout(skew):
    sick, episode, left_at = _leader_until(Phase.ACTING, pods_to_move=0)
    assert episode.rung is Action.REBOOT
    standby = _standby(episode)
    takeover = left_at + 17 + skew  # the standby's clock, 17 s after the leader stopped
    for at in (takeover, takeover + POLICY.action_timeout_s - 1):  # a timeout less a second
        assert DecisionKind.REPLACE not in _kinds(standby, sick, at)
        assert standby.episodes["n1"].rung is Action.REBOOT and not _timed_out(standby)
    # Past it, whichever way the clock is skewed, it times out.
    later = takeover + POLICY.action_timeout_s + 2
    _kinds(standby, sick, later)
    assert _timed_out(standby) and standby.episodes["n1"].rung is Action.REPLACE


def _timed_out(reconciler: Reconciler) -> bool:
    episode = reconciler.episodes.get("n1")
    gave_up = ("timed out", "not done within")  # the drain's words, the action's
    return episode is not None and any(w in s.message for s in episode.steps for w in gave_up)


@pytest.mark.parametrize("skew", [HOUR, -HOUR])
def test_a_standby_taking_over_mid_drain_forces_no_drain_before_the_timeout(skew):
    sick, episode, left_at = _leader_until(Phase.DRAINING, pods_to_move=3)
    standby = _standby(episode)
    takeover = left_at + skew
    for at in (takeover, takeover + 0.03, takeover + POLICY.drain_timeout_s - 1):
        _kinds(standby, sick, at)
        assert standby.episodes["n1"].phase is Phase.DRAINING, at - takeover
        assert not _timed_out(standby), at - takeover
    _kinds(standby, sick, takeover + POLICY.drain_timeout_s + 2)
    assert _timed_out(standby)
