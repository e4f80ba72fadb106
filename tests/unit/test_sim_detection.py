"""Detection by load tests in the simulator: the agents' deep suite in the gpuguard run.

The fleet here fails only silently (SDC) or slowly (persistent fail-slow, with no NVML
signal), at rates far above the literature's so that a short run has enough of both, and
people never come (``manual_response_h`` beyond the run): what is found and fixed is what
the policies find and fix.
"""

from __future__ import annotations

import functools

from gpuguard.remediation.policy import Policy, build_policy
from gpuguard.sim.results import Distribution, PolicyResult
from gpuguard.sim.run import simulate
from gpuguard.sim.scenario import FaultClasses, Scenario, build_scenario, load_scenario

QUIET = {name: {"rate": 0, "fix": {"restart": 1}} for name in FaultClasses.model_fields}
VERIFY_RESETS = build_policy({"verify": {"enabled": True, "rungs": ["RESET_GPU", "REBOOT"]}}, "t")


def _scenario(
    deep: tuple[tuple[str, object], ...] = (), sdc_fails_job: bool = False, busy: float = 0.85
) -> Scenario:
    data = load_scenario().model_dump(by_alias=True)
    data.update(days=20, seed=1)
    data["jobs"]["utilisation"] = busy
    data["fleet"]["nodes"] = 64
    data["jobs"]["mix"] = [
        {"nodes": 1, "share": 0.5, "hours": [2, 24]},
        {"nodes": 8, "share": 0.5, "hours": [12, 72]},
    ]
    data["failures"].update(
        classes={**QUIET, "sdc": {"rate": 8, "fix": {"replace": 1}}},
        fail_slow_per_1000_node_days=8,
        fail_slow_persistent_share=1.0,
        benign_signals_per_node_day=0,
        lemon_share=0,
        sdc_fails_job=sdc_fails_job,
    )
    data["detection"]["manual_response_h"] = 1000
    data["deep_checks"].update({"false_positive_probability": 0, **dict(deep)})
    return build_scenario(data, "test")


@functools.cache
def _run(
    deep: tuple[tuple[str, object], ...] = (), verify: bool = False, busy: float = 0.85
) -> dict[str, PolicyResult]:
    return simulate(_scenario(deep, busy=busy), VERIFY_RESETS if verify else Policy()).results


def test_gpuguard_finds_and_removes_sdc_and_fail_slow_and_the_baselines_do_not():
    results = _run()
    gpuguard = results["gpuguard"].hidden_faults
    for cls in ("sdc", "fail_slow"):
        assert gpuguard[cls].faults > 0
        assert gpuguard[cls].found_by_checks > 0
        assert gpuguard[cls].removed > 0
        for baseline in ("none", "reactive"):
            assert results[baseline].hidden_faults[cls].found_by_checks == 0
            assert results[baseline].hidden_faults[cls].removed == 0
    assert results["gpuguard"].deep_runs["schedule"] > 0
    assert "schedule" not in results["none"].deep_runs
    # Slow nodes taken out of the pool and corrupting ones replaced: jobs run faster and
    # redo less work.
    assert results["gpuguard"].ettr > results["none"].ettr + 0.05
    assert results["gpuguard"].gpu_hours["lost_work"] < results["none"].gpu_hours["lost_work"]


def test_the_time_to_find_follows_the_schedule():
    def found(hours: float, busy: float) -> Distribution:
        deep = (("interval_h", hours),)
        return _run(deep, busy=busy)["gpuguard"].hidden_faults["fail_slow"].time_to_find_h

    # A mostly idle fleet: the run comes when it is due, within about an interval.
    assert 0 < found(24, 0.3).p50 <= 24
    assert found(2, 0.3).count > 0 and found(2, 0.3).p50 <= 2
    # A busy one: a run waits for the node to be idle between jobs.
    assert found(2, 0.85).p50 > found(2, 0.3).p50


def test_without_the_deep_schedule_gpuguard_misses_them_too():
    results = _run((("interval_h", None),))
    gpuguard, none = results["gpuguard"], results["none"]
    for cls in ("sdc", "fail_slow"):
        assert gpuguard.hidden_faults[cls].found_by_checks == 0
        assert gpuguard.hidden_faults[cls].removed == 0
    assert gpuguard.deep_runs == {}
    assert gpuguard.ettr == none.ettr  # nothing else fails here: the same run as no policy
    assert gpuguard.ettr < _run()["gpuguard"].ettr


def test_the_verify_gate_catches_a_repair_that_did_not_fix_the_fault():
    plain = _run()["gpuguard"]
    gated = _run(verify=True)["gpuguard"]
    assert "verify" not in plain.deep_runs
    assert gated.deep_runs["verify"] > 0
    assert gated.deep_runs["verify_failed"] > 0  # a reset does not fix a replace-class fault
    # The failed verify climbs the ladder at once; without it the node returns to service
    # still faulty and waits for the next scheduled run to be found again.
    assert plain.actions.get("reboot", 0) == 0 < gated.actions["reboot"]
    assert gated.mttr_hours != plain.mttr_hours
    slow_plain = plain.hidden_faults["fail_slow"].time_to_remove_h
    slow_gated = gated.hidden_faults["fail_slow"].time_to_remove_h
    assert slow_gated.p50 < slow_plain.p50


def test_sdc_fails_the_job_where_the_scenario_says_so():
    rolled_back = _run()["none"]
    failing = simulate(_scenario(sdc_fails_job=True), policies=("none",)).results["none"]
    assert "silent data corruption" not in rolled_back.job_failures
    assert failing.job_failures["silent data corruption"] > 0
    assert rolled_back.hidden_faults["sdc"].found_by_jobs > 0


def test_deep_false_positives_drain_healthy_nodes_and_the_runs_cost_service_time():
    data = _scenario().model_dump(by_alias=True)
    data["failures"].update(classes=QUIET, fail_slow_per_1000_node_days=0)
    data["deep_checks"]["false_positive_probability"] = 0.05
    noisy = simulate(build_scenario(data, "test"), policies=("gpuguard",)).results["gpuguard"]
    data["deep_checks"]["false_positive_probability"] = 0
    clean = simulate(build_scenario(data, "test"), policies=("gpuguard",)).results["gpuguard"]
    data["deep_checks"]["interval_h"] = None
    never = simulate(build_scenario(data, "test"), policies=("gpuguard",)).results["gpuguard"]
    assert noisy.false_drains_per_node_day > 0 and noisy.actions.get("reset", 0) > 0
    assert clean.false_drains_per_node_day == 0 and clean.actions == {}
    # Each run holds an idle node out of service for its duration.
    assert never.slot_availability == 1.0
    assert clean.slot_availability < 1.0
