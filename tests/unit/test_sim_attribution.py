"""Jobs that do not pay for the infrastructure (issue 26): attribution of a job's
interruptions, crash memory across jobs, warm spares, and the careful operator's baseline.

Each engine test runs a fleet of a few nodes on a fault list of its own, so what it
asserts is the attribution's, crash memory's or the scheduler's doing alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuguard.remediation.policy import Policy
from gpuguard.sim.agent_view import AgentView
from gpuguard.sim.engine import Engine
from gpuguard.sim.fault_stream import generate_faults
from gpuguard.sim.faults import (
    DAY,
    HOUR,
    Effect,
    Fault,
    Fix,
    Locus,
    Signal,
)
from gpuguard.sim.gpuguard_policy import GpuguardPolicy
from gpuguard.sim.jobs import Job
from gpuguard.sim.policies import ReactivePolicy
from gpuguard.sim.scenario import Scenario, build_scenario, load_scenario


def _scenario(nodes: int = 1, days: float = 1, **sections: dict[str, Any]) -> Scenario:
    data = load_scenario().model_dump(by_alias=True)
    data.update(days=days, warmup_days=0, seed=1)
    data["fleet"].update(nodes=nodes, pools=1, age_days=0, spares_per_pool=0)
    data["jobs"]["mix"] = [{"nodes": 1, "share": 1.0, "hours": [1, 2]}]
    data["actions"]["failure_probability"] = 0.0
    data["detection"]["manual_response_h"] = 1000
    for name, values in sections.items():
        data[name].update(values)
    return build_scenario(data, "test")


def _fault(i: int, slot: int, cls: str, at: float, **kind: Any) -> Fault:
    defaults: dict[str, Any] = dict(
        fix=Fix.RESTART, effect=Effect.HANG, signal=Signal.NOTHING, lemon=False
    )
    defaults.update(kind)
    return Fault(
        id=i,
        slot=slot,
        cls=cls,
        start=at,
        gpu=2,
        end=None,
        slowdown=1.0,
        check_phase=0.5,
        locus=Locus.MACHINE if defaults["lemon"] else Locus.JOB,
        **defaults,
    )


def _one_job_hit_by(fault: Fault, **attribution: float) -> Job:
    """A long one-node job on a one-node fleet, under gpuguard, hit by ``fault``."""
    scenario = _scenario(attribution=attribution)
    job = Job(id=0, nodes=1, work_h=1000.0, arrival=0.0)
    engine = Engine(scenario, [fault], [job], GpuguardPolicy(Policy()), AgentView(), seed=1)
    engine.run()
    assert job.interruptions == 1
    return job


XID_79 = dict(fix=Fix.REBOOT, effect=Effect.CRASH, signal=Signal.XID_79)
XID_13 = dict(fix=Fix.RESTART, effect=Effect.CRASH, signal=Signal.XID_13)


def test_an_attributed_interruption_costs_no_retry_an_unattributed_one_does():
    lost_gpu = _fault(0, 0, "gpu", 2 * HOUR, **XID_79)
    assert _one_job_hit_by(lost_gpu, coverage=1.0).retries == 0  # Xid 79 on its GPU
    assert _one_job_hit_by(lost_gpu, coverage=0.0).retries == 1  # marked too late
    silent = _fault(0, 0, "unattributed", 2 * HOUR)
    assert _one_job_hit_by(silent, coverage=1.0, signature_share=0.0).retries == 1
    # The same crash with a known NCCL signature in the pod's last words.
    assert _one_job_hit_by(silent, coverage=1.0, signature_share=1.0).retries == 0


def test_a_jobs_own_failure_counts_unless_wrongly_attributed():
    own = _fault(0, 0, "application", 2 * HOUR, **XID_13)
    # Xid 13 is the application's (remediation.attribution.APPLICATION_XIDS).
    assert _one_job_hit_by(own, coverage=1.0, error_rate=0.0).retries == 1
    assert _one_job_hit_by(own, coverage=1.0, error_rate=1.0).retries == 0


def test_reactive_with_pod_failure_policy_forgives_its_drains_not_crashes():
    job = Job(id=0, nodes=1, work_h=1.0, arrival=0.0)
    crash = _fault(0, 0, "gpu", 0.0, **XID_79)
    careful, plain = ReactivePolicy(pod_failure_policy=True), ReactivePolicy()
    assert careful.name == "reactive-pfp" and plain.name == "reactive"
    assert not careful.charges(job, "platform", None)
    assert careful.charges(job, "fault", crash)
    assert plain.charges(job, "platform", None)


def _busy_fleet(faults: list[Fault], nodes: int = 8, days: float = 6) -> Engine:
    """One-node jobs of 1-2 h on a full fleet: many different jobs pass every node."""
    scenario = _scenario(
        nodes=nodes, days=days, jobs={"utilisation": 1.0}, attribution={"signature_share": 0.0}
    )
    rng = np.random.default_rng(5)
    jobs = [
        Job(id=i, nodes=1, work_h=float(rng.uniform(1, 2)), arrival=i * 1200.0 / nodes)
        for i in range(int(days * DAY / 1200.0 * nodes))
    ]
    engine = Engine(scenario, faults, jobs, GpuguardPolicy(Policy()), AgentView(), seed=1)
    engine.run()
    return engine


def test_crash_memory_finds_a_planted_bad_machine_and_replaces_it():
    bad = 3
    planted = [_fault(i, bad, "unattributed", (i + 1) * 2 * HOUR, lemon=True) for i in range(60)]
    engine = _busy_fleet(planted)
    stats = engine.stats
    assert engine.slots[bad].generation >= 1  # the machine was replaced ...
    assert stats.replaced_at[bad]
    assert all(not stats.replaced_at[s] for s in range(8) if s != bad)  # ... and no other
    assert stats.suspicions >= 2  # a first suspicion quarantines, a repeat replaces
    assert stats.false_suspicions == 0
    # Once it is gone its crashes stop: the faults after the replacement were dropped.
    replaced = stats.replaced_at[bad][0]
    assert stats.dropped_faults >= sum(1 for f in planted if f.start > replaced + HOUR)


def test_random_crashes_of_different_jobs_on_one_healthy_node_are_false_suspicions():
    # Not a bad machine (no lemon): three jobs crashing there within a day look the same.
    crashes = [_fault(i, 5, "unattributed", (10 + 3 * i) * HOUR) for i in range(3)]
    engine = _busy_fleet(crashes, days=2)
    assert engine.stats.attribution["unexplained"] == 3
    assert engine.stats.suspicions == engine.stats.false_suspicions == 1


def test_a_waiting_gang_takes_a_spare_at_once_and_the_pool_refills_after_the_launch():
    scenario = _scenario(
        nodes=4,
        days=1,
        fleet={"spares_per_pool": 1},
        jobs={"mix": [{"nodes": 3, "share": 1.0, "hours": [1, 2]}]},
    )
    gang = Job(id=0, nodes=3, work_h=100.0, arrival=0.0)
    small = Job(id=1, nodes=1, work_h=100.0, arrival=0.0)
    lost_at = 2 * HOUR
    host = _fault(0, -1, "host", lost_at, fix=Fix.REPLACE, effect=Effect.DOWN)
    host.signal = Signal.NOT_READY
    engine = Engine(scenario, [], [gang, small], GpuguardPolicy(Policy()), AgentView(), seed=1)
    seen: dict[str, int] = {}

    def look(label: str) -> None:
        seen[label] = engine.scheduler.spares_ready

    launch = scenario.fleet.new_capacity_h * HOUR
    restart = lost_at + scenario.jobs.requeue_delay_s
    engine.at(1.0, lambda: _plant_on_gang(engine, gang, host))
    engine.at(HOUR, look, "before")
    engine.at(restart + 60, look, "taken")
    engine.at(restart + launch + 60, look, "back")
    engine.run()
    assert small.first_start is None  # the spare is never a new job's
    assert seen == {"before": 1, "taken": 0, "back": 1}
    assert engine.stats.spares_taken == 1
    assert gang.placed_at == restart  # at once, not when the lost node comes back
    assert gang.retries == 0  # its node was lost: the infrastructure's


def _plant_on_gang(engine: Engine, gang: Job, fault: Fault) -> None:
    """The fault goes on one of the gang's nodes (which ones the scheduler picked)."""
    fault.slot = gang.slots[0]
    engine.events.at(fault.start, engine.fault_process.start, fault)


def test_a_share_of_unattributed_interruptions_comes_from_few_silent_machines():
    data = load_scenario().model_dump(by_alias=True)
    data["fleet"]["nodes"] = 1000
    data["failures"]["unattributed_per_1000_node_days"] = 50.0
    faults = generate_faults(build_scenario(data, "test"), np.random.default_rng(1))
    unattributed = [f for f in faults if f.cls == "unattributed"]
    silent = [f for f in unattributed if f.of_silent_machine]
    assert len({f.slot for f in silent}) <= 10  # 1 % of the machines
    assert 0.2 < len(silent) / len(unattributed) < 0.3  # a quarter of the interruptions
    assert all(f.locus is Locus.MACHINE for f in silent)
    # Without unattributed interruptions the stream is drawn as before: no silent machine.
    assert not any(
        f.of_silent_machine for f in generate_faults(load_scenario(), np.random.default_rng(1))
    )
