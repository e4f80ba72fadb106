"""The in-job detection path in the simulator (``sim/in_job.py``): who it can see, how soon,
what the real policy does with its findings, and what turning it off loses.

The one-job tests place a single job on a small fleet with one hidden fault on its first
node, so every time is known in advance; the fleet tests reuse the busy, hidden-faults-only
fleet of test_sim_detection.py with the path on and off.
"""

from __future__ import annotations

import functools
import json

import pytest

from gpuguard.cli import main
from gpuguard.config import LoadClocks
from gpuguard.remediation.policy import Policy, build_policy
from gpuguard.sim.agent_view import AgentView
from gpuguard.sim.engine import Engine
from gpuguard.sim.faults import Effect, Fault, Fix, Signal
from gpuguard.sim.gpuguard_policy import GpuguardPolicy
from gpuguard.sim.jobs import Job
from gpuguard.sim.results import PolicyResult
from gpuguard.sim.run import WITHOUT_IN_JOB, simulate
from gpuguard.sim.scenario import Scenario, build_scenario, load_scenario
from tests.unit.test_sim_detection import _scenario as hidden_faults_fleet

HOUR = 3600.0


def _one_job_scenario(nodes: int, **in_job: object) -> Scenario:
    data = load_scenario().model_dump(by_alias=True)
    data.update(days=30, warmup_days=0)
    data["fleet"].update(nodes=max(nodes, 4), pools=1, age_days=0, spares_per_pool=0)
    data["jobs"]["mix"] = [{"nodes": nodes, "share": 1, "hours": [20, 20]}]
    data["deep_checks"]["interval_h"] = None  # nothing but the in-job path looks
    data["detection"]["manual_response_h"] = 1000
    data["in_job"].update({"adoption": 1.0, **in_job})  # the path itself, on every job
    return build_scenario(data, "test")


def _fault(
    cls: str, slowdown: float = 0.5, signal: Signal = Signal.NOTHING, end_h: float = 10.0
) -> Fault:
    effect = Effect.SILENT if cls == "sdc" else Effect.SLOW
    end = end_h * HOUR if signal is Signal.POWER_BRAKE else None
    fix = Fix.SELF if end is not None else Fix.REPLACE
    return Fault(0, 0, cls, 0.0, fix, effect, signal, 3, end, slowdown, False, 0.5)


def _one_job(
    nodes: int, fault: Fault, *, run_h: float = 6.0, work_h: float = 20.0, **in_job: object
) -> tuple[Engine, Job]:
    """One job of ``nodes`` nodes from t=0 on a fleet whose first node has ``fault``."""
    scenario = _one_job_scenario(nodes, **in_job)
    job = Job(id=0, nodes=nodes, work_h=work_h, arrival=0.0)
    engine = Engine(scenario, [fault], [job], GpuguardPolicy(Policy()), AgentView(), seed=1)
    engine.horizon = run_h * HOUR
    engine.run()
    return engine, job


def _ready_s(engine: Engine) -> float:
    return engine.scenario.jobs.restart_overhead_min * 60.0


def test_a_slow_rank_is_named_after_persistence_windows_of_its_slowed_steps():
    engine, _ = _one_job(4, _fault("fail_slow", slowdown=0.5))
    config = engine.scenario.in_job
    # The job steps at its slowest rank's pace, so its windows last twice as long.
    delay = config.persistence_windows * config.window_steps * config.step_s / 0.5
    assert engine.stats.hidden[0].in_job == pytest.approx(_ready_s(engine) + delay)
    longer, _ = _one_job(4, _fault("fail_slow", slowdown=0.5), window_steps=4 * config.window_steps)
    assert longer.stats.hidden[0].in_job == pytest.approx(_ready_s(engine) + 4 * delay)


# Confirmed slowness climbs from a GPU reset, each rung measured again: a second
# measurement, a reset, its verify, a reboot (10 min), its verify, then the replacement.
CONFIRMED_LADDER = {"reset": 1, "reboot": 1, "replace": 1}
LADDER_S = 1800


def test_the_deferred_repair_waits_for_the_next_checkpoint_then_replaces_the_node():
    engine, job = _one_job(4, _fault("fail_slow", slowdown=0.5))
    checkpoint = _ready_s(engine) + engine.scenario.jobs.checkpoint_interval_min * 60.0
    removed = engine.stats.hidden[0].removed
    assert {k: engine.stats.actions[k] for k in CONFIRMED_LADDER} == CONFIRMED_LADDER
    assert engine.stats.deep_runs["verify"] == engine.stats.deep_runs["verify_failed"] == 3
    assert removed is not None and checkpoint <= removed < checkpoint + LADDER_S
    # Drained at its checkpoint: it redoes no more than seconds of work, not an interval's.
    assert job.interruptions == 1 and job.lost_h * HOUR < 60
    assert engine.stats.false_drains == 0


def test_a_verdict_stands_when_its_job_ends_and_the_node_is_repaired_then():
    engine, job = _one_job(4, _fault("fail_slow", slowdown=0.5), work_h=0.4)
    named, removed = engine.stats.hidden[0].in_job, engine.stats.hidden[0].removed
    checkpoint = _ready_s(engine) + engine.scenario.jobs.checkpoint_interval_min * 60.0
    assert job.ended_at is not None and named is not None and named < job.ended_at < checkpoint
    # The pods are gone, so the deferred repair need wait for nothing: the slowness is
    # confirmed and the ladder climbed soon after the job's end, the slow GPU replaced.
    assert removed is not None and job.ended_at <= removed < job.ended_at + LADDER_S
    assert {k: engine.stats.actions[k] for k in CONFIRMED_LADDER} == CONFIRMED_LADDER


def test_a_rank_that_recovers_withdraws_its_verdict_before_any_repair():
    brief = _fault("fail_slow", slowdown=0.5, signal=Signal.POWER_BRAKE, end_h=0.5)
    engine, _ = _one_job(4, brief)
    assert engine.stats.hidden[0].in_job is not None
    assert engine.stats.hidden[0].passive is not None
    # Both waited (deferred) while the job ran, and went when the GPU recovered.
    assert engine.stats.actions == {} and engine.stats.false_drains == 0


def test_a_slowdown_within_the_ratio_is_not_told_apart_from_jitter():
    engine, _ = _one_job(4, _fault("fail_slow", slowdown=0.95))
    assert engine.stats.hidden[0].in_job is None
    assert "replace" not in engine.stats.actions


def test_a_job_of_one_rank_has_no_peers_to_be_slower_than():
    one, _ = _one_job(1, _fault("fail_slow"), ranks_per_node=1)
    eight, _ = _one_job(1, _fault("fail_slow"))  # one node, a rank per GPU
    assert one.stats.hidden[0].in_job is None
    assert eight.stats.hidden[0].in_job is not None


def test_replica_agreement_needs_a_strict_majority_of_three_replicas():
    everything = {"sdc_parameter_share": 1.0}
    two, _ = _one_job(2, _fault("sdc"), **everything)  # a replica per node
    three, _ = _one_job(3, _fault("sdc"), **everything)
    single, _ = _one_job(4, _fault("sdc"), gpus_per_replica=32, **everything)
    assert two.stats.hidden[0].in_job is None
    assert single.stats.hidden[0].in_job is None
    config = three.scenario.in_job
    # The round after the first corrupted update, then the re-check.
    named = three.stats.hidden[0].in_job
    assert named is not None
    waited = (named - _ready_s(three)) / config.step_s
    assert config.recheck_steps <= waited <= config.fingerprint_steps + config.recheck_steps


def test_a_replica_mismatch_is_repaired_at_once_and_the_job_resumes_from_before_it():
    everything = {"sdc_parameter_share": 1.0}
    caught, job = _one_job(3, _fault("sdc"), **everything)
    named = caught.stats.hidden[0].in_job
    removed = caught.stats.hidden[0].removed
    assert named is not None and removed is not None
    # Critical, not deferred: no wait for a checkpoint (the policy's tolerance and a swap).
    assert removed - named < 600
    assert caught.stats.hidden[0].by_job is None  # the owners never had to trace it
    assert job.lost_h * HOUR == pytest.approx(named - _ready_s(caught), rel=0.01)
    # Corruption the all-reduce spreads to every replica is not seen by the fingerprints.
    unseen, _ = _one_job(3, _fault("sdc"), sdc_parameter_share=0.0, probe_steps=0)
    assert unseen.stats.hidden[0].in_job is None


def test_corruption_the_all_reduce_spreads_is_named_by_the_probe_after_a_recheck():
    passes_only = {"sdc_parameter_share": 0.0, "sdc_probe_round_share": 1.0}
    probed, job = _one_job(3, _fault("sdc"), **passes_only)
    config = probed.scenario.in_job
    named = probed.stats.hidden[0].in_job
    assert named is not None and probed.stats.hidden[0].removed is not None
    waited = (named - _ready_s(probed)) / config.step_s
    # The first round after the onset shows it, the re-check shows it again.
    assert config.recheck_steps <= waited <= config.probe_steps + config.recheck_steps
    assert job.lost_h * HOUR == pytest.approx(named - _ready_s(probed), rel=0.01)
    # A GPU that one probe round in five shows is named too, by a later re-check.
    rarely, _ = _one_job(3, _fault("sdc"), sdc_parameter_share=0.0, sdc_probe_round_share=0.2)
    assert rarely.stats.hidden[0].in_job is not None
    never, _ = _one_job(3, _fault("sdc"), sdc_parameter_share=0.0, sdc_probe_round_share=0.0)
    assert never.stats.hidden[0].in_job is None


def test_jobs_without_the_telemetry_and_idle_nodes_are_left_to_the_deep_suite():
    engine, _ = _one_job(4, _fault("fail_slow"), adoption=0.0)
    assert engine.stats.hidden[0].in_job is None
    data = _one_job_scenario(4).model_dump(by_alias=True)
    data["fleet"]["nodes"] = 8
    idle = _fault("fail_slow")
    idle.slot = 7
    job = Job(id=0, nodes=4, work_h=20.0, arrival=0.0)
    fleet = build_scenario(data, "test")
    alone = Engine(fleet, [idle], [job], GpuguardPolicy(Policy()), AgentView(), seed=1)
    alone.horizon = 6 * HOUR
    alone.run()
    assert job.slots and 7 not in job.slots  # the job still runs, elsewhere
    assert alone.stats.hidden[0].in_job is None


def test_the_agent_names_a_throttled_gpu_under_load_after_its_window():
    brake = _fault("fail_slow", slowdown=0.7, signal=Signal.POWER_BRAKE)
    engine, _ = _one_job(4, brake)
    # The agent's load-clocks window: min_samples loaded samples a check round apart,
    # from the fault's phase within the first.
    rounds = LoadClocks().min_samples - 1 + brake.check_phase
    check_s = engine.scenario.detection.check_interval_s
    assert engine.stats.hidden[0].passive == pytest.approx(_ready_s(engine) + rounds * check_s)
    within, _ = _one_job(4, _fault("fail_slow", 0.95, Signal.POWER_BRAKE))
    assert within.stats.hidden[0].passive is None  # within the clocks' tolerance
    off, _ = _one_job(4, _fault("fail_slow", 0.7, Signal.POWER_BRAKE), passive=False)
    assert off.stats.hidden[0].passive is None


def test_false_verdicts_are_counted_and_unconfirmed_repair_nothing():
    data = hidden_faults_fleet().model_dump(by_alias=True)
    data["in_job"].update(enabled=True, false_verdicts_per_node_day=0.05)
    data["failures"].update(fail_slow_per_1000_node_days=0)
    data["failures"]["classes"]["sdc"]["rate"] = 0
    scenario = build_scenario(data, "t")
    noisy = simulate(scenario, policies=("gpuguard",)).results["gpuguard"]
    assert 0 < noisy.false_verdicts_per_node_day <= 0.05
    # Each was measured again, passed, and was forgotten: no drain, no repair.
    assert noisy.deep_runs["verify"] > 0 and "verify_failed" not in noisy.deep_runs
    assert noisy.false_drains_per_node_day == 0
    assert not {"reset", "reboot", "replace"} & set(noisy.actions)
    # Acting on the first measurement, the same verdicts repair healthy nodes.
    unconfirmed = build_policy({"confirm": {"enabled": False}}, "t")
    hasty = simulate(scenario, unconfirmed, policies=("gpuguard",)).results["gpuguard"]
    assert hasty.false_drains_per_node_day > 0 and hasty.actions.get("reset", 0) > 0
    data["in_job"]["false_verdicts_per_node_day"] = 0
    clean = simulate(build_scenario(data, "t"), policies=("gpuguard",)).results["gpuguard"]
    assert clean.false_verdicts_per_node_day == 0 and clean.false_drains_per_node_day == 0
    # Quarantined only while measured: about the service of the fleet with no verdicts.
    assert noisy.gpu_node_availability > clean.gpu_node_availability - 0.002


@functools.cache
def _fleet() -> dict[str, PolicyResult]:
    data = hidden_faults_fleet(busy=0.85).model_dump(by_alias=True)
    data["in_job"]["enabled"] = True
    scenario = build_scenario(data, "test")
    return simulate(scenario, policies=("none", "gpuguard", WITHOUT_IN_JOB)).results


def test_turning_the_path_off_loses_its_detections_and_its_gain():
    results = _fleet()
    with_path, without = results["gpuguard"], results[WITHOUT_IN_JOB]
    for cls in ("fail_slow", "sdc"):
        found = with_path.hidden_faults[cls].persistent
        assert found.in_job > 0
        assert without.hidden_faults[cls].persistent.in_job == 0
        missed = without.hidden_faults[cls].persistent.missed
        assert found.missed < missed
        # Named within minutes of onset, where the deep suite waits for an idle node.
        slower = without.hidden_faults[cls].persistent.time_to_detect_h
        assert found.time_to_detect_h.p50 < slower.p50
    assert with_path.effective > without.effective
    assert with_path.gpu_hours["stalled_or_slow"] < without.gpu_hours["stalled_or_slow"]


def test_the_baselines_have_no_in_job_path():
    none = _fleet()["none"]
    for cls in ("fail_slow", "sdc"):
        found = none.hidden_faults[cls].persistent
        assert found.in_job == found.passive == found.deep_suite == 0


def test_the_command_runs_the_path_off_and_side_by_side(capsys):
    small = ["simulate", "--days", "3", "--nodes", "160", "--seeds", "1", "--no-progress"]
    assert main([*small, "--json", "--compare-in-job"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["policies"]) == {"none", "reactive", "gpuguard", WITHOUT_IN_JOB}
    assert set(data["in_job"]["with_vs_without"]) == {
        "effective",
        "effective_failed_lost",
        "goodput",
    }
    assert data["scenario"]["in_job"]["enabled"] is True
    assert main([*small, "--json", "--no-in-job"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["scenario"]["in_job"]["enabled"] is False
    assert off["in_job"]["fail_slow"]["found_in_job"] == 0
    assert main(small) == 0
    assert "In-job detection (gpuguard run, 1 seed(s) pooled; the path is on)" in (
        capsys.readouterr().out
    )


def test_a_replaced_machines_findings_are_never_shown_by_its_successor():
    # A persistent slow GPU named by its clocks: the ladder replaced the machine, whose
    # findings stay on record until one is raised on the new one. What the new machine's
    # agent reports (after a deep run passes there, say) holds nothing of the old one's.
    engine, _ = _one_job(4, _fault("fail_slow", 0.7, Signal.POWER_BRAKE, end_h=1000))
    slot = engine.slots[0]
    driver = engine.driver
    assert isinstance(driver, GpuguardPolicy) and driver.in_job is not None
    record = driver.in_job.findings.get(0, {})
    assert not slot.original and any(m != slot.machine for _, _, m in record.values())
    driver.in_job.contradicted(slot)
    assert slot.in_job == ()
