"""The reported figures of one policy's run (the SLIs of ``gpuguard.sli``, and more), as
``summary`` computes them and the report and the JSON show them."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from gpuguard.sim.faults import GPUS_PER_NODE as GPUS_PER_NODE  # the report's modules' source
from gpuguard.sim.faults import HOUR
from gpuguard.sim.jobs import Job
from gpuguard.sli import job_success_rate, ratio

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
    gpu: GpuFigures | None = None  # GPU slots, per-GPU quarantine, the preflight gate

    @property
    def gpu_slot_availability(self) -> float:
        return self.gpu.slot_availability if self.gpu is not None else self.slot_availability

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
            "gpu_slot_availability": self.gpu_slot_availability,
            "gpu": asdict(self.gpu) if self.gpu is not None else None,
        }


@dataclass(frozen=True)
class GpuFigures:
    """GPU-slot availability (GPUs in service over all GPUs: a node with k GPUs out alone
    serves its other 8 - k), the GPUs taken out alone and those of them escalated to the
    node, and the preflight gate's node checks, the faults it caught, its false failures,
    the starts it failed and the GPU-hours its checks held."""

    slot_availability: float
    gpus_quarantined: int
    escalations: int
    preflight_checks: int
    preflight_caught: dict[str, int]  # by fault class
    preflight_false_failures: int
    preflight_failed_starts: int
    preflight_gpu_hours: float


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
