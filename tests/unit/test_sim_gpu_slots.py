"""GPU-slot accounting, per-GPU quarantine and the preflight gate in the simulator."""

from __future__ import annotations

import pytest

from gpuguard.errors import ConfigError
from gpuguard.remediation.policy import Policy
from gpuguard.sim.accounting import ServiceBooks, Stats
from gpuguard.sim.agent_view import AgentView
from gpuguard.sim.engine import Engine
from gpuguard.sim.faults import Effect, Fault, Fix, Signal
from gpuguard.sim.gpu_slots import fits, gpus_in_service, pick_partial
from gpuguard.sim.gpuguard_policy import GpuguardPolicy
from gpuguard.sim.jobs import Job, JobState
from gpuguard.sim.policies import NoPolicy
from gpuguard.sim.run import simulate
from gpuguard.sim.scenario import Scenario, build_scenario, load_scenario
from gpuguard.sim.slot import Slot


def _fault(cls: str, gpu: int, *, signal: Signal = Signal.XID_48, start: float = 0.0) -> Fault:
    return Fault(0, 0, cls, start, Fix.RESET, Effect.CRASH, signal, gpu, None, 1.0, False, 0.99)


def test_a_node_with_one_gpu_out_serves_a_7_gpu_job_but_not_an_8_gpu_one():
    slot = Slot(0, "pool-0", machine=0)
    slot.gpus_out = {3}
    slot.faults = {0: _fault("hbm", 3)}
    assert fits(7, slot) and not fits(8, slot)
    assert gpus_in_service(slot, schedulable=True, up=False) == 7
    assert pick_partial([0], [slot], 7) == 0
    assert pick_partial([0], [slot], 8) is None
    slot.faults = {0: _fault("nic", 3)}  # a node-wide fault: none of its GPUs serve
    assert gpus_in_service(slot, schedulable=True, up=False) == 0
    assert gpus_in_service(slot, schedulable=False, up=False) == 0


def test_the_scheduler_places_a_7_gpu_job_on_a_node_with_one_gpu_out_and_not_an_8_gpu_one():
    scenario = _one_node().with_section("preflight", enabled=False)
    whole = Job(id=0, nodes=1, work_h=100.0, arrival=10.0)
    seven = Job(id=1, nodes=1, work_h=100.0, arrival=20.0, gpus=7)
    engine = Engine(scenario, [], [whole, seven], NoPolicy(), AgentView(), seed=1)
    slot = engine.slots[0]
    slot.gpus_out = {3}  # a device taint on GPU 3 from the start
    engine.fleet.refresh(slot)
    engine.run()
    assert seven.state is JobState.RUNNING and seven.slots == [0]
    assert whole.state is JobState.QUEUED
    # The node took no whole-node job all day; 7 of its 8 GPUs served all day.
    assert engine.slot_share.share == 0.0
    assert engine.books.gpu_share.share == pytest.approx(7 / 8)


def test_gpu_slot_availability_is_gpu_seconds_in_service_over_all():
    books = ServiceBooks(Stats(), slots=2, horizon=100.0)
    books.service_changed(0.0, nodes=2, gpus=16)
    books.service_changed(50.0, nodes=-1, gpus=-1)  # one GPU out alone for the second half
    books.account(100.0)
    assert books.gpu_share.share == pytest.approx((16 * 50 + 15 * 50) / (16 * 100))
    assert books.slot_share.share == pytest.approx((2 * 50 + 1 * 50) / (2 * 100))


def _scenario(classes: dict[str, object], seed: int = 1, **sections: dict[str, object]) -> Scenario:
    data = (
        load_scenario().with_overrides(nodes=32, days=60, warmup_days=5).model_dump(by_alias=True)
    )
    data["seed"] = seed
    data["failures"]["rate_multiplier"] = 1.0
    none = {"rate": 0.0, "fix": {"restart": 1.0}}
    data["failures"]["classes"] = {name: none for name in data["failures"]["classes"]} | classes
    data["failures"]["fail_slow_per_1000_node_days"] = 0.0
    data["failures"]["benign_signals_per_node_day"] = 0.0
    for section, keys in sections.items():
        data[section].update(keys)
    return build_scenario(data, origin="test")


GPU_LOCAL = {
    "hbm": {"rate": 20.0, "fix": {"reset": 1.0}},
    "gpu": {"rate": 5.0, "fix": {"reboot": 1.0}},
}


def test_per_gpu_quarantine_raises_gpu_slot_availability_on_every_seed():
    for seed in range(1, 11):
        off = simulate(_scenario(GPU_LOCAL, seed), policies=("gpuguard",)).results["gpuguard"]
        on_scenario = _scenario(GPU_LOCAL, seed, gpu_quarantine={"enabled": True})
        on = simulate(on_scenario, policies=("gpuguard",)).results["gpuguard"]
        assert on.gpu is not None and on.gpu.gpus_quarantined > 0
        assert on.gpu_slot_availability > off.gpu_slot_availability, seed
        # Without it a node is all in or all out: the two figures are one.
        assert off.gpu_slot_availability == pytest.approx(off.slot_availability)


def test_node_wide_faults_still_take_the_node():
    # Adapters failing, and no false finding naming a GPU (a deep run's, a job's).
    node_wide = {"nic": {"rate": 20.0, "fix": {"reboot": 1.0}}}
    quiet = {
        "deep_checks": {"false_positive_probability": 0.0},
        "in_job": {"false_verdicts_per_node_day": 0.0},
    }
    off = simulate(_scenario(node_wide, **quiet), policies=("gpuguard",)).results["gpuguard"]
    on_scenario = _scenario(node_wide, gpu_quarantine={"enabled": True}, **quiet)
    on = simulate(on_scenario, policies=("gpuguard",)).results["gpuguard"]
    assert on.gpu is not None and on.gpu.gpus_quarantined == 0
    assert on.gpu_slot_availability == off.gpu_slot_availability
    assert on.slot_availability == off.slot_availability < 1.0


def _one_node(**preflight: object) -> Scenario:
    data = _scenario({}).model_dump(by_alias=True)
    data["fleet"] |= {"nodes": 1, "spare_nodes": 0, "spares_per_pool": 0, "age_days": 0.0}
    data["jobs"]["mix"] = [{"nodes": 1, "share": 1.0, "hours": [1.0, 1.0]}]
    data["preflight"] |= {"enabled": True, **preflight}
    data["detection"]["check_interval_s"] = 3600.0  # the health polls hourly
    data["warmup_days"], data["days"] = 0.0, 1.0
    return build_scenario(data, origin="test")


def _run(scenario: Scenario, faults: list[Fault]) -> Engine:
    jobs = [Job(id=0, nodes=1, work_h=1.0, arrival=600.0)]
    engine = Engine(scenario, faults, jobs, GpuguardPolicy(Policy()), AgentView(), seed=1)
    engine.run()
    return engine


def test_the_gate_catches_a_fault_present_at_the_start_that_no_poll_has_read():
    # A port down at t=300 s, read by the agent's hourly poll only ~0.99 of an hour
    # later; the job is placed at 600 s, before that.
    port = _fault("nic", 0, signal=Signal.PORT_DOWN, start=300.0)
    scenario = _one_node(false_failure=0.0, catch={"nic": 1.0})
    assert 300.0 + 0.99 * scenario.detection.check_interval_s > 600.0 + scenario.preflight.cost_s
    engine = _run(scenario, [port])
    stats = engine.stats
    assert stats.preflight_caught == {"nic": 1} and stats.preflight_blocked >= 1
    assert stats.fault_times[0].detected == pytest.approx(600.0 + scenario.preflight.cost_s)
    assert engine.jobs[0].interruptions >= 1 and engine.jobs[0].retries == 0  # not charged


def test_the_gates_false_failures_cost_what_the_inputs_say():
    scenario = _one_node(false_failure=1.0, cost_s=90.0)
    stats = _run(scenario, []).stats
    assert stats.preflight_checks > 0
    assert stats.preflight_false == stats.preflight_checks == stats.preflight_blocked
    assert stats.preflight_node_s == pytest.approx(90.0 * stats.preflight_checks)


def test_an_unknown_fault_class_in_the_gates_catch_is_a_one_line_error():
    data = load_scenario().model_dump(by_alias=True)
    data["preflight"]["catch"] = {"gpus": 1.0}
    with pytest.raises(ConfigError) as caught:
        build_scenario(data, origin="my.yaml")
    message = str(caught.value)
    assert "preflight.catch" in message and "'gpus'" in message and "\n" not in message
