"""Deferred repairs (drain and reset): the node admits no new work at once, its running
pods finish, then the repair is carried out; at the latest ``drain_and_reset.max_wait_s``
after the layer turned False. Each moment is a step of the episode."""

from __future__ import annotations

import dataclasses

import pytest

from gpuguard.contract.report import LayerReport
from gpuguard.errors import ConfigError
from gpuguard.model import Action
from gpuguard.remediation.model import Phase
from gpuguard.remediation.policy import Policy, build_policy
from gpuguard.sim.agent_view import AgentView, DeepFinding, NodeSignals
from tests.unit.remediation_builders import DISRUPTIVE, GPU0, K, Sim, bad, fleet, kinds, node

REMAP = ("ROW_REMAP_PENDING",)
POLICY = Policy(tolerance_s=0, min_action_interval_s=0, drain_and_reset={"max_wait_s": 3600})


def deferred(codes: tuple[str, ...] = REMAP, action: Action = Action.RESET_GPU) -> LayerReport:
    return dataclasses.replace(bad(action, codes, (GPU0,)), deferred=True)


def steps(sim: Sim, name: str = "n1") -> list[str]:
    return [step.message for step in sim.episodes[name].steps]


def test_running_work_finishes_first_then_the_gpu_is_reset():
    sim = Sim(fleet(node("n1", pods_on_gpus=2)), policy=POLICY)
    sim.set_gpu("n1", deferred())
    plan = sim.step()
    assert kinds(plan) == [K.RECORD, K.TAINT, K.RECORD]  # quarantined, then waiting
    assert steps(sim)[-1].startswith("deferred repair: waiting for 2 running pods on " + GPU0)
    for _ in range(5):
        assert kinds(sim.step()) == []  # the same wait: no new step, nothing disruptive
    sim.set("n1", pods_on_gpus=1)
    assert kinds(sim.step()) == [K.RECORD]
    assert "waiting for 1 running pods" in steps(sim)[-1]
    sim.set("n1", pods_on_gpus=0)
    plan = sim.step()
    assert kinds(plan) == [K.RECORD, K.EVICT_PODS]
    assert steps(sim)[-1].startswith("running work finished: starting RESET_GPU")
    assert "RESET_GPU attempt 1: draining " + GPU0 in steps(sim)[-1]
    episode = sim.episodes["n1"]
    assert (episode.phase, episode.rung, episode.gpus) == (
        Phase.DRAINING,
        Action.RESET_GPU,
        (GPU0,),
    )
    assert not any(d.kind is K.CORDON for p in sim.plans for d in p.decisions)  # a reset only


def test_work_that_never_ends_is_drained_at_max_wait():
    sim = Sim(fleet(node("n1", pods_on_gpus=1)), policy=POLICY)
    sim.set_gpu("n1", deferred())
    turned_false = sim.now
    sim.step()
    while sim.now - turned_false + 600 < 3600:
        assert not {d.kind for d in sim.step(600).decisions} & DISRUPTIVE
    plan = sim.step(600)
    assert K.EVICT_PODS in kinds(plan)
    assert steps(sim)[-1].startswith("waited max_wait_s (3600s) for 1 running pods: draining")
    assert sim.episodes["n1"].phase is Phase.DRAINING


def test_nothing_running_starts_the_repair_once_the_tolerance_passed():
    sim = Sim(fleet(node("n1")), policy=POLICY.model_copy(update={"tolerance_s": 120}))
    sim.set_gpu("n1", deferred())
    assert not {d.kind for d in sim.step(1).decisions} & DISRUPTIVE  # tolerance first
    plan = sim.step(200)
    assert K.EVICT_PODS in kinds(plan)
    assert steps(sim)[-1].startswith("running work finished: starting RESET_GPU")


def test_a_fault_that_needs_repair_now_is_not_deferred():
    # A deferred remap and an Xid 79 on the same node: the Xid decides, at once.
    sim = Sim(fleet(node("n1", pods_on_gpus=3)), policy=POLICY)
    layers = dict(sim.nodes["n1"].layers)
    layers["kernel"] = bad(Action.REBOOT, ("XID_79",), (GPU0,))
    sim.set("n1", layers=layers)
    sim.set_gpu("n1", deferred())
    plan = sim.step()
    assert K.CORDON in kinds(plan) and K.EVICT_PODS in kinds(plan)
    assert not any("deferred repair" in message for message in steps(sim))


def test_a_deferred_fault_that_clears_by_itself_closes_as_transient():
    sim = Sim(fleet(node("n1", pods_on_gpus=1)), policy=POLICY)
    sim.set_gpu("n1", deferred())
    sim.step()
    sim.heal(["n1"])
    for _ in range(4):
        sim.step()
    assert "n1" not in sim.episodes and sim.history[-1].resolution.value == "Transient"
    assert not sim.nodes["n1"].tainted


def test_policy_section_is_validated_and_defaults_to_four_hours():
    assert Policy().drain_and_reset.max_wait_s == 4 * 3600
    with pytest.raises(ConfigError, match=r"drain_and_reset\.max_wait_s"):
        build_policy({"drain_and_reset": {"max_wait_s": -1}}, "policy.yaml")
    with pytest.raises(ConfigError, match="drain_and_reset"):
        build_policy({"drain_and_reset": {"max_wait": 60}}, "policy.yaml")


def test_the_simulator_sees_a_slow_gpu_as_a_deferred_repair():
    # The simulator's agent view runs the real judge, report and projection.
    view = AgentView()
    slow = view.verdict(NodeSignals(deep=(DeepFinding("slow", 0, 0.5),))).layers["gpu"]
    assert (slow.status, slow.action, slow.deferred) == ("False", Action.RESET_GPU, True)
    corrupt = view.verdict(NodeSignals(deep=(DeepFinding("corrupt", 0),))).layers["gpu"]
    assert (corrupt.status, corrupt.deferred) == ("False", False)
