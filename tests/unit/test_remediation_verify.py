"""The verify gate: a repaired node returns to service only after a fresh deep-suite pass."""

from __future__ import annotations

import pytest

from gpuguard.contract.verify import VerifyAnswer, request_id
from gpuguard.errors import ConfigError
from gpuguard.model import Action
from gpuguard.remediation.model import Phase, Resolution
from gpuguard.remediation.policy import Policy, build_policy
from tests.unit.remediation_builders import (
    T0,
    K,
    Sim,
    bad,
    episode,
    fleet,
    kinds,
    node,
    of_kind,
    ok,
    run,
)

GATED = Policy(verify={"enabled": True})
STARTED = T0 - 120  # when the episode entered Verifying: the stamp of its request
SLOW = ("DEEP_MATMUL_SLOW",)


def verifying(rung: Action = Action.REBOOT, since: float = STARTED, **fields: object):
    return {
        "n1": episode("n1", Phase.VERIFYING, rung, phase_since=since, cordoned_by_us=True, **fields)
    }


def repaired(**flags: object):
    """Healthy, freshly reported, still tainted and cordoned by us."""
    return fleet(
        node(
            "n1",
            tainted=True,
            unschedulable=True,
            cordoned_by_us=True,
            reported_at=T0 - 10,
            **flags,
        )
    )


def test_off_by_default_a_healthy_fresh_report_closes_as_before():
    plan = run(repaired(), verifying())
    assert kinds(plan) == [K.RECORD, K.UNTAINT, K.UNCORDON]
    assert plan.episodes["n1"].resolution is Resolution.REPAIRED


def test_gate_requests_a_verify_stamped_with_the_phase_start_and_waits():
    plan = run(repaired(), verifying(), policy=GATED)
    (request,) = of_kind(plan, K.REQUEST_VERIFY)
    assert request.request == request_id(STARTED)
    assert kinds(plan) == [K.REQUEST_VERIFY]
    assert plan.episodes["n1"].phase is Phase.VERIFYING
    # Once the request is on the Node it is not written again.
    assert (
        run(repaired(verify_request=request_id(STARTED)), verifying(), policy=GATED).decisions == []
    )


def test_a_pass_for_this_request_closes_and_withdraws_the_request():
    answer = VerifyAnswer(request_id(STARTED), passed=True)
    plan = run(
        repaired(verify_request=request_id(STARTED), verify=answer), verifying(), policy=GATED
    )
    assert kinds(plan) == [K.RECORD, K.UNTAINT, K.UNCORDON, K.CLEAR_VERIFY]
    out = plan.episodes["n1"]
    assert out.resolution is Resolution.REPAIRED
    assert "passed the deep verify" in out.steps[-1].message


def test_a_pass_older_than_the_request_is_ignored():
    stale = VerifyAnswer(
        request_id(STARTED - 3600), passed=True
    )  # answered an earlier episode's request
    plan = run(
        repaired(verify_request=request_id(STARTED - 3600), verify=stale), verifying(), policy=GATED
    )
    assert kinds(plan) == [K.REQUEST_VERIFY]
    assert plan.episodes["n1"].phase is Phase.VERIFYING


def test_a_pass_waits_for_the_node_to_be_healthy_for_clear_after_s():
    answer = VerifyAnswer(request_id(STARTED), passed=True)
    just_healed = fleet(
        node(
            "n1",
            ok(since=T0 - 1),
            tainted=True,
            reported_at=T0 - 1,
            verify_request=request_id(STARTED),
            verify=answer,
        )
    )
    plan = run(just_healed, verifying(), policy=GATED)
    assert plan.decisions == [] and plan.episodes["n1"].phase is Phase.VERIFYING


def test_a_failed_verify_escalates_like_a_failed_repair():
    answer = VerifyAnswer(request_id(STARTED), passed=False, codes=SLOW)
    slow = fleet(
        node(
            "n1",
            bad(Action.RESET_GPU, SLOW, since=T0 - 30),
            tainted=True,
            unschedulable=True,
            cordoned_by_us=True,
            reported_at=T0 - 10,
            verify_request=request_id(STARTED),
            verify=answer,
        )
    )
    plan = run(slow, verifying(last_action_at=T0 - 1000), policy=GATED)
    out = plan.episodes["n1"]
    assert (out.rung, out.phase) == (Action.REPLACE, Phase.DRAINING)
    assert "deep verify after REBOOT attempt 1 failed: DEEP_MATMUL_SLOW" in out.steps[-1].message


def test_no_answer_within_the_timeout_fails_closed():
    stamp = T0 - GATED.verify.timeout_s - 1
    late = verifying(since=stamp, last_action_at=T0 - 2000)
    plan = run(repaired(verify_request=request_id(stamp)), late, policy=GATED)
    out = plan.episodes["n1"]
    assert out.resolution is None and K.UNTAINT not in kinds(plan)
    assert "no deep verify answer 900s after REBOOT attempt 1" in out.steps[-1].message
    # Nothing to climb to on a healthy-looking node: it waits for a human, tainted.
    assert out.phase is Phase.QUARANTINED
    later = run(repaired(verify_request=request_id(stamp)), {"n1": out}, now=T0 + 600, policy=GATED)
    assert K.UNTAINT not in kinds(later) and K.REQUEST_VERIFY not in kinds(later)
    assert later.episodes["n1"].phase is Phase.QUARANTINED
    assert any("was not answered" in note for note in later.notes)


def test_healthy_again_in_quarantine_after_a_gated_rung_goes_to_verify_first():
    ep = episode("n1", Phase.QUARANTINED, Action.REBOOT, phase_since=T0 - 600)
    plan = run(repaired(), {"n1": ep}, policy=GATED)
    assert kinds(plan) == [K.RECORD]
    assert plan.episodes["n1"].phase is Phase.VERIFYING


def test_rungs_outside_the_gate_close_without_a_verify():
    plan = run(repaired(), verifying(Action.RESET_GPU), policy=GATED)
    assert plan.episodes["n1"].resolution is Resolution.REPAIRED
    both = Policy(verify={"enabled": True, "rungs": ["RESET_GPU", "REBOOT"]})
    assert kinds(run(repaired(), verifying(Action.RESET_GPU), policy=both)) == [K.REQUEST_VERIFY]


def test_leftover_verify_request_on_a_healthy_node_is_removed():
    plan = run(fleet(node("n1", verify_request=request_id(T0 - 5000))))
    assert kinds(plan) == [K.CLEAR_VERIFY]


def test_reboot_to_service_through_the_gate():
    sim = Sim(fleet(node("n1")), policy=Policy(verify={"enabled": True}, tolerance_s=0))
    sim.break_(["n1"], action=Action.REBOOT, codes=("XID_79",))
    sim.step()  # quarantined
    sim.step()  # cordon, drain
    sim.step()  # drained: reboot requested
    sim.answer("n1", True)
    sim.heal(["n1"])
    sim.step()  # verifying
    plan = sim.step(120)
    (request,) = of_kind(plan, K.REQUEST_VERIFY)
    sim.set("n1", verify_request=request.request)
    sim.step(60)
    assert sim.episodes["n1"].phase is Phase.VERIFYING and sim.nodes["n1"].tainted
    assert request.request is not None
    sim.set("n1", verify=VerifyAnswer(request.request, passed=True))
    plan = sim.step()
    assert sim.history[-1].resolution is Resolution.REPAIRED
    assert not sim.nodes["n1"].tainted and not sim.nodes["n1"].unschedulable
    assert K.CLEAR_VERIFY in kinds(plan)


def test_bad_verify_settings_are_named():
    with pytest.raises(ConfigError, match=r"verify\.rungs\.0"):
        build_policy({"verify": {"enabled": True, "rungs": ["KILL_JOB"]}}, "policy.yaml")
    with pytest.raises(ConfigError, match=r"verify\.timeout: unknown key .*timeout_s"):
        build_policy({"verify": {"timeout": 5}}, "policy.yaml")
