"""Crash memory: unexplained crashes of different jobs make a node suspect, the first
suspicion quarantines and measures, a repeat replaces (remediation/crash_memory.py)."""

from __future__ import annotations

import dataclasses

import pytest

from gpuguard.contract.verify import VerifyAnswer
from gpuguard.errors import ConfigError
from gpuguard.model import Action
from gpuguard.remediation.crash_memory import (
    CRASH_LAYER,
    CRASHES_ACROSS_JOBS,
    CRASHES_REPEATED,
    Crash,
    CrashMemory,
    Suspicion,
    crash_layer,
)
from gpuguard.remediation.policy import Policy, build_policy
from tests.unit.remediation_builders import T0, K, Sim, kinds, node

HOUR = 3600.0
DESTRUCTIVE = {K.EVICT_PODS, K.REQUEST_ACTION, K.CORDON, K.REPLACE, K.KILL_PODS}


def crashes(memory: CrashMemory, node_: str, jobs: list[str], start: float = T0) -> list:
    return [memory.record(Crash(node_, job, start + i * 60)) for i, job in enumerate(jobs)]


def test_three_different_jobs_make_a_node_suspect_and_one_job_never_does():
    memory = CrashMemory(Policy())
    assert crashes(memory, "a", ["ns/j1"] * 10) == [None] * 10  # one job's own bug
    raised = crashes(memory, "a", ["ns/j2", "ns/j3"], start=T0 + HOUR)
    assert raised[0] is None
    suspicion = raised[1]
    assert isinstance(suspicion, Suspicion)
    assert suspicion.jobs == ("ns/j1", "ns/j2", "ns/j3") and suspicion.code == CRASHES_ACROSS_JOBS
    assert memory.crashes("a", T0 + HOUR) == []  # spent with the suspicion
    assert crashes(memory, "b", ["ns/j1", "ns/j2"]) == [None, None]  # other nodes apart


def test_crashes_older_than_the_window_are_forgotten():
    memory = CrashMemory(Policy())
    window = Policy().crashes.window_s
    memory.record(Crash("a", "ns/j1", T0))
    memory.record(Crash("a", "ns/j2", T0 + 60))
    assert memory.record(Crash("a", "ns/j3", T0 + window + 1)) is None
    assert {c.job for c in memory.crashes("a", T0 + window + 1)} == {"ns/j2", "ns/j3"}


def test_a_suspicion_stands_for_the_window_and_a_second_one_within_the_lemon_window_repeats():
    policy = Policy()
    memory = CrashMemory(policy)
    first = crashes(memory, "a", ["j1", "j2", "j3"])[-1]
    assert first is not None
    assert memory.suspicion("a", first.at + policy.crashes.window_s - 1) == first
    assert memory.suspicion("a", first.at + policy.crashes.window_s) is None
    again = crashes(memory, "a", ["j4", "j5", "j6"], start=first.at + 2 * policy.crashes.window_s)
    assert again[-1] is not None and again[-1].repeats == 2
    assert again[-1].code == CRASHES_REPEATED
    later = first.at + policy.lemon_window_s + 10 * policy.crashes.window_s
    third = crashes(memory, "a", ["j7", "j8", "j9"], start=later)[-1]
    assert third is not None and third.repeats == 1  # the earlier ones left the lemon window


def test_a_replaced_machine_starts_with_a_clean_record():
    memory = CrashMemory(Policy())
    crashes(memory, "a", ["j1", "j2"])
    memory.clear("a")
    assert memory.record(Crash("a", "j3", T0 + 300)) is None


def test_disabled_crash_memory_never_suspects():
    memory = CrashMemory(Policy.model_validate({"crashes": {"enabled": False}}))
    assert crashes(memory, "a", ["j1", "j2", "j3", "j4"]) == [None] * 4


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"crashes": {"jobs": 1}}, "crashes.jobs"),
        ({"crashes": {"window_s": 0}}, "crashes.window_s"),
    ],
)
def test_bad_crash_settings_are_named(data: dict[str, object], named: str):
    with pytest.raises(ConfigError, match=named):
        build_policy(data, "policy.yaml")


# -- what decide does with a suspicion -------------------------------------------------


def suspect_sim(repeats: int) -> Sim:
    policy = Policy.model_validate({"tolerance_s": 0, "min_action_interval_s": 0})
    sim = Sim({"a": node("a")}, policy=policy)
    name, layer = crash_layer(Suspicion("a", ("j1", "j2", "j3"), sim.now, repeats))
    layers = {**sim.nodes["a"].layers, name: dataclasses.replace(layer, since=sim.now)}
    sim.set("a", layers=layers)
    return sim


def test_a_first_suspicion_quarantines_and_asks_for_a_second_measurement_before_any_repair():
    sim = suspect_sim(repeats=1)
    seen = [kind for _ in range(3) for kind in kinds(sim.step())]
    assert K.TAINT in seen and K.REQUEST_VERIFY in seen
    assert not DESTRUCTIVE & set(seen)
    request = next(d.request for d in sim.plans[-3].decisions if d.kind is K.REQUEST_VERIFY)
    sim.set("a", verify_request=request, verify=VerifyAnswer(request, True, ()))
    seen = [kind for _ in range(5) for kind in kinds(sim.step())]
    assert not DESTRUCTIVE & set(seen)  # the suite passed: quarantined, never destroyed
    assert sim.nodes["a"].tainted


def test_a_repeat_offender_is_replaced_through_the_ladder():
    sim = suspect_sim(repeats=2)
    seen = [kind for _ in range(6) for kind in kinds(sim.step())]
    assert K.CORDON in seen and K.REPLACE in seen
    assert K.REQUEST_VERIFY not in seen  # a repeat is its own second measurement


def test_the_layer_names_the_code_and_the_rung():
    name, layer = crash_layer(Suspicion("a", ("j1", "j2", "j3"), T0, 1))
    assert name == CRASH_LAYER and layer.status == "False"
    assert layer.codes == (CRASHES_ACROSS_JOBS,) and layer.action is Action.REBOOT
