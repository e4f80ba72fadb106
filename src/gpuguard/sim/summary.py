"""From one engine run to the reported figures of its measured days (``results``)."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

from gpuguard.sim.engine import BIN_S, Engine, FaultTimes, HiddenTimes, Stats
from gpuguard.sim.faults import HIDDEN_CLASSES, HOUR, Fault, Fix
from gpuguard.sim.jobs import Job, JobBooks, JobState
from gpuguard.sim.results import (
    GPU_HOUR_KINDS,
    GPUS_PER_NODE,
    SIZE_CLASSES,
    Distribution,
    FoundBy,
    GpuFigures,
    HiddenFaults,
    LocusFigures,
    MlGoodput,
    PolicyResult,
    SizeOutcome,
    size_class,
)
from gpuguard.sli import job_success_rate, ratio

REPLACEMENT_WINDOW_S = 7 * 24 * HOUR


def summarise(engine: Engine) -> PolicyResult:
    """The figures of the measured days: the warm-up's jobs, faults and time left out."""
    scenario = engine.scenario
    stats = engine.measured_stats()
    node_days = scenario.fleet.nodes * scenario.days
    jobs = engine.measured_jobs()
    counts = _job_counts(jobs)
    started = [job for job in jobs if job.first_start is not None]
    ettr, effective, effective_failed_lost = _training_time(started, engine.horizon)
    books, fleet_node_hours = engine.measured_books(), node_days * 24.0
    spent = _spent(engine, books, fleet_node_hours)
    fault_times = list(_with_start(engine, stats))
    repaired = [(t.repaired - start) / HOUR for t, start in fault_times if t.repaired is not None]
    return PolicyResult(
        policy=engine.driver.name,
        gpu_node_availability=engine.machine_share.share,
        slot_availability=engine.slot_share.share,
        job_success_rate=job_success_rate(counts["succeeded"], counts["failed"]),
        job_success_by_gpu_hours=_success_by_work(jobs),
        job_success_by_size=_success_by_size(jobs),
        ettr=ettr,
        effective=effective,
        effective_failed_lost=effective_failed_lost,
        goodput=ratio(spent["useful"], fleet_node_hours),
        ml_goodput=MlGoodput.of(started, engine.horizon),
        mttr_hours=statistics.fmean(repaired) if repaired else 0.0,
        false_drains_per_node_day=stats.false_drains / node_days,
        time_to_detect_h=Distribution.of(
            [(t.detected - s) / HOUR for t, s in fault_times if t.detected is not None]
        ),
        time_to_quarantine_h=Distribution.of(
            [(t.quarantined - s) / HOUR for t, s in fault_times if t.quarantined is not None]
        ),
        time_to_repair_h=Distribution.of(repaired),
        unrepaired_faults=sum(1 for t, _ in fault_times if t.repaired is None),
        gpu_hours={k: spent[k] * GPUS_PER_NODE for k in GPU_HOUR_KINDS},
        actions=dict(sorted(stats.actions.items())),
        breaker_trips=stats.breaker_trips,
        jobs=counts,
        job_failures=dict(Counter(job.failure for job in jobs if job.state is JobState.FAILED)),
        job_mttf_h=_mttf(books, attributed=False),
        attributed_job_mttf_h=_mttf(books, attributed=True),
        interruptions=sum(b.interruptions for _, b in books),
        interruptions_per_1000_node_days=_interruption_rate(books),
        faults=sum(fault.start >= engine.warmup for fault in engine.faults) - stats.dropped_faults,
        decide_calls=stats.decide_calls,
        availability_by_day=_daily(engine, stats),
        hidden_faults=_hidden(engine, stats),
        deep_runs=dict(sorted(stats.deep_runs.items())),
        repair_node_hours_by_class=_repair_by_class(engine, stats),
        false_verdicts_per_node_day=stats.false_verdicts / node_days,
        attribution=dict(sorted(stats.attribution.items())),
        crash_suspicions_per_node_day=stats.suspicions / node_days,
        false_suspicions_per_node_day=stats.false_suspicions / node_days,
        spares_taken=stats.spares_taken,
        locus=_locus(stats),
        gpu=_gpu(engine, stats),
    )


def _gpu(engine: Engine, stats: Stats) -> GpuFigures:
    return GpuFigures(
        slot_availability=engine.books.gpu_share.share,
        gpus_quarantined=stats.gpus_quarantined,
        escalations=stats.gpu_escalations,
        preflight_checks=stats.preflight_checks,
        preflight_caught=dict(sorted(stats.preflight_caught.items())),
        preflight_false_failures=stats.preflight_false,
        preflight_failed_starts=stats.preflight_blocked,
        preflight_gpu_hours=stats.preflight_node_s * GPUS_PER_NODE / HOUR,
    )


def _job_counts(jobs: list[Job]) -> dict[str, int]:
    states = Counter(job.state for job in jobs)
    succeeded, failed = states[JobState.SUCCEEDED], states[JobState.FAILED]
    return {"succeeded": succeeded, "failed": failed, "unfinished": len(jobs) - succeeded - failed}


def _training_time(started: list[Job], horizon: float) -> tuple[float, float, float]:
    """ETTR, effective training time, and the latter with a failed job's work lost: each
    over the jobs' wall time on their nodes."""
    productive = sum((job.running_h - job.lost_wall_h) * job.nodes for job in started)
    kept = sum(job.saved_h * job.nodes for job in started if job.state is not JobState.FAILED)
    wall = sum(
        ((job.ended_at if job.ended_at is not None else horizon) - job.first_start)
        / HOUR
        * job.nodes
        for job in started
        if job.first_start is not None
    )
    saved = sum(job.saved_h * job.nodes for job in started)
    return ratio(productive, wall), ratio(saved, wall), ratio(kept, wall)


def _spent(
    engine: Engine, books: list[tuple[Job, JobBooks]], fleet_node_hours: float
) -> dict[str, float]:
    """Where the fleet's node-hours went (``GPU_HOUR_KINDS``)."""
    held = _node_hours(books)
    out = fleet_node_hours - engine.slot_share.up_seconds / HOUR
    failed_work = sum(b.done * job.nodes for job, b in books if job.state is JobState.FAILED)
    spent = {
        "useful": held["done"] - failed_work,
        "failed_jobs_work": failed_work,
        "lost_work": held["lost"],
        "restarting": held["restarting"],
        "deep_run_wait": held["deep_wait"],
        "stalled_or_slow": max(0.0, held["running"] - held["done"] - held["lost"]),
        "out_of_service": out,
    }
    spent["idle"] = max(0.0, fleet_node_hours - sum(spent.values()))
    return spent


def _locus(stats: Stats) -> LocusFigures:
    return LocusFigures(
        replacements=stats.actions["replace"],
        machine_faults=stats.machine_faults,
        machine_faults_replace=stats.machine_faults_replace,
        max_per_position_7d=max(
            (most_in_window(t, REPLACEMENT_WINDOW_S) for t in stats.replaced_at.values()),
            default=0,
        ),
    )


def _success_by_work(jobs: list[Job]) -> float:
    done = {JobState.SUCCEEDED: 0.0, JobState.FAILED: 0.0}
    for job in jobs:
        if job.state in done:
            done[job.state] += job.work_h * job.nodes * job.gpus
    return ratio(done[JobState.SUCCEEDED], sum(done.values()))


def _success_by_size(jobs: list[Job]) -> dict[str, SizeOutcome]:
    outcomes = {name: SizeOutcome(0, 0) for _, name in SIZE_CLASSES}
    for job in jobs:
        if job.state is JobState.SUCCEEDED:
            outcomes[size_class(job.nodes * job.gpus)].succeeded += 1
        elif job.state is JobState.FAILED:
            outcomes[size_class(job.nodes * job.gpus)].failed += 1
    return outcomes


def _repair_by_class(engine: Engine, stats: Stats) -> dict[str, float]:
    by_id = {fault.id: fault for fault in engine.faults}
    hours: dict[str, float] = defaultdict(float)
    for fault_id, times in stats.fault_times.items():
        fault = by_id[fault_id]
        end = times.repaired if times.repaired is not None else engine.horizon
        hours[fault.cls] += (end - fault.start) / HOUR
    return dict(sorted(hours.items(), key=lambda item: -item[1]))


def _hidden(engine: Engine, stats: Stats) -> dict[str, HiddenFaults]:
    by_id = {fault.id: fault for fault in engine.faults}
    result = {}
    for cls in sorted(HIDDEN_CLASSES):
        times = [(t, by_id[i].start) for i, t in stats.hidden.items() if by_id[i].cls == cls]
        found = [(t.by_checks - start) / HOUR for t, start in times if t.by_checks is not None]
        result[cls] = HiddenFaults(
            faults=len(times),
            found_by_checks=len(found),
            found_by_jobs=sum(1 for t, _ in times if t.by_job is not None),
            removed=sum(1 for t, _ in times if t.removed is not None),
            time_to_find_h=Distribution.of(found),
            time_to_remove_h=Distribution.of(
                [(t.removed - start) / HOUR for t, start in times if t.removed is not None]
            ),
            persistent=_found_by(
                [(t, by_id[i]) for i, t in stats.hidden.items() if by_id[i].cls == cls]
            ),
        )
    return result


def _found_by(faults: list[tuple[HiddenTimes, Fault]]) -> FoundBy:
    paths = {"in_job": 0, "by_checks": 0, "passive": 0}
    detect: list[float] = []
    missed = removed_unnamed = 0
    for times, fault in faults:
        if fault.fix is Fix.SELF:
            continue  # a transient slowdown: not the goal's
        seen = {path: getattr(times, path) for path in paths if getattr(times, path) is not None}
        if not seen:
            missed += 1
            removed_unnamed += times.removed is not None
            continue
        first = min(seen, key=seen.__getitem__)
        paths[first] += 1
        if fault.start > 0:
            detect.append((seen[first] - fault.start) / HOUR)
    return FoundBy(
        paths["in_job"],
        paths["by_checks"],
        paths["passive"],
        missed,
        removed_unnamed,
        Distribution.of(detect),
    )


def _with_start(engine: Engine, stats: Stats) -> list[tuple[FaultTimes, float]]:
    by_id = {fault.id: fault.start for fault in engine.faults}
    return [(times, by_id[fault_id]) for fault_id, times in stats.fault_times.items()]


def _node_hours(books: list[tuple[Job, JobBooks]]) -> dict[str, float]:
    """The jobs' node-hours in the measured days, by kind."""
    kinds = ("done", "lost", "restarting", "deep_wait", "running")
    return {kind: sum(getattr(b, kind) * job.nodes for job, b in books) for kind in kinds}


def _interruption_rate(books: list[tuple[Job, JobBooks]]) -> float:
    """Job interruptions per 1,000 node-days the jobs held (running or starting up)."""
    node_days = sum((b.running + b.restarting) * job.nodes for job, b in books) / 24
    interruptions = sum(b.interruptions for _, b in books)
    return 1000 * interruptions / node_days if node_days > 0 else 0.0


def _mttf(books: list[tuple[Job, JobBooks]], *, attributed: bool) -> dict[int, float]:
    """Job mean time to failure by job size: hours on nodes per interruption."""
    exposure: dict[int, float] = defaultdict(float)
    hits: dict[int, int] = defaultdict(int)
    for job, b in books:
        exposure[job.nodes] += b.running + b.restarting
        hits[job.nodes] += b.attributed_interruptions if attributed else b.interruptions
    return {n: exposure[n] / hits[n] for n in sorted(exposure) if hits[n]}


def _daily(engine: Engine, stats: Stats) -> list[float]:
    per_day = int(24 * HOUR // BIN_S)
    bins = stats.availability_bins  # from the measured days' first hour
    measured = engine.horizon - engine.warmup
    slots = len(engine.slots)
    days = []
    for first in range(0, len(bins), per_day):
        chunk = bins[first : first + per_day]
        span = min(len(chunk) * BIN_S, measured - first * BIN_S)
        if span > 0:
            days.append(sum(chunk) / (slots * span))
    return days


def most_in_window(times: list[float], window: float) -> int:
    """The most of ``times`` (sorted) within any span shorter than ``window``."""
    most = first = 0
    for last, t in enumerate(times):
        while t - times[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most
