"""Where a fault lives: position memory, the replacement cap, shared positions, and slowness
confirmed before anything is destroyed (remediation/positions.py, confirm.py)."""

from __future__ import annotations

import dataclasses

import pytest

from gpuguard.contract.report import LayerReport
from gpuguard.contract.verify import VerifyAnswer
from gpuguard.errors import ConfigError
from gpuguard.model import Action
from gpuguard.remediation.model import Phase, Resolution
from gpuguard.remediation.policy import Policy, build_policy
from tests.unit.remediation_builders import GPU0, K, Sim, bad, kinds, node, ok

DAY = 24 * 3600.0
PORT = "mlx5_0/1"
# Straight to REPLACE: the rungs below are switched off, no tolerance to wait out.
FAST = Policy.model_validate(
    {
        "max_attempts": {"KILL_JOB": 0, "RESET_GPU": 0, "REBOOT": 0},
        "tolerance_s": 0,
        "min_action_interval_s": 0,
    }
)


def link_down(port: str = PORT, code: str = "IB_LINK_DOWN") -> LayerReport:
    return LayerReport("False", "IbLinkDown", 0.0, Action.REPLACE, (code,), (), ports=(port,))


def at_position(name: str, position: str = "rack=r1,position=u1", **flags: object) -> object:
    return node(name, position=position, **flags)


def set_network(sim: Sim, name: str, layer: LayerReport) -> None:
    current = sim.nodes[name]
    layer = dataclasses.replace(layer, since=sim.now)
    sim.nodes[name] = dataclasses.replace(current, layers={**current.layers, "network": layer})


def replaced_once(sim: Sim, name: str) -> None:
    """Walk ``name`` up to a REPLACE and let the provider take the machine away."""
    set_network(sim, name, link_down())
    for _ in range(10):
        sim.step()
        episode = sim.episodes.get(name)
        if episode is not None and episode.phase is Phase.ACTING:
            break
    assert K.REPLACE in kinds(sim.plans[-1], name)
    sim.set(name, exists=False)
    sim.step()
    assert [e.resolution for e in sim.history if e.node == name] == [Resolution.REPLACED]


def successor(sim: Sim, name: str, layer: LayerReport | None = None) -> None:
    sim.nodes[name] = at_position(name)  # type: ignore[assignment]
    set_network(sim, name, layer or link_down())


def steps_until_settled(sim: Sim, count: int = 8) -> list[K]:
    seen: list[K] = []
    for _ in range(count):
        seen += kinds(sim.step())
    return seen


def test_the_successor_showing_the_same_port_fault_is_the_positions_not_replaced_again():
    sim = Sim({"n1": at_position("n1")}, policy=FAST)  # type: ignore[dict-item]
    replaced_once(sim, "n1")
    successor(sim, "n1-r1")
    seen = steps_until_settled(sim)
    assert K.REPLACE not in seen and K.REQUEST_ACTION not in seen and K.CORDON not in seen
    episode = sim.episodes["n1-r1"]
    assert episode.phase is Phase.QUARANTINED
    assert "rack=r1,position=u1" in episode.position_fault
    assert f"IB_LINK_DOWN@{PORT}" in episode.position_fault
    assert "n1 was replaced there" in episode.steps[-1].message
    assert sim.nodes["n1-r1"].tainted


def test_a_person_marking_the_position_fixed_takes_the_mark_and_forgets_the_history():
    sim = Sim({"n1": at_position("n1")}, policy=FAST)  # type: ignore[dict-item]
    replaced_once(sim, "n1")
    successor(sim, "n1-r1")
    steps_until_settled(sim)
    sim.set("n1-r1", position_fixed="ticket-1")
    plan = sim.step()
    assert K.CLEAR_POSITION_FIXED in kinds(plan, "n1-r1")
    episode = sim.episodes["n1-r1"]
    assert episode.position_fault == "" and episode.position_fixed_at == sim.now
    assert any("marked fixed ('ticket-1')" in s.message for s in episode.steps)
    sim.set("n1-r1", position_fixed="")
    # The fault is still there after the mark: the evidence before it no longer counts,
    # nor does the earlier replacement against the cap, so the ladder goes on.
    assert K.REPLACE in steps_until_settled(sim)


def test_the_position_returns_when_the_fault_clears():
    sim = Sim({"n1": at_position("n1")}, policy=FAST)  # type: ignore[dict-item]
    replaced_once(sim, "n1")
    successor(sim, "n1-r1")
    steps_until_settled(sim)
    set_network(sim, "n1-r1", ok())
    seen = steps_until_settled(sim, 6)
    assert K.UNTAINT in seen and "n1-r1" not in sim.episodes
    closed = [e for e in sim.history if e.node == "n1-r1"]
    assert closed[0].resolution is Resolution.TRANSIENT and closed[0].position_fault


def test_another_fault_on_the_successor_is_its_own_but_the_cap_allows_one_replacement_a_week():
    sim = Sim({"n1": at_position("n1")}, policy=FAST)  # type: ignore[dict-item]
    replaced_once(sim, "n1")
    successor(sim, "n1-r1", link_down(port="mlx5_3/1"))
    seen = steps_until_settled(sim)
    assert K.REPLACE not in seen
    episode = sim.episodes["n1-r1"]
    assert episode.position_fault == ""
    assert "had 1 automatic replacements within 604800s: n1" in episode.steps[-1].message
    sim.now += 7 * DAY
    assert K.REPLACE in steps_until_settled(sim, 3)


def test_a_gpu_fault_on_the_successor_still_gets_its_reboot():
    policy = Policy.model_validate({"tolerance_s": 0, "min_action_interval_s": 0})
    sim = Sim({"n1": at_position("n1")}, policy=FAST)  # type: ignore[dict-item]
    replaced_once(sim, "n1")
    sim.policy = policy
    sim.nodes["n1-r1"] = at_position("n1-r1")  # type: ignore[assignment]
    sim.set_gpu("n1-r1", bad(Action.REBOOT))
    seen = steps_until_settled(sim, 4)
    assert K.CORDON in seen and K.EVICT_PODS in seen
    assert sim.episodes["n1-r1"].rung is Action.REBOOT


def test_nodes_without_a_position_are_their_own_and_never_held_for_another():
    sim = Sim({"a": node("a"), "b": node("b")}, policy=FAST)
    replaced_once(sim, "a")
    sim.nodes["a-r1"] = node("a-r1")
    set_network(sim, "a-r1", link_down())
    assert K.REPLACE in steps_until_settled(sim, 4)
    assert [e.position for e in sim.history if e.node == "a-r1"] == ["a-r1"]


def test_a_position_claimed_by_two_live_nodes_is_held_naming_both():
    sim = Sim(
        {
            "a": at_position("a", position_shared_with=("b",)),
            "b": at_position("b", position_shared_with=("a",)),
        },  # type: ignore[dict-item]
        policy=FAST,
    )
    set_network(sim, "a", link_down())
    seen = steps_until_settled(sim, 4)
    assert K.REPLACE not in seen and K.TAINT in seen
    message = sim.episodes["a"].steps[-1].message
    assert "position rack=r1,position=u1 is claimed by a and b" in message


def test_a_mark_without_a_held_position_is_taken_off_and_changes_nothing():
    sim = Sim({"a": node("a", position_fixed="yes")})
    plan = sim.step()
    assert kinds(plan, "a") == [K.CLEAR_POSITION_FIXED]


# -- confirming slowness ---------------------------------------------------------------


def slow(code: str = "DEEP_MATMUL_SLOW", action: Action = Action.RESET_GPU) -> LayerReport:
    return LayerReport("False", "Slow", 0.0, action, (code,), (GPU0,), deferred=True)


def answer_latest(sim: Sim, name: str, passed: bool, codes: tuple[str, ...] = ()) -> None:
    request = sim.nodes[name].verify_request
    assert request is not None
    sim.set(name, verify=VerifyAnswer(request, passed, codes))


def requests(sim: Sim, name: str) -> None:
    for decision in sim.plans[-1].decisions:
        if decision.kind is K.REQUEST_VERIFY and decision.node == name:
            sim.set(name, verify_request=decision.request)


def slow_sim(layer: LayerReport) -> Sim:
    policy = Policy.model_validate({"tolerance_s": 0, "min_action_interval_s": 0})
    sim = Sim({"a": node("a")}, policy=policy)
    sim.set_gpu("a", layer)
    return sim


def test_slowness_asks_for_a_second_measurement_and_never_acts_before_it():
    sim = slow_sim(slow())
    sim.step()
    sim.step()
    requests(sim, "a")
    assert sim.nodes["a"].verify_request is not None
    seen = steps_until_settled(sim, 5)
    assert not {K.EVICT_PODS, K.REQUEST_ACTION, K.CORDON, K.REPLACE} & set(seen)
    assert "second measurement" in sim.episodes["a"].steps[-1].message


def test_a_second_measurement_that_passes_quarantines_and_measures_again_later():
    sim = slow_sim(slow())
    sim.step()
    sim.step()
    requests(sim, "a")
    answer_latest(sim, "a", passed=True)
    seen = steps_until_settled(sim, 5)
    assert not {K.EVICT_PODS, K.REQUEST_ACTION, K.CORDON, K.REPLACE} & set(seen)
    assert K.REQUEST_VERIFY not in seen  # not before remeasure_s
    assert "not confirmed: the second measurement passed" in sim.episodes["a"].steps[-1].message
    sim.now += sim.policy.confirm.remeasure_s
    assert K.REQUEST_VERIFY in kinds(sim.step(), "a")


def test_a_failed_measurement_of_something_else_does_not_confirm():
    sim = slow_sim(slow())
    sim.step()
    sim.step()
    requests(sim, "a")
    answer_latest(sim, "a", passed=False, codes=("TOOL_MISSING",))
    seen = steps_until_settled(sim, 4)
    assert not {K.EVICT_PODS, K.REQUEST_ACTION} & set(seen)
    assert "found TOOL_MISSING" in sim.episodes["a"].steps[-1].message


@pytest.mark.parametrize(
    ("code", "action"),
    [("DEEP_MATMUL_SLOW", Action.RESET_GPU), ("IN_JOB_FAIL_SLOW", Action.REPLACE)],
)
def test_confirmed_slowness_starts_with_a_gpu_reset(code: str, action: Action):
    sim = slow_sim(slow(code, action))
    sim.step()
    sim.step()
    requests(sim, "a")
    answer_latest(sim, "a", passed=False, codes=(code,))
    seen = steps_until_settled(sim, 3)
    assert K.EVICT_PODS in seen and K.REPLACE not in seen
    assert sim.episodes["a"].rung is Action.RESET_GPU


def test_an_unanswered_measurement_is_asked_for_again_after_the_verify_timeout():
    sim = slow_sim(slow())
    sim.step()
    sim.step()
    requests(sim, "a")
    first = sim.nodes["a"].verify_request
    sim.now += sim.policy.verify.timeout_s + 1
    sim.step()
    requests(sim, "a")
    assert sim.nodes["a"].verify_request not in (None, first)


def test_slowness_with_other_evidence_needs_no_confirmation():
    layer = LayerReport("False", "Xid", 0.0, Action.REBOOT, ("DEEP_MATMUL_SLOW", "XID_79"), (GPU0,))
    sim = slow_sim(layer)
    assert K.CORDON in steps_until_settled(sim, 3)


def test_confirmation_off_acts_on_the_first_measurement():
    policy = Policy.model_validate(
        {"tolerance_s": 0, "min_action_interval_s": 0, "confirm": {"enabled": False}}
    )
    sim = Sim({"a": node("a")}, policy=policy)
    sim.set_gpu("a", slow())
    assert K.EVICT_PODS in steps_until_settled(sim, 3)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"positions": {"labels": [["rack", ""]]}}, "positions.labels"),
        ({"positions": {"max_replacements": -1}}, "positions.max_replacements"),
        ({"confirm": {"codes": ["slow"]}}, "confirm.codes"),
    ],
)
def test_bad_position_and_confirm_settings_are_named(data: dict[str, object], named: str):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        build_policy(data, "policy.yaml")
