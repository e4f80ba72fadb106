"""Detection by load tests in the simulator: the agents' deep suite in the gpuguard run.

The fleet here fails only silently (SDC) or slowly (persistent fail-slow, with no NVML
signal), at rates far above the literature's so that a short run has enough of both, and
people never come (``manual_response_h`` beyond the run): what is found and fixed is what
the policies find and fix. Half its slots are asked for, so nodes have the idle gaps a
scheduled run waits for (``min_idle_s``); what a busier fleet does to that is tested below.
"""

from __future__ import annotations

import functools

import pytest

from gpuguard.remediation.policy import Policy, build_policy
from gpuguard.sim.agent_view import AgentView
from gpuguard.sim.deep_suite import DeepSuite
from gpuguard.sim.engine import Engine, Slot
from gpuguard.sim.faults import HOUR
from gpuguard.sim.jobs import Job, JobState
from gpuguard.sim.policies import NoPolicy
from gpuguard.sim.results import Distribution, PolicyResult
from gpuguard.sim.run import simulate
from gpuguard.sim.scenario import FaultClasses, Scenario, build_scenario, load_scenario

QUIET = {name: {"rate": 0, "fix": {"restart": 1}} for name in FaultClasses.model_fields}
VERIFY_RESETS = build_policy({"verify": {"enabled": True, "rungs": ["RESET_GPU", "REBOOT"]}}, "t")
# Acting on the first measurement, as before slowness was confirmed: where a test is about
# the schedule or the gate alone, the confirmations' own runs and verifies stay out of it.
UNCONFIRMED = build_policy({"confirm": {"enabled": False}}, "t")


def _scenario(
    deep: tuple[tuple[str, object], ...] = (), sdc_fails_job: bool = False, busy: float = 0.5
) -> Scenario:
    data = load_scenario().model_dump(by_alias=True)
    data.update(days=20, warmup_days=0, seed=1)
    data["jobs"]["utilisation"] = busy
    data["fleet"]["nodes"] = 64
    # A new fleet: at these rates a year in service would leave two hidden faults per node.
    data["fleet"]["age_days"] = 0
    data["fleet"]["spares_per_pool"] = 0  # every policy places the jobs alike
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
    data["in_job"]["enabled"] = False  # the deep suite alone: test_sim_in_job.py has the rest
    return build_scenario(data, "test")


@functools.cache
def _run(
    deep: tuple[tuple[str, object], ...] = (),
    verify: bool = False,
    busy: float = 0.5,
    confirm: bool = True,
) -> dict[str, PolicyResult]:
    chosen = (VERIFY_RESETS if verify else Policy()) if confirm else UNCONFIRMED
    return simulate(_scenario(deep, busy=busy), chosen).results


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
    assert results["gpuguard"].effective > results["none"].effective + 0.05
    assert results["gpuguard"].gpu_hours["lost_work"] < results["none"].gpu_hours["lost_work"]


def test_the_time_to_find_follows_the_schedule():
    def found(hours: float, busy: float) -> Distribution:
        deep = (("interval_h", hours),)
        found = _run(deep, busy=busy, confirm=False)["gpuguard"].hidden_faults["fail_slow"]
        return found.time_to_find_h

    # A mostly idle fleet: the run comes when it is due, within about an interval.
    assert 0 < found(24, 0.3).p50 <= 24
    # A shorter interval finds sooner, though not within it: the node stays schedulable
    # during a run, a job may land on it, and the next run waits for that job to end.
    assert found(2, 0.3).count > 0 and found(2, 0.3).p50 < found(24, 0.3).p50
    # A busy fleet: a run waits for the node to be idle between jobs.
    assert found(2, 0.85).p50 > found(2, 0.3).p50


def test_on_a_fleet_whose_free_nodes_are_soon_taken_min_idle_costs_runs_and_finds():
    def gpuguard(min_idle_s: float) -> PolicyResult:
        return _run((("min_idle_s", min_idle_s),), busy=0.85)["gpuguard"]

    # A queue waits for every node that frees up: few stay idle for 15 minutes.
    eager, patient = gpuguard(0), gpuguard(900)
    assert patient.deep_runs["schedule"] < eager.deep_runs["schedule"] / 2
    for cls in ("sdc", "fail_slow"):
        found = patient.hidden_faults[cls].found_by_checks
        assert found < eager.hidden_faults[cls].found_by_checks
    # What it buys: fewer jobs placed on a node mid-run.
    assert patient.gpu_hours["deep_run_wait"] < eager.gpu_hours["deep_run_wait"]


class RecordedSuite(DeepSuite):
    """The deep suite, noting when each run starts."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine, lambda slot: None)
        self.starts: list[float] = []

    def _start(self, slot: Slot, stamp: float | None) -> None:
        self.starts.append(self.engine.now)
        super()._start(slot, stamp)


def _one_node_runs(min_idle_s: float, gap_s: float) -> tuple[list[float], float]:
    """One node, due for a run every hour, whose first job ends and whose next comes
    ``gap_s`` later: when its scheduled runs start, and how long a job holds it."""
    data = load_scenario().model_dump(by_alias=True)
    data["fleet"].update(nodes=1, pools=1)
    data["jobs"]["mix"] = [{"nodes": 1, "share": 1, "hours": [2, 2]}]
    data["deep_checks"].update(interval_h=1, min_idle_s=min_idle_s)
    scenario = build_scenario(data, "test")
    first = Job(id=0, nodes=1, work_h=2.0, arrival=0.0)
    engine = Engine(scenario, [], [first], NoPolicy(), AgentView(), seed=1)
    job_s = scenario.jobs.restart_overhead_min * 60 + 2 * HOUR / engine.speed_factor
    engine.jobs.append(Job(id=1, nodes=1, work_h=2.0, arrival=job_s + gap_s))
    engine.horizon = 2 * job_s + gap_s + 4 * HOUR
    suite = RecordedSuite(engine)
    engine.run()
    return suite.starts, job_s


def test_a_job_placed_within_min_idle_keeps_the_scheduled_run_off_the_node():
    starts, job_s = _one_node_runs(900, gap_s=600)
    second_end = job_s + 600 + job_s
    assert starts[0] == pytest.approx(second_end + 900)  # none before: the job came back


def test_a_node_idle_for_min_idle_runs_the_due_suite_then():
    starts, job_s = _one_node_runs(900, gap_s=1200)
    assert starts[0] == pytest.approx(job_s + 900)
    eager, _ = _one_node_runs(0, gap_s=600)
    assert eager[0] == pytest.approx(job_s)  # without the wait: the moment it is free


def test_without_the_deep_schedule_gpuguard_misses_them_too():
    results = _run((("interval_h", None),))
    gpuguard, none = results["gpuguard"], results["none"]
    for cls in ("sdc", "fail_slow"):
        assert gpuguard.hidden_faults[cls].found_by_checks == 0
        assert gpuguard.hidden_faults[cls].removed == 0
    assert gpuguard.deep_runs == {}
    assert gpuguard.effective == none.effective  # nothing else fails here: as no policy
    assert gpuguard.effective < _run()["gpuguard"].effective


def test_the_verify_gate_catches_a_repair_that_did_not_fix_the_fault():
    plain = _run(confirm=False)["gpuguard"]
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


def test_confirmed_slowness_is_measured_again_after_each_repair_without_the_gate():
    unconfirmed = _run(confirm=False)["gpuguard"]
    confirmed = _run()["gpuguard"]
    # The second measurements, and the verify a repair of confirmed slowness needs: a
    # reset forgets the deep verdict, so without one a slow GPU would return to service.
    assert "verify" not in unconfirmed.deep_runs
    assert confirmed.deep_runs["verify"] > 0 and confirmed.deep_runs["verify_failed"] > 0
    assert confirmed.actions.get("reboot", 0) > unconfirmed.actions.get("reboot", 0)
    assert confirmed.hidden_faults["fail_slow"].removed > 0


def test_sdc_fails_the_job_where_the_scenario_says_so():
    rolled_back = _run()["none"]
    failing = simulate(_scenario(sdc_fails_job=True), policies=("none",)).results["none"]
    assert "silent data corruption" not in rolled_back.job_failures
    assert failing.job_failures["silent data corruption"] > 0
    assert rolled_back.hidden_faults["sdc"].found_by_jobs > 0


def test_deep_false_positives_drain_healthy_nodes_and_the_runs_cost_jobs_not_service():
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
    # A scheduled run on an idle node leaves it in service, as the controller counts it...
    assert never.slot_availability == clean.slot_availability == 1.0
    # ...and its cost is the jobs placed on a node during a run, waiting for its end: at
    # most one placement per run, for at most the run's length, on every node of the job.
    runs = clean.deep_runs["schedule"]
    biggest = max(size["nodes"] for size in data["jobs"]["mix"])
    bound = runs * data["deep_checks"]["duration_s"] / HOUR * biggest * 8
    assert 0 < clean.gpu_hours["deep_run_wait"] <= bound
    assert never.gpu_hours["deep_run_wait"] == 0


def test_a_job_placed_during_a_scheduled_run_starts_when_it_ends():
    data = load_scenario().model_dump(by_alias=True)
    data["fleet"].update(nodes=1, pools=1)
    data["jobs"]["mix"] = [{"nodes": 1, "share": 1, "hours": [1, 1]}]
    scenario = build_scenario(data, "test")
    job = Job(id=0, nodes=1, work_h=1.0, arrival=100.0)
    engine = Engine(scenario, [], [job], NoPolicy(), AgentView(), seed=1)
    slot = engine.slots[0]
    engine.at(70.0, engine.start_test, slot, 90.0)  # from 70 s to 160 s
    engine.at(160.0, engine.end_test, slot)
    engine.run()
    overhead_s = scenario.jobs.restart_overhead_min * 60
    assert job.state is JobState.SUCCEEDED
    assert job.deep_wait_h * HOUR == pytest.approx(60.0)  # placed at 100 s, the run ends at 160
    assert job.overhead_h * HOUR == pytest.approx(overhead_s)  # start-up after the run
    assert job.ended_at == pytest.approx(160.0 + overhead_s + HOUR / engine.speed_factor)
    assert engine.slot_share.share == 1.0  # the node was in service throughout


def test_verify_runs_happen_on_quarantined_nodes(monkeypatch):
    """So their time is out of service by the quarantine taint, as in production."""
    at_start: list[bool] = []
    at_verdict: list[bool] = []
    start, finish = DeepSuite._start, DeepSuite._finish

    def started(suite: DeepSuite, slot: Slot, stamp: float | None) -> None:
        if stamp is not None:
            at_start.append(slot.tainted)
        start(suite, slot, stamp)

    def finished(suite: DeepSuite, slot: Slot, machine: int | None, stamp: float | None) -> None:
        if stamp is not None and slot.machine == machine:
            at_verdict.append(slot.tainted)
        finish(suite, slot, machine, stamp)

    monkeypatch.setattr(DeepSuite, "_start", started)
    monkeypatch.setattr(DeepSuite, "_finish", finished)
    gated = simulate(_scenario(), VERIFY_RESETS, policies=("gpuguard",)).results["gpuguard"]
    assert gated.deep_runs["verify"] == len(at_start) > 0
    assert all(at_start) and at_verdict and all(at_verdict)
