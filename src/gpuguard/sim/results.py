"""From one engine run to the reported numbers (the SLIs of ``gpuguard.sli``, and more)."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

from gpuguard.sim.engine import BIN_S, Engine, FaultTimes, HiddenTimes, Stats
from gpuguard.sim.faults import HIDDEN_CLASSES, HOUR, Fault, Fix
from gpuguard.sim.jobs import Job, JobBooks, JobState
from gpuguard.sli import job_success_rate, ratio

GPUS_PER_NODE = 8
# Job size classes by GPUs (lower bounds), after the literature's split of small jobs from
# the 512+ GPU runs whose failures dominate GPU-hours (Kokolis et al., HPCA'25). A whole
# node is 8 GPUs, so the simulator's jobs start in the second class.
SIZE_CLASSES = ((1, "1-7"), (8, "8-127"), (128, "128-511"), (512, "512+"))


def size_class(gpus: int) -> str:
    label = SIZE_CLASSES[0][1]
    for low, name in SIZE_CLASSES:
        if gpus >= low:
            label = name
    return label


# Where the fleet's GPU-hours went, in the order the report stacks them.
GPU_HOUR_KINDS = (
    "useful",
    "failed_jobs_work",  # work a job did and kept, thrown away when it failed later
    "lost_work",
    "restarting",
    "deep_run_wait",  # placed on a node during a scheduled deep run, waiting for its end
    "stalled_or_slow",
    "out_of_service",
    "idle",
)


@dataclass
class Distribution:
    count: int
    mean: float
    p50: float
    p90: float
    values: list[float] = field(repr=False)

    @classmethod
    def of(cls, values: list[float]) -> Distribution:
        if not values:
            return cls(0, 0.0, 0.0, 0.0, [])
        ordered = sorted(values)
        return cls(
            len(ordered),
            statistics.fmean(ordered),
            _quantile(ordered, 0.5),
            _quantile(ordered, 0.9),
            ordered,
        )

    def to_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "p50": self.p50, "p90": self.p90}


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class MlGoodput:
    """Google's ML productivity goodput of the jobs, node-weighted: **scheduling** (time
    holding the nodes over the job's wall time), **runtime** (productive runtime over the
    time holding them) and **program** (work done at the job's healthy pace over its
    productive runtime: slow GPUs and checkpoint saves lower it). Their product is the
    effective training time (docs/simulator.md, "Definitions")."""

    scheduling: float
    runtime: float
    program: float

    @classmethod
    def of(cls, started: list[Job], horizon: float) -> MlGoodput:
        wall = holding = productive = useful = 0.0
        for job in started:
            end = job.ended_at if job.ended_at is not None else horizon
            wall += (end - (job.first_start or 0.0)) / HOUR * job.nodes
            holding += (job.running_h + job.overhead_h + job.deep_wait_h) * job.nodes
            productive += (job.running_h - job.lost_wall_h) * job.nodes
            useful += job.saved_h * job.nodes
        return cls(ratio(holding, wall), ratio(productive, holding), ratio(useful, productive))


@dataclass
class PolicyResult:
    policy: str
    gpu_node_availability: float
    slot_availability: float
    job_success_rate: float
    # Ended jobs weighted by their work (GPU-hours at full speed), and by size class.
    job_success_by_gpu_hours: float
    job_success_by_size: dict[str, SizeOutcome]
    ettr: float  # Meta's: productive runtime / wall time (a slow GPU's time is productive)
    effective: float  # gpuguard's stricter: work done at full speed / wall time
    effective_failed_lost: float  # the same, a failed job's work lost (its wall time stays)
    goodput: float  # useful GPU-hours (failed jobs' left out) / all, idle ones included
    # Google's ML goodput of the jobs, its three factors (their product is ``effective``).
    ml_goodput: MlGoodput
    mttr_hours: float
    false_drains_per_node_day: float
    time_to_detect_h: Distribution
    time_to_quarantine_h: Distribution
    time_to_repair_h: Distribution
    unrepaired_faults: int
    gpu_hours: dict[str, float]
    actions: dict[str, int]
    breaker_trips: int
    jobs: dict[str, int]
    job_failures: dict[str, int]
    job_mttf_h: dict[int, float]
    attributed_job_mttf_h: dict[int, float]
    interruptions: int
    interruptions_per_1000_node_days: float  # of the jobs' nodes (Meta's normalisation)
    faults: int
    decide_calls: int
    availability_by_day: list[float]
    hidden_faults: dict[str, HiddenFaults]
    deep_runs: dict[str, int]
    # Node-hours from each disabling fault's start to back in service (or the run's end).
    repair_node_hours_by_class: dict[str, float]
    false_verdicts_per_node_day: float = 0.0  # in-job verdicts naming a healthy GPU
    # Fault interruptions as the attribution judged them (gpuguard), and crash memory.
    attribution: dict[str, int] = field(default_factory=dict)
    crash_suspicions_per_node_day: float = 0.0
    false_suspicions_per_node_day: float = 0.0
    spares_taken: int = 0  # warm spares interrupted jobs took
    locus: LocusFigures | None = None  # replacements against the faults they are for

    def to_dict(self) -> dict[str, object]:
        return {
            "gpu_node_availability": self.gpu_node_availability,
            "slot_availability": self.slot_availability,
            "job_success_rate": self.job_success_rate,
            "job_success_by_gpu_hours": self.job_success_by_gpu_hours,
            "job_success_by_size": {k: v.to_dict() for k, v in self.job_success_by_size.items()},
            "ettr": self.ettr,
            "effective_training_time": self.effective,
            "effective_training_time_failed_work_lost": self.effective_failed_lost,
            "goodput": self.goodput,
            "ml_goodput": asdict(self.ml_goodput),
            "mttr_hours": self.mttr_hours,
            "false_drains_per_node_day": self.false_drains_per_node_day,
            "time_to_detect_hours": self.time_to_detect_h.to_dict(),
            "time_to_quarantine_hours": self.time_to_quarantine_h.to_dict(),
            "time_to_repair_hours": self.time_to_repair_h.to_dict(),
            "unrepaired_faults": self.unrepaired_faults,
            "gpu_hours": self.gpu_hours,
            "disruptive_actions": self.actions,
            "breaker_trips": self.breaker_trips,
            "jobs": self.jobs,
            "job_failures": self.job_failures,
            "job_mttf_hours_by_nodes": {str(k): v for k, v in self.job_mttf_h.items()},
            "job_interruptions": self.interruptions,
            "job_interruptions_per_1000_node_days": self.interruptions_per_1000_node_days,
            "faults": self.faults,
            "decide_calls": self.decide_calls,
            "hidden_faults": {k: v.to_dict() for k, v in self.hidden_faults.items()},
            "deep_suite_runs": self.deep_runs,
            "repair_node_hours_by_class": self.repair_node_hours_by_class,
            "in_job_false_verdicts_per_node_day": self.false_verdicts_per_node_day,
            "locus": self.locus.to_dict() if self.locus is not None else None,
            "attribution": self.attribution,
            "crash_suspicions_per_node_day": self.crash_suspicions_per_node_day,
            "false_suspicions_per_node_day": self.false_suspicions_per_node_day,
            "spares_taken": self.spares_taken,
        }


REPLACEMENT_WINDOW_S = 7 * 24 * HOUR


@dataclass
class LocusFigures:
    """Automatic replacements against the faults only a new machine clears (issue 25).

    ``machine_faults``: faults of the machine itself (not of its position, its domain or
    the job; benign signals are none) that were on a node during the run, those the fleet
    carried at the start included; ``machine_faults_replace``: those of them whose fix is
    new hardware. ``max_per_position_7d``: the most automatic replacements of one slot's
    machine within any 7 days."""

    replacements: int
    machine_faults: int
    machine_faults_replace: int
    max_per_position_7d: int

    @property
    def ratio(self) -> float | None:
        """Automatic replacements per machine fault (None: no machine fault)."""
        return self.replacements / self.machine_faults if self.machine_faults else None

    def to_dict(self) -> dict[str, object]:
        return {
            "automatic_replacements": self.replacements,
            "machine_faults": self.machine_faults,
            "machine_faults_needing_replace": self.machine_faults_replace,
            "replacements_per_machine_fault": self.ratio,
            "max_replacements_per_position_7d": self.max_per_position_7d,
        }


def most_in_window(times: list[float], window: float) -> int:
    """The most of ``times`` (sorted) within any span shorter than ``window``."""
    most = first = 0
    for last, t in enumerate(times):
        while t - times[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most


@dataclass
class SizeOutcome:
    """Ended jobs of one size class."""

    succeeded: int
    failed: int

    @property
    def rate(self) -> float | None:
        """None when no job of the class ended (not a perfect score)."""
        ended = self.succeeded + self.failed
        return job_success_rate(self.succeeded, self.failed) if ended else None

    def to_dict(self) -> dict[str, float | None]:
        return {"succeeded": self.succeeded, "failed": self.failed, "rate": self.rate}


@dataclass
class FoundBy:
    """Persistent hidden faults by the platform path that named each first; ``missed``:
    none did (``removed_unnamed`` of them were taken away unnamed: a repair for another
    fault, or people after a job's owners traced bad results). Time to detect is from
    onset, for faults that began during the run (those a fleet carries at the start have
    no known onset)."""

    in_job: int
    deep_suite: int
    passive: int
    missed: int
    removed_unnamed: int
    time_to_detect_h: Distribution

    @property
    def faults(self) -> int:
        return self.in_job + self.deep_suite + self.passive + self.missed

    @property
    def found_share(self) -> float | None:
        return (self.faults - self.missed) / self.faults if self.faults else None

    def to_dict(self) -> dict[str, object]:
        return {
            "faults": self.faults,
            "found_in_job": self.in_job,
            "found_by_deep_suite": self.deep_suite,
            "found_by_passive_telemetry": self.passive,
            "missed": self.missed,
            "missed_but_removed_otherwise": self.removed_unnamed,
            "found_share": self.found_share,
            "time_to_detect_hours": self.time_to_detect_h.to_dict(),
        }


@dataclass
class HiddenFaults:
    """SDC or fail-slow faults of one run: how many, who found them, how many were fixed."""

    faults: int
    found_by_checks: int
    found_by_jobs: int
    removed: int
    time_to_find_h: Distribution  # by the platform's checks
    time_to_remove_h: Distribution  # until repaired or replaced away
    # The faults that stay until repaired (every SDC; fail-slow without the transient ones),
    # by the path that named each first (``sim/in_job.py``, ``sim/deep_suite.py``).
    persistent: FoundBy

    def to_dict(self) -> dict[str, object]:
        return {
            "faults": self.faults,
            "found_by_checks": self.found_by_checks,
            "found_by_jobs": self.found_by_jobs,
            "removed": self.removed,
            "time_to_find_by_checks_hours": self.time_to_find_h.to_dict(),
            "time_to_remove_hours": self.time_to_remove_h.to_dict(),
            "persistent": self.persistent.to_dict(),
        }


def summarise(engine: Engine) -> PolicyResult:
    """The figures of the measured days: the warm-up's jobs, faults and time left out."""
    scenario = engine.scenario
    stats = engine.measured_stats()
    nodes = scenario.fleet.nodes
    node_days = nodes * scenario.days
    jobs = engine.measured_jobs()
    states = Counter(job.state for job in jobs)
    succeeded, failed = states[JobState.SUCCEEDED], states[JobState.FAILED]
    started = [job for job in jobs if job.first_start is not None]
    productive = sum((job.running_h - job.lost_wall_h) * job.nodes for job in started)
    kept = sum(job.saved_h * job.nodes for job in started if job.state is not JobState.FAILED)
    wall = sum(
        ((job.ended_at if job.ended_at is not None else engine.horizon) - job.first_start)
        / HOUR
        * job.nodes
        for job in started
        if job.first_start is not None
    )
    fleet_node_hours = node_days * 24.0
    books = engine.measured_books()
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
    fault_times = list(_with_start(engine, stats))
    repaired = [(t.repaired - start) / HOUR for t, start in fault_times if t.repaired is not None]
    return PolicyResult(
        policy=engine.driver.name,
        gpu_node_availability=engine.machine_share.share,
        slot_availability=engine.slot_share.share,
        job_success_rate=job_success_rate(succeeded, failed),
        job_success_by_gpu_hours=_success_by_work(jobs),
        job_success_by_size=_success_by_size(jobs),
        ettr=ratio(productive, wall),
        effective=ratio(sum(job.saved_h * job.nodes for job in started), wall),
        effective_failed_lost=ratio(kept, wall),
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
        jobs={
            "succeeded": succeeded,
            "failed": failed,
            "unfinished": len(jobs) - succeeded - failed,
        },
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
        locus=LocusFigures(
            replacements=stats.actions["replace"],
            machine_faults=stats.machine_faults,
            machine_faults_replace=stats.machine_faults_replace,
            max_per_position_7d=max(
                (most_in_window(t, REPLACEMENT_WINDOW_S) for t in stats.replaced_at.values()),
                default=0,
            ),
        ),
    )


def _success_by_work(jobs: list[Job]) -> float:
    done = {JobState.SUCCEEDED: 0.0, JobState.FAILED: 0.0}
    for job in jobs:
        if job.state in done:
            done[job.state] += job.work_h * job.nodes
    return ratio(done[JobState.SUCCEEDED], sum(done.values()))


def _success_by_size(jobs: list[Job]) -> dict[str, SizeOutcome]:
    outcomes = {name: SizeOutcome(0, 0) for _, name in SIZE_CLASSES}
    for job in jobs:
        if job.state is JobState.SUCCEEDED:
            outcomes[size_class(job.nodes * GPUS_PER_NODE)].succeeded += 1
        elif job.state is JobState.FAILED:
            outcomes[size_class(job.nodes * GPUS_PER_NODE)].failed += 1
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
