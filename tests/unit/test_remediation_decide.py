"""decide(): one test per rule of docs/remediation.md, on hand-built fleets."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from gpuguard.model import Action
from gpuguard.remediation.model import BreakerState, Phase, Resolution, Step
from gpuguard.remediation.policy import Policy
from tests.unit.remediation_builders import (
    GPU0,
    GPU1,
    T0,
    K,
    answered,
    bad,
    episode,
    fleet,
    kinds,
    node,
    of_kind,
    ok,
    run,
    unknown,
)

KILL = bad(Action.KILL_JOB, ("XID_13",), (GPU0,), since=T0 - 600)
RESET = bad(Action.RESET_GPU, ("XID_95",), (GPU0, GPU1), since=T0 - 600)
REBOOT = bad(Action.REBOOT, ("XID_79",), (GPU0,), since=T0 - 600)


# -- detection ------------------------------------------------------------------------


def test_false_layer_opens_an_episode_recorded_before_the_taint():
    plan = run(fleet(node("n1", bad(Action.KILL_JOB, ("XID_13",)))))
    assert kinds(plan) == [K.RECORD, K.TAINT]
    ep = plan.episodes["n1"]
    assert (ep.phase, ep.opened_at, ep.phase_since) == (Phase.QUARANTINED, T0, T0)
    assert ep.steps == [Step(T0, Phase.QUARANTINED, plan.decisions[0].reason)]
    assert "XID_13" in plan.decisions[0].reason


def test_already_tainted_node_is_not_tainted_again():
    plan = run(fleet(node("n1", bad(Action.KILL_JOB, ("XID_13",)), tainted=True)))
    assert kinds(plan) == [K.RECORD]


def test_unknown_opens_only_after_the_grace_period():
    policy = Policy()
    young = fleet(node("n1", unknown(since=T0 - policy.unknown_grace_s + 1)))
    assert run(young).decisions == []
    old = fleet(node("n1", unknown(since=T0 - policy.unknown_grace_s)))
    assert kinds(run(old)) == [K.RECORD, K.TAINT]


def test_unknown_only_episode_never_acts_and_asks_for_a_human():
    nodes = fleet(node("n1", unknown(since=T0 - 7200), tainted=True))
    plan = run(nodes, {"n1": episode("n1", opened_at=T0 - 3600)})
    assert plan.decisions == []
    assert any("needs a human" in note for note in plan.notes)


def test_node_without_layers_is_neither_healthy_nor_unhealthy():
    bare = dataclasses.replace(node("n1", tainted=True), layers={})
    assert run(fleet(bare)).decisions == []
    plan = run(fleet(bare), {"n1": episode("n1")})
    assert plan.decisions == []


@pytest.mark.parametrize("flag", ["excluded", "do_not_disrupt"])
def test_excluded_and_do_not_disrupt_nodes_get_no_decision(flag):
    nodes = fleet(node("n1", REBOOT, **{flag: True}))
    assert run(nodes).decisions == []
    ep = episode("n1", Phase.DRAINING, Action.REBOOT, cordoned_by_us=True)
    plan = run(nodes, {"n1": ep})
    assert plan.decisions == []
    assert plan.episodes["n1"] == ep
    assert any("left as it is" in note for note in plan.notes)


# -- quarantined --------------------------------------------------------------------


def test_transient_fault_closes_after_clear_after_s_with_untaint():
    policy = Policy()
    ep = episode("n1", opened_at=T0 - 100)
    young = fleet(node("n1", ok(since=T0 - policy.clear_after_s + 1), tainted=True))
    assert run(young, {"n1": ep}).decisions == []
    settled = fleet(node("n1", ok(since=T0 - policy.clear_after_s), tainted=True))
    plan = run(settled, {"n1": ep})
    assert kinds(plan) == [K.RECORD, K.UNTAINT]
    assert plan.episodes["n1"].resolution is Resolution.TRANSIENT
    assert plan.episodes["n1"].closed_at == T0


def test_healthy_after_a_tried_rung_closes_repaired_and_uncordons_our_cordon():
    ep = episode("n1", rung=Action.REBOOT, cordoned_by_us=True)
    plan = run(fleet(node("n1", tainted=True, unschedulable=True)), {"n1": ep})
    assert kinds(plan) == [K.RECORD, K.UNTAINT, K.UNCORDON]
    assert plan.episodes["n1"].resolution is Resolution.REPAIRED


def test_fault_waits_out_its_tolerance_before_any_action():
    policy = Policy()
    layer = bad(Action.REBOOT, ("XID_74",), since=T0 - 3600)
    ep = episode("n1", opened_at=T0 - policy.tolerance_s + 1)
    assert run(fleet(node("n1", layer, tainted=True)), {"n1": ep}).decisions == []
    ep = episode("n1", opened_at=T0 - policy.tolerance_s)
    plan = run(fleet(node("n1", layer, tainted=True)), {"n1": ep})
    assert kinds(plan) == [K.RECORD, K.CORDON, K.EVICT_PODS]


def test_tolerance_counts_from_the_false_transition_not_an_older_unknown_episode():
    layer = bad(Action.REBOOT, ("XID_74",), since=T0 - 10)
    plan = run(fleet(node("n1", layer, tainted=True)), {"n1": episode("n1", opened_at=T0 - 999)})
    assert plan.decisions == []


def test_per_code_tolerance_and_the_most_urgent_code_wins():
    policy = Policy(tolerances={"XID_74": 1000})
    assert policy.tolerances["XID_79"] == 0  # defaults merged
    slow = bad(Action.REBOOT, ("XID_74",), since=T0)
    ep = episode("n1", opened_at=T0 - 500)
    assert run(fleet(node("n1", slow, tainted=True)), {"n1": ep}, policy=policy).decisions == []
    urgent = bad(Action.REBOOT, ("XID_74", "XID_79"), since=T0)
    plan = run(fleet(node("n1", urgent, tainted=True)), {"n1": ep}, policy=policy)
    assert K.EVICT_PODS in kinds(plan)


def test_kill_job_kills_the_pods_on_the_named_gpus_then_verifies():
    plan = run(fleet(node("n1", KILL, tainted=True)), {"n1": episode("n1")})
    assert kinds(plan) == [K.RECORD, K.KILL_PODS]
    kill = plan.decisions[1]
    assert (kill.action, kill.gpus, kill.attempt) == (Action.KILL_JOB, (GPU0,), 1)
    ep = plan.episodes["n1"]
    assert (ep.phase, ep.rung, ep.attempts, ep.last_action_at) == (
        Phase.ACTING,
        Action.KILL_JOB,
        {Action.KILL_JOB: 1},
        T0,
    )
    later = run(fleet(node("n1", KILL, tainted=True)), {"n1": ep}, now=T0 + 30)
    assert kinds(later) == [K.RECORD]
    assert later.episodes["n1"].phase is Phase.VERIFYING


def test_reset_gpu_drains_only_the_named_gpus_without_cordon():
    plan = run(fleet(node("n1", RESET, tainted=True)), {"n1": episode("n1")})
    assert kinds(plan) == [K.RECORD, K.EVICT_PODS]
    assert plan.decisions[1].gpus == (GPU0, GPU1)
    assert plan.episodes["n1"].phase is Phase.DRAINING
    assert plan.episodes["n1"].gpus == (GPU0, GPU1)


def test_reboot_cordons_and_drains_the_whole_node():
    plan = run(fleet(node("n1", REBOOT, tainted=True)), {"n1": episode("n1")})
    assert kinds(plan) == [K.RECORD, K.CORDON, K.EVICT_PODS]
    assert plan.decisions[2].gpus == ()
    assert plan.episodes["n1"].cordoned_by_us


def test_a_node_someone_else_cordoned_is_not_claimed_as_ours():
    nodes = fleet(node("n1", REBOOT, tainted=True, unschedulable=True))
    plan = run(nodes, {"n1": episode("n1")})
    assert kinds(plan) == [K.RECORD, K.EVICT_PODS]
    assert not plan.episodes["n1"].cordoned_by_us


def test_min_action_interval_holds_the_next_rung_back():
    ep = episode("n1", rung=Action.KILL_JOB, last_action_at=T0 - 100)
    plan = run(fleet(node("n1", RESET, tainted=True)), {"n1": ep})
    assert plan.decisions == []
    assert any("minimum interval" in note for note in plan.notes)


def test_lemon_goes_straight_to_replace():
    history = [
        dataclasses.replace(episode("n1"), phase=Phase.CLOSED, closed_at=T0 - 86400 * d)
        for d in (1, 2)
    ]
    plan = run(fleet(node("n1", KILL, tainted=True)), {"n1": episode("n1")}, history=history)
    assert plan.episodes["n1"].rung is Action.REPLACE
    assert "lemon" in plan.decisions[0].reason
    stale = [dataclasses.replace(h, closed_at=T0 - 86400 * 8) for h in history]
    plan = run(fleet(node("n1", KILL, tainted=True)), {"n1": episode("n1")}, history=stale)
    assert plan.episodes["n1"].rung is Action.KILL_JOB


def test_the_clouds_scheduled_maintenance_gets_its_rung_once_then_is_held_drained():
    scheduled = bad(Action.REBOOT, ("MAINTENANCE_EVENT",), since=T0 - 600)
    lemon = [
        dataclasses.replace(episode("n1"), phase=Phase.CLOSED, closed_at=T0 - 86400 * d)
        for d in (1, 2)
    ]
    plan = run(fleet(node("n1", scheduled, tainted=True)), {"n1": episode("n1")}, history=lemon)
    assert plan.episodes["n1"].rung is Action.REBOOT  # never a lemon's REPLACE
    # The reboot done, the event still scheduled (AWS keeps it open): no climb, no human.
    ep = episode("n1", rung=Action.REBOOT, last_action_at=0.0, cordoned_by_us=True)
    plan = run(fleet(node("n1", scheduled, tainted=True, unschedulable=True)), {"n1": ep})
    held = plan.episodes["n1"]
    assert (held.rung, held.attempts, held.exhausted) == (Action.REBOOT, {Action.REBOOT: 1}, False)
    assert held.phase is Phase.QUARANTINED and held.cordoned_by_us
    assert K.UNCORDON not in kinds(plan) and K.REPLACE not in kinds(plan)
    assert any("held drained until the cloud does it" in note for note in plan.notes)
    # A real fault beside it is the ladder's again.
    both = bad(Action.REBOOT, ("MAINTENANCE_EVENT", "XID_79"), since=T0 - 600)
    plan = run(fleet(node("n1", both, tainted=True, unschedulable=True)), {"n1": ep})
    assert plan.episodes["n1"].rung is Action.REPLACE


def test_rung_is_retried_while_it_has_attempts_then_the_next_one():
    ep = episode("n1", rung=Action.KILL_JOB, last_action_at=T0 - 1000)
    plan = run(fleet(node("n1", KILL, tainted=True)), {"n1": ep})
    assert plan.episodes["n1"].attempts == {Action.KILL_JOB: 2}
    ep = episode("n1", rung=Action.KILL_JOB, attempts={Action.KILL_JOB: 2}, last_action_at=0.0)
    plan = run(fleet(node("n1", KILL, tainted=True)), {"n1": ep})
    assert plan.episodes["n1"].rung is Action.RESET_GPU


def test_no_rung_left_flags_the_episode_for_a_human_and_keeps_the_taint():
    attempts = {Action.REBOOT: 1, Action.REPLACE: 1}
    ep = episode("n1", rung=Action.REPLACE, attempts=attempts, last_action_at=0.0)
    nodes = fleet(node("n1", REBOOT, tainted=True))
    plan = run(nodes, {"n1": ep})
    assert kinds(plan) == [K.RECORD]
    assert plan.episodes["n1"].exhausted
    assert plan.episodes["n1"].phase is Phase.QUARANTINED
    again = run(nodes, {"n1": plan.episodes["n1"]}, now=T0 + 30)
    assert again.decisions == []


def test_a_rung_switched_off_is_skipped():
    policy = Policy(max_attempts={"RESET_GPU": 0})
    plan = run(fleet(node("n1", RESET, tainted=True)), {"n1": episode("n1")}, policy=policy)
    assert plan.episodes["n1"].rung is Action.REBOOT


def test_findings_that_recommend_nothing_need_a_human():
    layer = bad(Action.NONE, ("SOMETHING",), since=T0 - 600)
    plan = run(fleet(node("n1", layer, tainted=True)), {"n1": episode("n1")})
    assert plan.decisions == []
    assert any("needs a human" in note for note in plan.notes)


# -- safety gates --------------------------------------------------------------------


def test_budget_lets_only_the_allowed_number_of_a_pool_drain():
    nodes = fleet(*(node(f"n{i}", REBOOT, tainted=True) for i in range(5)))
    episodes = {name: episode(name) for name in nodes}
    plan = run(nodes, episodes)  # 5 nodes: min(2, max(1, 10 % of 5)) = 1
    assert [d.node for d in of_kind(plan, K.EVICT_PODS)] == ["n0"]
    assert sum("budget" in note for note in plan.notes) == 4


def test_budget_is_per_pool_and_an_active_episode_holds_its_slot():
    nodes = fleet(
        node("a1", REBOOT, tainted=True),
        node("a2", REBOOT, tainted=True),
        node("b1", REBOOT, tainted=True, pool="pool-b"),
    )
    episodes = {
        "a1": episode("a1", Phase.VERIFYING, Action.REBOOT, cordoned_by_us=True),
        "a2": episode("a2"),
        "b1": episode("b1"),
    }
    plan = run(nodes, episodes)
    assert [d.node for d in of_kind(plan, K.EVICT_PODS)] == ["b1"]


def test_kill_job_is_not_limited_by_the_budget():
    nodes = fleet(*(node(f"n{i}", KILL, tainted=True) for i in range(3)))
    plan = run(nodes, {name: episode(name) for name in nodes})
    assert len(of_kind(plan, K.KILL_PODS)) == 3


def test_open_breaker_starts_no_rung_pauses_drains_and_requests():
    breaker = BreakerState(open=True, opened_at=T0 - 10, reason="storm")
    history = [episode(f"h{i}", opened_at=T0 - 60) for i in range(3)]
    nodes = fleet(
        node("q", REBOOT, tainted=True),
        node("d", REBOOT, tainted=True, unschedulable=True, pods_to_move=0),
        node("a", REBOOT, tainted=True, unschedulable=True),
        *(node(f"h{i}") for i in range(3)),
    )
    episodes = {
        "q": episode("q"),
        "d": episode("d", Phase.DRAINING, Action.REBOOT, cordoned_by_us=True),
        "a": episode("a", Phase.ACTING, Action.REBOOT, cordoned_by_us=True),
    }
    plan = run(nodes, episodes, breaker=breaker, history=history)
    assert plan.breaker.open
    assert plan.decisions == []
    assert len(plan.notes) == 3


# -- draining ------------------------------------------------------------------------


def _draining(**node_flags: object):
    nodes = fleet(node("n1", REBOOT, tainted=True, unschedulable=True, **node_flags))
    ep = episode("n1", Phase.DRAINING, Action.REBOOT, cordoned_by_us=True)
    return nodes, ep


def test_drained_node_gets_the_action_requested_for_this_attempt():
    nodes, ep = _draining(pods_to_move=0)
    plan = run(nodes, {"n1": ep})
    assert kinds(plan) == [K.RECORD, K.REQUEST_ACTION]
    request = plan.decisions[1]
    assert (request.action, request.attempt, request.gpus) == (Action.REBOOT, 1, ())
    assert plan.episodes["n1"].phase is Phase.ACTING


def test_drained_replace_deletes_the_machine():
    nodes, ep = _draining(pods_to_move=0)
    ep = dataclasses.replace(ep, rung=Action.REPLACE, attempts={Action.REPLACE: 1})
    plan = run(nodes, {"n1": ep})
    assert kinds(plan) == [K.RECORD, K.REPLACE]


def test_drain_in_progress_resends_the_eviction():
    nodes, ep = _draining(pods_to_move=3)
    plan = run(nodes, {"n1": ep})
    assert kinds(plan) == [K.EVICT_PODS]
    assert "3 pods left" in plan.decisions[0].reason


def test_drain_timeout_quarantine_gives_the_attempt_up_and_uncordons():
    nodes, ep = _draining(pods_to_move=3)
    ep = dataclasses.replace(ep, phase_since=T0 - Policy().drain_timeout_s - 1)
    plan = run(nodes, {"n1": ep})
    assert kinds(plan) == [K.RECORD, K.UNCORDON]
    out = plan.episodes["n1"]
    assert (out.phase, out.cordoned_by_us, out.attempts) == (
        Phase.QUARANTINED,
        False,
        {Action.REBOOT: 1},
    )


def test_drain_timeout_force_deletes_the_pods_and_requests_the_action():
    nodes, ep = _draining(pods_to_move=3)
    ep = dataclasses.replace(ep, phase_since=T0 - Policy().drain_timeout_s - 1)
    plan = run(nodes, {"n1": ep}, policy=Policy(on_drain_timeout="force"))
    assert kinds(plan) == [K.RECORD, K.KILL_PODS, K.REQUEST_ACTION]
    assert plan.episodes["n1"].phase is Phase.ACTING


def test_node_healthy_again_while_draining_needs_no_action():
    nodes = fleet(node("n1", tainted=True, unschedulable=True, pods_to_move=3))
    ep = episode("n1", Phase.DRAINING, Action.REBOOT, cordoned_by_us=True)
    plan = run(nodes, {"n1": ep})
    assert kinds(plan) == [K.RECORD, K.UNTAINT, K.UNCORDON]
    assert plan.episodes["n1"].resolution is Resolution.REPAIRED


# -- acting --------------------------------------------------------------------------


def _acting(rung: Action = Action.REBOOT, **fields: object):
    nodes = fleet(node("n1", REBOOT, tainted=True, unschedulable=True))
    return nodes, episode("n1", Phase.ACTING, rung, cordoned_by_us=True, **fields)


def test_successful_action_moves_to_verifying():
    nodes, ep = _acting()
    plan = run(nodes, {"n1": answered(ep, True)})
    assert kinds(plan) == [K.RECORD]
    assert plan.episodes["n1"].phase is Phase.VERIFYING
    assert plan.episodes["n1"].phase_since == T0


def test_failed_action_escalates_to_the_next_rung():
    nodes, ep = _acting(last_action_at=T0 - 1000)
    plan = run(nodes, {"n1": answered(ep, False, "reboot refused")})
    assert kinds(plan) == [K.RECORD, K.EVICT_PODS]  # already cordoned by us
    out = plan.episodes["n1"]
    assert (out.rung, out.phase, out.attempt) == (Action.REPLACE, Phase.DRAINING, 1)
    assert out.action_result is None  # the next attempt waits for its own answer
    assert "reboot refused" in plan.decisions[0].reason


def test_answer_to_an_earlier_attempt_is_ignored_and_the_request_resent():
    nodes, ep = _acting(Action.RESET_GPU, attempts={Action.RESET_GPU: 2}, gpus=(GPU0,))
    old = answered(dataclasses.replace(ep, attempts={Action.RESET_GPU: 1}), True)
    ep = dataclasses.replace(ep, action_result=old.action_result)
    plan = run(nodes, {"n1": ep})
    assert kinds(plan) == [K.REQUEST_ACTION]
    assert (plan.decisions[0].attempt, plan.decisions[0].gpus) == (2, (GPU0,))


def test_unanswered_action_times_out_and_escalates():
    nodes, ep = _acting(phase_since=T0 - Policy().action_timeout_s - 1)
    plan = run(nodes, {"n1": ep})
    assert plan.episodes["n1"].rung is Action.REPLACE


def test_replace_is_resent_until_the_node_is_gone():
    nodes, ep = _acting(Action.REPLACE)
    plan = run(nodes, {"n1": ep})
    assert kinds(plan) == [K.REPLACE]
    gone = {"n1": dataclasses.replace(nodes["n1"], exists=False)}
    plan = run(gone, {"n1": ep})
    assert kinds(plan) == [K.RECORD]
    assert plan.episodes["n1"].resolution is Resolution.REPLACED


# -- verifying -----------------------------------------------------------------------


def test_verify_needs_a_report_newer_than_the_action():
    ep = episode("n1", Phase.VERIFYING, Action.RESET_GPU, phase_since=T0 - 120)
    stale = fleet(node("n1", tainted=True, reported_at=T0 - 200))
    assert run(stale, {"n1": ep}).decisions == []
    fresh = fleet(node("n1", tainted=True, reported_at=T0 - 10))
    plan = run(fresh, {"n1": ep})
    assert kinds(plan) == [K.RECORD, K.UNTAINT]
    assert plan.episodes["n1"].resolution is Resolution.REPAIRED


def test_still_bad_after_verify_timeout_escalates():
    since = T0 - Policy().verify_timeout_s - 1
    ep = episode("n1", Phase.VERIFYING, Action.RESET_GPU, phase_since=since)
    plan = run(fleet(node("n1", RESET, tainted=True)), {"n1": ep})
    assert kinds(plan) == [K.RECORD, K.CORDON, K.EVICT_PODS]
    assert plan.episodes["n1"].rung is Action.REBOOT


def test_escalation_blocked_by_the_budget_waits_quarantined_then_resumes():
    since = T0 - Policy().verify_timeout_s - 1
    nodes = fleet(node("n1", RESET, tainted=True), node("n2", REBOOT, tainted=True))
    episodes = {
        "n1": episode("n1", Phase.VERIFYING, Action.RESET_GPU, phase_since=since),
        "n2": episode("n2", Phase.DRAINING, Action.REBOOT, cordoned_by_us=True),
    }
    policy = Policy(budget={"max_unavailable": 1})
    plan = run(nodes, episodes, policy=policy)
    assert kinds(plan, "n1") == [K.RECORD]
    waiting = plan.episodes["n1"]
    assert (waiting.phase, waiting.rung) == (Phase.QUARANTINED, Action.RESET_GPU)
    nodes["n2"] = node("n2")  # n2 repaired: its episode closed, the slot is free
    plan = run(nodes, {"n1": waiting}, now=T0 + 30, policy=policy)
    assert kinds(plan, "n1") == [K.RECORD, K.CORDON, K.EVICT_PODS]  # no tolerance wait


# -- node gone, leftovers, inputs ----------------------------------------------------


@pytest.mark.parametrize(
    ("rung", "resolution"),
    [(Action.REPLACE, Resolution.REPLACED), (Action.REBOOT, Resolution.GONE)],
)
def test_missing_node_closes_its_episode_without_untaint(rung, resolution):
    ep = episode("n1", Phase.ACTING, rung)
    plan = run({}, {"n1": ep})
    assert kinds(plan) == [K.RECORD]
    assert plan.episodes["n1"].resolution is resolution


def test_leftover_taint_and_cordon_of_a_cut_short_close_are_removed():
    nodes = fleet(node("n1", tainted=True, unschedulable=True, cordoned_by_us=True))
    assert kinds(run(nodes)) == [K.UNTAINT, K.UNCORDON]
    theirs = fleet(node("n1", unschedulable=True))
    assert run(theirs).decisions == []


def test_missing_taint_of_an_open_episode_is_restored():
    layer = bad(Action.REBOOT, ("XID_74",))
    plan = run(fleet(node("n1", layer, tainted=False)), {"n1": episode("n1", opened_at=T0)})
    assert kinds(plan) == [K.TAINT]


def test_inputs_are_not_mutated_and_output_is_deterministic():
    nodes = fleet(node("b", REBOOT, tainted=True), node("a", KILL, tainted=True), node("c", RESET))
    episodes = {"a": episode("a"), "b": episode("b")}
    history = [dataclasses.replace(episode("a"), phase=Phase.CLOSED, closed_at=T0 - 10)]
    before = copy.deepcopy((nodes, episodes, history))
    first = run(nodes, episodes, history=history)
    assert (nodes, episodes, history) == before
    assert run(nodes, episodes, history=history) == first
    assert [d.node for d in first.decisions] == sorted(d.node for d in first.decisions)
    assert list(first.episodes) == ["a", "b", "c"]


def test_healthy_fleet_needs_nothing():
    nodes = fleet(*(node(f"n{i}") for i in range(10)))
    plan = run(nodes)
    assert (plan.decisions, plan.episodes, plan.notes) == ([], {}, [])


@pytest.mark.parametrize("karpenter_repair", [False, True])
def test_a_node_karpenters_repair_will_replace_is_left_to_it_when_told(karpenter_repair):
    """One authority per node: with Karpenter's node repair on, a node whose
    AcceleratedHardwareReady is False is its to replace; gpuguard quarantines it only."""
    policy = Policy(karpenter_repair=karpenter_repair)
    sick = node("n1", REBOOT, tainted=True, repair_conditions=("AcceleratedHardwareReady",))
    plan = run(fleet(sick), {"n1": episode("n1")}, policy=policy)
    if karpenter_repair:
        assert plan.episodes["n1"].rung is None and kinds(plan) == [K.RECORD]
        assert "left to Karpenter's node repair" in plan.episodes["n1"].steps[-1].message
    else:
        assert plan.episodes["n1"].rung is Action.REBOOT


def test_a_pod_that_asks_not_to_be_disrupted_holds_every_rung_but_not_the_taint():
    """Karpenter's pod-level do-not-disrupt: the node is quarantined, no rung starts while
    the pod runs (one step says why), and the ladder goes on once it has gone."""
    held = node("n1", REBOOT, protected_by="ml/train-0")
    plan = run(fleet(held), now=T0 + 3600)  # past the fault's tolerance
    assert kinds(plan) == [K.RECORD, K.TAINT, K.RECORD]
    ep = plan.episodes["n1"]
    assert ep.rung is None
    assert "ml/train-0 carries karpenter.sh/do-not-disrupt" in ep.steps[-1].message
    again = run(fleet(dataclasses.replace(held, tainted=True)), {"n1": ep}, now=T0 + 3660)
    assert again.decisions == []  # the same reason: no new step
    free = node("n1", REBOOT, tainted=True)
    assert run(fleet(free), {"n1": ep}, now=T0 + 3720).episodes["n1"].rung is Action.REBOOT
