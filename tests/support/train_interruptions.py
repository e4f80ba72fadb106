"""Interrupting a training job under ``gpuguard run`` at random points, and reading its log.

Shared by the job-recovery tests (NumPy) and ``bench/gpu_interrupted_training.py``
(PyTorch on a GPU). The job's log has one line ``start PID RESTART RESUMED_AFTER`` per run,
then one line per executed step; see ``tests/support/train_loop.py``.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Run:
    pid: int
    restart: int
    resumed_after: int
    steps: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Interruption:
    step: int
    signal: signal.Signals


def read_runs(log: Path) -> list[Run]:
    """The runs in the log so far (a line still being written is left out)."""
    runs: list[Run] = []
    text = log.read_text() if log.exists() else ""
    for line in text.split("\n")[:-1]:
        parts = line.split()
        if parts[0] == "start":
            runs.append(Run(int(parts[1]), int(parts[2]), int(parts[3])))
        else:
            runs[-1].steps.append(int(parts[0]))
    return runs


def random_plan(seed: int, count: int, first: int, last: int) -> list[Interruption]:
    """``count`` interruptions at random steps in [first, last), one per equal stretch and
    at least 4 steps apart, so that each run gets past the previous one (progress, for the
    launcher); half by SIGKILL and half by SIGTERM, in a random order."""
    rng = random.Random(seed)
    width = (last - first) // count
    assert width >= 4, "too many interruptions for the range"
    kinds = [signal.SIGKILL, signal.SIGTERM] * (count // 2) + [signal.SIGKILL] * (count % 2)
    rng.shuffle(kinds)
    return [
        Interruption(first + i * width + rng.randrange(2, width - 1), kinds[i])
        for i in range(count)
    ]


def interrupt(
    log: Path,
    launcher: subprocess.Popen[bytes],
    plan: list[Interruption],
    *,
    seed: int,
    step_seconds: float,
    timeout_s: float,
) -> None:
    """Send each planned signal to the job's current process once it has logged the
    planned step (plus a random fraction of a step), then wait for the next run to start."""
    rng = random.Random(seed)
    for interruption in plan:
        runs = _wait_for(
            log,
            launcher,
            lambda runs, i=interruption: (
                bool(runs and runs[-1].steps) and runs[-1].steps[-1] >= i.step
            ),
            timeout_s,
            f"step {interruption.step}",
        )
        time.sleep(rng.uniform(0, step_seconds))
        os.kill(runs[-1].pid, interruption.signal)
        started = len(runs)
        _wait_for(
            log,
            launcher,
            lambda runs, n=started: len(runs) > n,
            timeout_s,
            f"run {started + 1} after {interruption.signal.name}",
        )


def recomputed_steps(runs: list[Run]) -> list[int]:
    """Per interruption: steps the previous run had done that the next one did again."""
    return [
        max(before.steps[-1] - after.resumed_after, 0) if before.steps else 0
        for before, after in itertools.pairwise(runs)
    ]


def _wait_for(
    log: Path,
    launcher: subprocess.Popen[bytes],
    condition: Callable[[list[Run]], bool],
    timeout_s: float,
    what: str,
) -> list[Run]:
    deadline = time.monotonic() + timeout_s
    while True:
        runs = read_runs(log)
        if condition(runs):
            return runs
        if launcher.poll() is not None:
            raise AssertionError(f"gpuguard run exited ({launcher.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s} s")
        time.sleep(0.005)
