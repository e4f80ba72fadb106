"""The warm-up: days the simulator runs first and leaves out of every figure, so a report
describes the fleet in steady state rather than the state it was started in."""

from __future__ import annotations

import numpy as np
import pytest

from gpuguard.sim.fault_stream import generate_faults
from gpuguard.sim.faults import DAY, HOUR, Fault
from gpuguard.sim.jobs import Job, JobState
from gpuguard.sim.report import span_text
from gpuguard.sim.run import replay_scenario
from gpuguard.sim.scenario import Scenario, build_scenario, load_scenario
from gpuguard.sim.summary import summarise
from gpuguard.sim.trace import Trace
from tests.unit.test_sim_jobs import DEAD_GPU, _fault, _run

WARMUP_DAYS = 2.0


def _scenario(nodes: int = 2, days: float = 3.0) -> Scenario:
    data = load_scenario().model_dump(by_alias=True)
    data.update(days=days, warmup_days=WARMUP_DAYS)
    data["fleet"].update(nodes=nodes, spare_nodes=0, pools=1, age_days=0)
    data["jobs"]["mix"] = [{"nodes": 1, "share": 1.0, "hours": [1, 1]}]
    return build_scenario(data, "test")


def _dead_gpu(slot: int, start: float) -> Fault:
    return _fault(slot, start, *DEAD_GPU)


def test_the_run_lasts_the_warm_up_and_the_measured_days():
    scenario = _scenario()
    assert scenario.span_days == WARMUP_DAYS + 3.0
    engine = _run(scenario, [], [])
    assert engine.horizon == pytest.approx(scenario.span_days * DAY)
    assert engine.warmup == pytest.approx(WARMUP_DAYS * DAY)


def test_a_fault_of_the_warm_up_counts_nowhere_and_one_after_it_counts():
    scenario = _scenario()
    # Slot 0's GPU dies on day 1 (warm-up) and is replaced by a person within hours;
    # slot 1's on day 3 (measured).
    early, late = _dead_gpu(0, 1 * DAY), _dead_gpu(1, 3 * DAY)
    engine = _run(scenario, [early, late], [])
    assert engine.stats.actions["manual_replace"] == 2  # both happened
    result = summarise(engine)
    assert result.faults == 1
    assert result.actions == {"manual_replace": 1}
    assert len(result.time_to_repair_h.values) == 1
    # Out of service only for the late fault's repair, over the 3 measured days.
    out_h = result.time_to_repair_h.values[0]
    assert 0 < out_h < 24
    expected = 1 - out_h / (2 * 3 * 24)
    assert result.slot_availability == pytest.approx(expected, rel=1e-3)
    assert len(result.availability_by_day) == 3
    assert result.availability_by_day[0] == pytest.approx(1.0)


def test_jobs_of_the_warm_up_count_for_the_work_they_do_after_it_not_for_success():
    scenario = _scenario(nodes=1)
    # A 48-hour job from 12 h before the warm-up ends: half its work in each part.
    across = Job(id=0, nodes=1, work_h=48.0, arrival=WARMUP_DAYS * DAY - 12 * HOUR)
    later = Job(id=1, nodes=1, work_h=6.0, arrival=WARMUP_DAYS * DAY + 40 * HOUR)
    engine = _run(scenario, [], [across, later])
    assert across.state is JobState.SUCCEEDED and later.state is JobState.SUCCEEDED
    result = summarise(engine)
    assert result.jobs == {"succeeded": 1, "failed": 0, "unfinished": 0}
    # Work after the warm-up: 36 of the long job's hours (minus checkpoint saves) and 6.
    useful_node_h = result.gpu_hours["useful"] / 8
    assert useful_node_h == pytest.approx(36.0 + 6.0, rel=0.01)
    assert result.goodput == pytest.approx(useful_node_h / (3 * 24))


def test_a_trace_replay_measures_every_recorded_day():
    trace = Trace(name="t", records=(), nodes=400, days=10.0)
    assert replay_scenario(load_scenario(), trace).warmup_days == 0


def test_the_report_says_what_it_left_out():
    assert span_text(_scenario()) == "3 days measured after a 2-day warm-up (left out)"
    assert span_text(_scenario().with_overrides(warmup_days=0.0)) == "3 days"


def test_the_warm_up_and_the_measured_days_both_have_faults_at_the_scenario_s_rate():
    data = load_scenario().model_dump(by_alias=True)
    data.update(days=30, warmup_days=60)
    data["fleet"]["nodes"] = 2000
    scenario = build_scenario(data, "test")
    classes = scenario.failures.classes
    node_classes = [c for c in type(classes).model_fields if c != "fabric"]  # racks apart
    per_node_day = sum(getattr(classes, c).rate for c in node_classes) / 1000.0
    faults = [
        f for f in generate_faults(scenario, np.random.default_rng(3)) if f.cls in node_classes
    ]
    warmup = scenario.warmup_days * DAY
    measured = sum(1 for f in faults if f.start >= warmup)
    during = sum(1 for f in faults if 0 < f.start < warmup)  # t = 0: what age left there
    # About 208 and 417 expected: Poisson counts within 25 % (3.5 standard deviations).
    assert measured == pytest.approx(per_node_day * 2000 * 30, rel=0.25)
    assert during == pytest.approx(per_node_day * 2000 * 60, rel=0.25)


def test_a_job_running_at_the_end_counts_its_hours_once():
    scenario = _scenario(nodes=1)
    endless = Job(id=0, nodes=1, work_h=10_000.0, arrival=WARMUP_DAYS * DAY - 12 * HOUR)
    engine = _run(scenario, [], [endless])
    assert endless.state is JobState.RUNNING
    ((_, books),) = engine.measured_books()
    assert books.running == pytest.approx(3 * 24)  # the measured days, not more
    result = summarise(engine)
    assert result.gpu_hours["idle"] == pytest.approx(0.0, abs=1e-6)
