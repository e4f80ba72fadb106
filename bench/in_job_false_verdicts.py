"""How often the real straggler judge names a healthy rank: a soak of fault-free jobs with
noise, the rate per node-day and its one-sided 95 % upper bound (the simulator's
``in_job.false_verdicts_per_node_day`` default; docs/simulator.md, "in_job").

Each job has ``--ranks`` ranks, 8 to a node, each window ``--window-steps`` steps of
``--step-s`` seconds (the simulator's and the monitor's defaults). No rank is ever slow,
but the noise a fleet shows is there:

- every GPU's own pace, fixed for the job: normal, 2 % standard deviation (GPUs of one
  model differ by a few per cent);
- every step's jitter: log-normal, 3 %;
- hiccups: 1 % of a rank's steps take 1.5-4 times as long (a garbage collection, a slow
  batch from the data loader, a checkpoint write on one rank);
- job-wide phases: every 200-2,000 windows the whole job's pace changes by -20 % to +25 %
  (a new sequence length, an evaluation pass);
- communication: each rank's own share of the collective, log-normal around 10 % of a
  step, 20 % jitter.

A rank named while nothing is wrong is a false verdict. The windows' medians are taken as
`StepTimer` takes them, and the judge is `gpuguard.training.straggler.StragglerJudge`
with its default policy, so the figure follows the product.

    .venv/bin/python bench/in_job_false_verdicts.py                 # 12 min on 2 cores
    .venv/bin/python bench/in_job_false_verdicts.py --jobs 4 --windows 2000
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

from gpuguard.training.step_timer import WindowRecord
from gpuguard.training.straggler import StragglerJudge

RANKS_PER_NODE = 8
DAY_S = 86400.0


def _soak(seed: int, ranks: int, windows: int, steps: int) -> tuple[int, int]:
    """One fault-free job: (false verdicts, rank-windows judged)."""
    rng = random.Random(seed)
    judge = StragglerJudge(ranks)
    pace = [rng.gauss(1.0, 0.02) for _ in range(ranks)]
    phase, phase_left = 1.0, rng.randint(200, 2000)
    named: set[int] = set()
    false = 0
    for window in range(windows):
        phase_left -= 1
        if phase_left <= 0:
            phase, phase_left = rng.uniform(0.8, 1.25), rng.randint(200, 2000)
        table = []
        for rank in range(ranks):
            compute = []
            for _ in range(steps):
                step = phase * pace[rank] * rng.lognormvariate(0.0, 0.03)
                if rng.random() < 0.01:
                    step *= rng.uniform(1.5, 4.0)
                compute.append(step)
            comm = [0.1 * phase * rng.lognormvariate(0.0, 0.2) for _ in range(steps)]
            first = window * steps
            table.append(
                WindowRecord(
                    rank,
                    first,
                    first + steps - 1,
                    steps,
                    statistics.median(compute),
                    statistics.median(comm),
                )
            )
        now = set(judge.judge(table))
        false += len(now - named)
        named = now
    return false, ranks * windows


def upper_bound(events: int, exposure: float, confidence: float = 0.95) -> float:
    """One-sided upper bound of a Poisson rate: the rate at which ``events`` or fewer
    would be seen in ``exposure`` with probability ``1 - confidence``."""

    def at_most(rate: float) -> float:
        mean = rate * exposure
        return sum(
            math.exp(-mean + k * math.log(mean) - math.lgamma(k + 1)) for k in range(events + 1)
        )

    low, high = 0.0, (events + 10) * 10 / exposure
    for _ in range(100):
        mid = (low + high) / 2
        if at_most(mid) > 1 - confidence:
            low = mid
        else:
            high = mid
    return high


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=240)
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--windows", type=int, default=20000)
    parser.add_argument("--window-steps", type=int, default=6)
    parser.add_argument("--step-s", type=float, default=5.0)
    args = parser.parse_args()
    started = time.monotonic()
    with ProcessPoolExecutor() as pool:
        results = list(
            pool.map(
                _soak,
                range(1, args.jobs + 1),
                [args.ranks] * args.jobs,
                [args.windows] * args.jobs,
                [args.window_steps] * args.jobs,
            )
        )
    false = sum(f for f, _ in results)
    rank_windows = sum(n for _, n in results)
    window_s = args.window_steps * args.step_s
    node_days = rank_windows * window_s / RANKS_PER_NODE / DAY_S
    bound = upper_bound(false, node_days)
    print(
        f"{args.jobs} fault-free jobs of {args.ranks} ranks, {args.windows} windows of"
        f" {args.window_steps} x {args.step_s:g} s each: {rank_windows:,} rank-windows,"
        f" {node_days:,.1f} node-days"
    )
    print(
        f"false verdicts {false}: {false / node_days:.5f} per node-day,"
        f" one-sided 95 % upper bound {bound:.5f} per node-day"
    )
    print(f"wall {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
