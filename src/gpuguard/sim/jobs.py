"""The workload: training jobs of many sizes and lengths, and each job's progress.

Progress is counted in hours of work at full speed. A job saves a checkpoint every
``checkpoint_interval`` of wall time while it runs; an interruption rolls it back to the
last one. A synchronous job runs at the pace of its slowest node (zero while one hangs).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import astuple, dataclass, field, replace
from enum import StrEnum

import numpy as np

from gpuguard.sim.faults import DAY, GPUS_PER_NODE, HOUR
from gpuguard.sim.scenario import Jobs, JobSize, Scenario


class JobState(StrEnum):
    QUEUED = "queued"  # never started
    RESTARTING = "restarting"  # placed, initialising (restart overhead)
    RUNNING = "running"
    WAITING = "waiting"  # interrupted, waiting for capacity to restart
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class JobBooks:
    """A job's books at one moment: hours per node (the stretch it is in counted up to
    then) and interruptions. The difference of two is what happened between them."""

    done: float  # work at full speed that stands (saved, or run in the current stretch)
    lost: float
    restarting: float
    deep_wait: float
    running: float
    interruptions: int
    attributed_interruptions: int

    def __sub__(self, earlier: JobBooks) -> JobBooks:
        return JobBooks(*(a - b for a, b in zip(astuple(self), astuple(earlier), strict=True)))


NO_BOOKS = JobBooks(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)


@dataclass(slots=True)  # hundreds of thousands in a long run: no per-job dict
class Job:
    id: int
    nodes: int
    work_h: float
    arrival: float
    gpus: int = GPUS_PER_NODE  # GPUs it asks for on each node (fewer: a sub-node job)
    state: JobState = JobState.QUEUED
    slots: list[int] = field(default_factory=list)
    saved_h: float = 0.0  # progress at the last checkpoint (what survives an interruption)
    segment_start: float = 0.0  # when the current productive stretch began
    pieces: list[tuple[float, float]] = field(default_factory=list)  # (from, speed) this stretch
    speed: float = 1.0
    placed_at: float = 0.0
    starts_at: float = 0.0  # its start-up begins (later than placed_at: a deep run was on)
    first_start: float | None = None
    ended_at: float | None = None
    retries: int = 0
    interruptions: int = 0
    attributed_interruptions: int = 0  # caused by a fault of a class the literature counts
    lost_h: float = 0.0  # work rolled back
    lost_wall_h: float = 0.0  # wall hours run since the last checkpoint when interrupted
    overhead_h: float = 0.0  # wall hours spent restarting
    deep_wait_h: float = 0.0  # wall hours placed but waiting for a deep run to end
    running_h: float = 0.0  # wall hours in productive stretches
    waiting_since: float | None = None
    failure: str = ""

    @property
    def finished(self) -> bool:
        return self.state in (JobState.SUCCEEDED, JobState.FAILED)

    def start_up_until(self, t: float) -> None:
        """Count a placement that ends at ``t``: the wait for a deep run, then start-up."""
        wait, start_up = self._placement_h(t)
        self.deep_wait_h += wait
        self.overhead_h += start_up

    def _placement_h(self, t: float) -> tuple[float, float]:
        """Hours of the current placement by ``t``: waiting for a deep run, starting up."""
        return (min(t, self.starts_at) - self.placed_at) / HOUR, max(0.0, t - self.starts_at) / HOUR

    def booked(self) -> JobBooks:
        """The books as they stand (after ``Scheduler.close_books``, the run's)."""
        return JobBooks(
            self.saved_h,
            self.lost_h,
            self.overhead_h,
            self.deep_wait_h,
            self.running_h,
            self.interruptions,
            self.attributed_interruptions,
        )

    def books_at(self, t: float) -> JobBooks:
        """The books as closing them at ``t`` would leave them, the job left as it is."""
        books = self.booked()
        if self.state is JobState.RUNNING:
            running = books.running + (t - self.segment_start) / HOUR
            return replace(books, done=self.progress_at(t), running=running)
        if self.state is JobState.RESTARTING:
            wait, start_up = self._placement_h(t)
            return replace(
                books, deep_wait=books.deep_wait + wait, restarting=books.restarting + start_up
            )
        return books

    def progress_at(self, t: float) -> float:
        """Work done by ``t`` within the current stretch (``t`` not before its start)."""
        pieces = self.pieces
        if len(pieces) == 1:  # most stretches keep one pace: the loop below, unrolled
            start, speed = pieces[0]
            lapsed = t - start
            return self.saved_h + speed * (lapsed if lapsed > 0.0 else 0.0) / HOUR
        done = self.saved_h
        for (start, speed), (end, _) in zip(self.pieces, [*self.pieces[1:], (t, 0.0)], strict=True):
            done += speed * max(0.0, min(end, t) - start) / HOUR
        return done

    def last_checkpoint(self, t: float, interval_s: float) -> float:
        """Wall time of the last checkpoint of the current stretch at or before ``t``."""
        return self.segment_start + math.floor((t - self.segment_start) / interval_s) * interval_s


@dataclass(frozen=True)
class Workload:
    """A seed's jobs before the run, as arrays (a large run has about a million): each
    policy's run starts from Jobs of its own, built from these."""

    nodes: np.ndarray
    work_h: np.ndarray
    arrival: np.ndarray
    gpus: np.ndarray

    @classmethod
    def of(cls, jobs: list[Job]) -> Workload:
        return cls(
            np.array([job.nodes for job in jobs], dtype=np.int64),
            np.array([job.work_h for job in jobs], dtype=np.float64),
            np.array([job.arrival for job in jobs], dtype=np.float64),
            np.array([job.gpus for job in jobs], dtype=np.int64),
        )

    def jobs(self) -> list[Job]:
        """The jobs, unstarted, in arrival order (ids as generated)."""
        columns = zip(
            self.nodes.tolist(),
            self.work_h.tolist(),
            self.arrival.tolist(),
            self.gpus.tolist(),
            strict=True,
        )
        return [
            Job(id=i, nodes=nodes, work_h=work, arrival=at, gpus=gpus)
            for i, (nodes, work, at, gpus) in enumerate(columns)
        ]


def generate_jobs(scenario: Scenario, rng: np.random.Generator) -> list[Job]:
    """The run's jobs in arrival order: enough at the start to fill the target share of
    the fleet, then Poisson arrivals that keep asking for it."""
    jobs_config = scenario.jobs
    mix = jobs_config.mix
    probabilities = _size_probabilities(mix)
    mean_node_hours = sum(
        p * size.nodes * _mean_log_uniform(*size.hours)
        for p, size in zip(probabilities, mix, strict=True)
    )
    wanted = jobs_config.utilisation * scenario.fleet.nodes
    jobs: list[Job] = []

    def new_job(at: float, chances: list[float], left: float = 1.0) -> None:
        size = mix[_draw(rng, chances)]
        low, high = size.hours
        work = math.exp(rng.uniform(math.log(low), math.log(high))) if high > low else low
        jobs.append(Job(id=len(jobs), nodes=size.nodes, work_h=work * left, arrival=at))

    # At the start the fleet is already busy as in steady state: each size holds its share
    # of the nodes, each job part-way through its work.
    busy = np.array([s.share / s.nodes for s in mix])
    busy_cdf = _cdf(busy / busy.sum())
    asked = 0
    while asked < wanted and wanted > 0:
        new_job(0.0, busy_cdf, left=float(rng.uniform(0.05, 1.0)))
        asked += jobs[-1].nodes
    if asked > wanted and len(jobs) > 1:
        asked -= jobs.pop().nodes
    per_hour = wanted / mean_node_hours if mean_node_hours > 0 else 0.0
    t = 0.0
    horizon = scenario.span_days * DAY
    arrival_cdf = _cdf(probabilities)
    while per_hour > 0:
        t += rng.exponential(HOUR / per_hour)
        if t >= horizon:
            break
        new_job(t, arrival_cdf)
    _sub_node(jobs, jobs_config.sub_node_share, scenario.seed)
    return jobs


def _sub_node(jobs: list[Job], share: float, seed: int) -> None:
    """Some 1-node jobs ask for 1-7 GPUs, drawn apart so the rest of the workload is the
    same with or without them."""
    if share <= 0:
        return
    rng = np.random.default_rng([seed, 3])
    for job in jobs:
        if job.nodes == 1 and rng.random() < share:
            job.gpus = int(rng.integers(1, GPUS_PER_NODE))


def _cdf(probabilities: np.ndarray) -> list[float]:
    """The cumulative distribution ``Generator.choice`` builds from ``p`` on every call."""
    cdf = probabilities.cumsum()
    cdf /= cdf[-1]
    return [float(c) for c in cdf]


def _draw(rng: np.random.Generator, cdf: list[float]) -> int:
    """``rng.choice(len(cdf), p=...)`` as numpy draws it (one ``random()``, then the first
    bin past it), the same number from the same stream without re-checking ``p`` each
    time: the generator draws hundreds of thousands of jobs in a long run."""
    return bisect.bisect_right(cdf, rng.random())


def _size_probabilities(mix: tuple[JobSize, ...]) -> np.ndarray:
    """Shares are of node-hours; the chance of drawing a size is share / its node-hours."""
    weights = np.array([s.share / (s.nodes * _mean_log_uniform(*s.hours)) for s in mix])
    return np.asarray(weights / weights.sum())


def _mean_log_uniform(low: float, high: float) -> float:
    return low if high <= low else (high - low) / math.log(high / low)


def effective_speed(jobs: Jobs) -> float:
    """The share of a running stretch left after blocking checkpoint saves."""
    interval = jobs.checkpoint_interval_min * 60.0
    return max(0.0, 1.0 - jobs.checkpoint_cost_s / interval)
