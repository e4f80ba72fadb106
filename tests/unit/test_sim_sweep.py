"""Figures over seeds: intervals, verdicts on targets, and a fleet in steady state."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from gpuguard.sim.fault_stream import generate_faults, replacement_rate
from gpuguard.sim.scenario import FaultClasses, build_scenario, load_scenario
from gpuguard.sim.sweep import Interval, t95


def test_the_interval_is_student_t_on_the_seeds():
    values = [0.9990, 0.9994, 0.9997, 0.9993]
    interval = Interval.of(values)
    half = 3.182 * statistics.stdev(values) / 2
    assert interval.mean == pytest.approx(statistics.fmean(values))
    assert (interval.low, interval.high) == pytest.approx(
        (interval.mean - half, interval.mean + half)
    )
    assert t95(60) == pytest.approx(2.000, abs=0.001) and t95(200) == pytest.approx(
        1.972, abs=0.001
    )


def test_a_target_is_met_only_when_the_whole_interval_clears_it():
    assert Interval.of([0.99965, 0.9997, 0.99975]).verdict(0.9995) == "met"
    assert Interval.of([0.9990, 0.9991, 0.9992]).verdict(0.9995) == "MISSED"
    assert Interval.of([0.9990, 0.9999, 0.9996]).verdict(0.9995) == "not settled"
    assert Interval.of([0.9999]).verdict(0.9995) == "not settled"  # one seed says nothing
    assert Interval.of([0.99, 1.0, 1.0]).high == 1.0  # a share stays a share


def test_the_fleet_starts_with_hidden_faults_at_their_steady_state_prevalence():
    quiet = {name: {"rate": 0, "fix": {"restart": 1}} for name in FaultClasses.model_fields}
    data = load_scenario().model_dump(by_alias=True)
    data["fleet"].update(nodes=20_000, age_days=400)
    data.update(days=1, warmup_days=0)
    # Only replacements and the two hidden kinds: 2 per 1,000 node-days need new hardware.
    data["failures"]["classes"] = {
        **quiet,
        "gpu": {"rate": 2, "fix": {"replace": 1}},
        "sdc": {"rate": 0.5, "fix": {"replace": 1}},
    }
    data["failures"].update(fail_slow_per_1000_node_days=4, fail_slow_persistent_share=0.5)
    scenario = build_scenario(data, "test")
    faults = generate_faults(scenario, np.random.default_rng(3))
    at_start = [f for f in faults if f.start == 0.0]
    rate = replacement_rate(scenario.failures)
    assert rate == pytest.approx(2.5e-3)
    dwell = (1 - math.exp(-400 * rate)) / rate  # min(age, time to the next replacement)
    for cls, onset in (("fail_slow", 2.0e-3), ("sdc", 0.5e-3)):
        expected = onset * dwell * 20_000
        count = sum(f.cls == cls for f in at_start)
        assert count == pytest.approx(expected, rel=4 / math.sqrt(expected)), cls
    assert all(f.end is None for f in at_start)  # they last until repaired
    data["fleet"]["age_days"] = 0
    fresh = generate_faults(build_scenario(data, "test"), np.random.default_rng(3))
    assert not [f for f in fresh if f.start == 0.0 and f.cls in ("sdc", "fail_slow")]
