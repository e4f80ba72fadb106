"""Jobs in the simulator: restart accounting, gang scheduling, the device plugin's health
check in the ``none`` baseline, and job success counted per job, per GPU-hour and by size."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpuguard.sim.agent_view import AgentView, kernel_line
from gpuguard.sim.engine import Engine
from gpuguard.sim.faults import HOUR, Effect, Fault, Fix, Signal
from gpuguard.sim.jobs import Job, JobState, _cdf, _draw
from gpuguard.sim.policies import NoPolicy, device_plugin_marks
from gpuguard.sim.results import size_class
from gpuguard.sim.scenario import Scenario, build_scenario, load_scenario
from gpuguard.sim.summary import summarise


def _scenario(nodes: int, days: float = 2.0, **sections: dict[str, object]) -> Scenario:
    data = load_scenario().model_dump(by_alias=True)
    data.update(days=days, warmup_days=0)
    data["fleet"].update(nodes=nodes, spare_nodes=0)
    data["jobs"]["mix"] = [{"nodes": 1, "share": 1.0, "hours": [1, 1]}]
    for name, values in sections.items():
        data[name].update(values)
    return build_scenario(data, "test")


def _fault(slot: int, start: float, cls: str, signal: Signal, fix: Fix, effect: Effect) -> Fault:
    return Fault(
        id=slot * 1000 + int(start),
        slot=slot,
        cls=cls,
        start=start,
        fix=fix,
        effect=effect,
        signal=signal,
        gpu=0,
        end=None,
        slowdown=1.0,
        lemon=False,
        check_phase=0.0,
    )


def _run(scenario: Scenario, faults: list[Fault], jobs: list[Job]) -> Engine:
    engine = Engine(scenario, faults, jobs, NoPolicy(), AgentView(), seed=1)
    engine.run()
    return engine


DEAD_GPU = ("gpu", Signal.XID_79, Fix.REPLACE, Effect.CRASH)


def test_a_job_that_dies_while_starting_pays_its_start_up_once():
    # Without the device plugin nothing keeps the job off the dead GPU: it starts there
    # again and again until its retries run out.
    scenario = _scenario(1, detection={"device_plugin_health_check": False})
    job = Job(id=0, nodes=1, work_h=2.0, arrival=60.0)
    _run(scenario, [_fault(0, 0.0, *DEAD_GPU)], [job])
    assert job.failure == "retry budget exhausted"
    assert job.interruptions == scenario.jobs.retry_budget + 1
    start_up_h = scenario.jobs.restart_overhead_min / 60
    assert job.overhead_h == pytest.approx(job.interruptions * start_up_h)


def test_the_device_plugin_takes_a_gpu_with_a_critical_xid_out_of_the_job_s_way():
    scenario = _scenario(1)
    job = Job(id=0, nodes=1, work_h=2.0, arrival=60.0)
    engine = _run(scenario, [_fault(0, 0.0, *DEAD_GPU)], [job])
    # Marked Unhealthy 5 s after the Xid line: the job never lands on the node until a
    # person (ticketed by the withdrawn GPU) has replaced the machine.
    assert job.state is JobState.SUCCEEDED and job.interruptions == 0
    assert engine.stats.actions["manual_replace"] == 1
    detection = scenario.detection
    assert job.first_start == pytest.approx(
        detection.kernel_log_s
        + (detection.manual_response_h + scenario.fleet.new_capacity_h) * HOUR
    )


def test_the_device_plugin_skips_the_application_xids_as_it_ships():
    line = kernel_line(Signal.XID_13, 0)
    assert line is not None and not device_plugin_marks([line])
    for signal in (Signal.XID_79, Signal.XID_48, Signal.XID_95, Signal.XID_119, Signal.XID_63):
        line = kernel_line(signal, 0)
        assert line is not None and device_plugin_marks([line]), signal
    # No Xid, nothing for the plugin (it reads Xid events only).
    assert not device_plugin_marks(["kernel BUG at mm/slub.c:4265!"])


def _crowded(scheduling: str) -> tuple[Engine, Job]:
    """A 64-node job on the whole fleet crashes on its own fault while 1-node jobs of a day
    wait in the queue."""
    scenario = _scenario(64, jobs={"restart_scheduling": scheduling})
    big = Job(id=0, nodes=64, work_h=10.0, arrival=0.0)
    small = [Job(id=i, nodes=1, work_h=24.0, arrival=HOUR) for i in range(1, 9)]
    crash = _fault(5, 2 * HOUR, "application", Signal.XID_13, Fix.RESTART, Effect.CRASH)
    return _run(scenario, [crash], [big, *small]), big


def test_first_fit_gives_the_restarting_gang_s_nodes_away_and_it_runs_out_of_time():
    engine, big = _crowded("first_fit")
    assert big.failure == "no capacity in time"
    result = summarise(engine)
    assert result.job_success_by_size["512+"].failed == 1
    assert result.job_success_rate == pytest.approx(8 / 9)
    assert result.job_success_by_gpu_hours == pytest.approx(8 * 24 / (8 * 24 + 64 * 10))
    # Its saved work counts as useful; counted as lost, the effective time is lower.
    assert result.effective_failed_lost < result.effective


def test_gang_scheduling_keeps_the_quota_of_a_restarting_job():
    engine, big = _crowded("gang")
    assert big.state is JobState.SUCCEEDED and big.interruptions == 1
    result = summarise(engine)
    assert result.job_success_rate == 1.0
    assert result.effective_failed_lost == result.effective
    # The small jobs started only once the big one had finished.
    assert min(j.first_start or 0 for j in engine.jobs[1:]) >= (big.ended_at or 0)


@pytest.mark.parametrize(
    ("gpus", "label"), [(1, "1-7"), (8, "8-127"), (127, "8-127"), (128, "128-511"), (512, "512+")]
)
def test_size_classes_cover_every_job_size(gpus, label):
    assert size_class(gpus) == label


def test_the_job_size_draw_is_numpys_choice_from_the_same_stream():
    # The generator draws sizes without Generator.choice (it re-checks p on every call);
    # the same seed must still give the same workload, draw for draw.
    p = np.array([0.55, 0.25, 0.12, 0.05, 0.03])
    ours, numpys = np.random.default_rng([7, 1]), np.random.default_rng([7, 1])
    cdf = _cdf(p)
    drawn = [(_draw(ours, cdf), ours.uniform(0.0, 1.0)) for _ in range(5_000)]
    assert drawn == [(int(numpys.choice(len(p), p=p)), numpys.uniform(0.0, 1.0)) for _ in drawn]
    assert {size for size, _ in drawn} == set(range(len(p)))


def test_ettr_as_meta_defines_it_loses_the_time_since_the_checkpoint_and_the_restarts():
    # Kokolis et al. (HPCA 2025): productive runtime over wall time. A crash 2.5 h in, with
    # hourly checkpoints after a 15-minute start-up, throws away the 15 minutes run since
    # the checkpoint at 2.25 h; the two start-ups are not productive either.
    job = Job(id=0, nodes=1, work_h=3.0, arrival=0.0)
    crash = _fault(0, 2.5 * HOUR, "application", Signal.XID_13, Fix.RESTART, Effect.CRASH)
    result = summarise(_run(_scenario(1), [crash], [job]))
    assert job.lost_wall_h == pytest.approx(0.25)
    assert job.overhead_h == pytest.approx(0.5)
    wall = (job.ended_at or 0) / HOUR - (job.first_start or 0) / HOUR
    # Running, starting up, or back in the queue for the requeue delay (10 s).
    assert wall - job.running_h - job.overhead_h == pytest.approx(10 / 3600)
    assert result.ettr == pytest.approx((job.running_h - job.lost_wall_h) / wall)
    # Google's runtime goodput: productive runtime over the time the job held its node.
    held = job.running_h + job.overhead_h
    assert result.ml_goodput.runtime == pytest.approx((job.running_h - job.lost_wall_h) / held)
    assert result.ml_goodput.scheduling == pytest.approx(held / wall)
    # One interruption over the node-days the job held (Meta's normalisation).
    assert result.interruptions_per_1000_node_days == pytest.approx(1000 / (held / 24))


def test_a_slow_gpu_s_time_is_productive_for_ettr_and_lost_for_the_effective_time():
    # Half speed for the whole run: Meta's ETTR sees a job that never stopped; gpuguard's
    # stricter figure counts the work a healthy GPU would have done in that time.
    job = Job(id=0, nodes=1, work_h=2.0, arrival=0.0)
    slow = dataclasses.replace(
        _fault(0, 0.0, "fail_slow", Signal.NOTHING, Fix.REPLACE, Effect.SLOW), slowdown=0.5
    )
    result = summarise(_run(_scenario(1), [slow], [job]))
    assert job.interruptions == 0
    assert result.ettr > 0.85  # only the first start-up is lost
    assert result.effective == pytest.approx(result.ettr / 2, rel=0.02)
    # Google's ML goodput puts the slowness in its program factor; the product of the
    # three is the effective training time.
    goodput = result.ml_goodput
    assert goodput.program == pytest.approx(0.5, rel=0.01)
    assert goodput.scheduling * goodput.runtime * goodput.program == pytest.approx(result.effective)


@pytest.mark.parametrize(("noticed_h", "visits"), [(72.0, 1), (None, 0)])
def test_people_notice_a_slow_node_under_a_job_after_the_scenario_s_delay(noticed_h, visits):
    # No check in `none` reads a slow GPU, but the job's owners see their job crawl: after
    # `slow_noticed_h` they file a ticket and a person replaces the machine (null: never).
    scenario = _scenario(1, days=8.0, detection={"slow_noticed_h": noticed_h})
    job = Job(id=0, nodes=1, work_h=150.0, arrival=0.0)
    slow = dataclasses.replace(
        _fault(0, 0.0, "fail_slow", Signal.NOTHING, Fix.REPLACE, Effect.SLOW), slowdown=0.5
    )
    engine = _run(scenario, [slow], [job])
    assert engine.stats.actions.get("manual_replace", 0) == visits
    assert bool(engine.slots[0].faults) is (visits == 0)
