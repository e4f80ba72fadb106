"""Failed preflights: remembered once per ending, standing until a repair, a passing deep
verify or the window, and the layer decide reads (remediation/preflight_memory.py)."""

from __future__ import annotations

import dataclasses

import pytest

from gpuguard.contract.preflight import PREFLIGHT_FAILED, PREFLIGHT_LAYER
from gpuguard.contract.verify import VerifyAnswer, request_id
from gpuguard.errors import ConfigError
from gpuguard.model import Action
from gpuguard.remediation.model import Phase
from gpuguard.remediation.policy import Policy, build_policy
from gpuguard.remediation.preflight_memory import (
    KEPT_PER_NODE,
    PreflightFailure,
    PreflightMemory,
    preflight_layer,
    spent_after,
)
from tests.unit.remediation_builders import GPU0, T0, K, Sim, episode, kinds, node

DESTRUCTIVE = {K.EVICT_PODS, K.REQUEST_ACTION, K.CORDON, K.REPLACE, K.KILL_PODS}
WINDOW = Policy().preflight.window_s


def failure(
    at: float = T0,
    *,
    node_: str = "a",
    key: str = "",
    codes: tuple[str, ...] = ("DEEP_SILENT_DATA_CORRUPTION",),
    gpus: tuple[str, ...] = (GPU0,),
    slow_link: bool = False,
) -> PreflightFailure:
    return PreflightFailure(node_, "ns/p", key or f"uid@{at}", at, codes, gpus, slow_link)


def test_a_failure_is_remembered_once_and_one_older_than_the_window_not_at_all():
    memory = PreflightMemory(Policy())
    assert memory.record(failure(), T0)
    assert not memory.record(failure(), T0 + 5)  # the same ending, seen again
    assert memory.record(failure(node_="b"), T0)  # a gang result names several nodes
    assert not memory.record(failure(T0 - WINDOW), T0)  # a new leader lists old pods
    assert memory.standing("a", T0 + WINDOW - 1) == [failure()]
    assert memory.standing("a", T0 + WINDOW) == []


def test_a_pod_failing_in_a_loop_keeps_its_first_failure_and_the_latest():
    memory = PreflightMemory(Policy())
    for i in range(KEPT_PER_NODE + 10):
        memory.record(failure(T0 + i), T0 + i)
    standing = memory.standing("a", T0 + 100)
    assert len(standing) == KEPT_PER_NODE
    assert standing[0].at == T0 and standing[-1].at == T0 + KEPT_PER_NODE + 9


def test_a_repair_or_a_passing_deep_verify_after_the_failure_spends_it():
    memory = PreflightMemory(Policy())
    memory.record(failure(T0), T0)
    memory.record(failure(T0 + 100), T0 + 100)
    draining = episode("a", Phase.DRAINING, Action.REBOOT, last_action_at=T0 + 50)
    assert spent_after("a", None, [draining]) is None  # not acted on yet
    verifying = dataclasses.replace(draining, phase=Phase.VERIFYING)
    assert spent_after("a", None, [verifying]) == T0 + 50
    killed = dataclasses.replace(verifying, rung=Action.KILL_JOB, last_action_at=T0 + 90)
    assert spent_after("a", None, [killed]) is None  # killing a job mends no machine
    assert spent_after("b", None, [verifying]) is None
    assert memory.spend("a", T0 + 50)
    assert [f.at for f in memory.standing("a", T0 + 100)] == [T0 + 100]  # failed again since
    passed = VerifyAnswer(request_id(T0 + 200), True, ())
    failed = VerifyAnswer(request_id(T0 + 300), False, ("DEEP_MATMUL_SLOW",))
    assert spent_after("a", failed, []) is None
    assert spent_after("a", passed, [verifying]) == pytest.approx(T0 + 200)
    assert memory.spend("a", T0 + 200) and memory.standing("a", T0 + 200) == []


def test_the_layer_asks_for_a_reset_of_the_gpus_named_a_reboot_otherwise_nothing_for_a_link():
    name, layer = preflight_layer([failure(T0 + 5), failure(T0, codes=("DEEP_MATMUL_SLOW",))])
    assert name == PREFLIGHT_LAYER and layer.status == "False" and layer.since == T0
    assert layer.codes == ("DEEP_MATMUL_SLOW", "DEEP_SILENT_DATA_CORRUPTION")
    assert (layer.action, layer.gpus) == (Action.RESET_GPU, (GPU0,))
    _, whole = preflight_layer([failure(codes=(PREFLIGHT_FAILED,), gpus=())])
    assert (whole.action, whole.gpus) == (Action.REBOOT, ())
    _, link = preflight_layer([failure(codes=("DEEP_ALL_REDUCE_SLOW",), gpus=(), slow_link=True)])
    assert link.action is Action.NONE
    assert preflight_layer([]) is None


@pytest.mark.parametrize("window", [0, -1])
def test_a_bad_window_is_named(window: float):
    with pytest.raises(ConfigError, match=r"preflight\.window_s"):
        build_policy({"preflight": {"window_s": window}}, "policy.yaml")


# -- what decide does with the layer ---------------------------------------------------


def preflight_sim(*failures: PreflightFailure) -> Sim:
    policy = Policy.model_validate({"tolerance_s": 0, "min_action_interval_s": 0})
    sim = Sim({"a": node("a")}, policy=policy)
    found = preflight_layer(failures)
    assert found is not None
    layers = {**sim.nodes["a"].layers, found[0]: dataclasses.replace(found[1], since=sim.now)}
    sim.set("a", layers=layers)
    return sim


def test_no_verdict_quarantines_and_asks_the_deep_suite_before_any_repair():
    sim = preflight_sim(failure(codes=(PREFLIGHT_FAILED,), gpus=()))
    seen = [kind for _ in range(3) for kind in kinds(sim.step())]
    assert K.TAINT in seen and K.REQUEST_VERIFY in seen
    assert not DESTRUCTIVE & set(seen)


def test_a_verdict_on_a_gpu_resets_that_gpu():
    sim = preflight_sim(failure())
    seen = [kind for _ in range(3) for kind in kinds(sim.step())]
    assert K.TAINT in seen and K.EVICT_PODS in seen
    assert sim.episodes["a"].rung is Action.RESET_GPU and sim.episodes["a"].gpus == (GPU0,)


def test_a_slow_link_is_quarantined_and_never_repaired_by_a_rung():
    sim = preflight_sim(failure(codes=("DEEP_ALL_REDUCE_SLOW",), gpus=(), slow_link=True))
    seen = [kind for _ in range(4) for kind in kinds(sim.step())]
    assert K.TAINT in seen and not DESTRUCTIVE & set(seen)
    assert sim.nodes["a"].tainted
