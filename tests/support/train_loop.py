"""A small, real training loop for the job-recovery tests: a NumPy MLP trained by SGD.

Deterministic: the batch of step k depends only on (SEED, k), and the whole state
(parameters and momentum) is in the checkpoint, so a run resumed from a checkpoint computes
exactly what an uninterrupted run does, bit for bit. Updates are in place, so an
asynchronous save that did not copy the state would write a later state than it claims.

It writes ``start PID RESTART RESUMED_AFTER`` and then each executed step to ``--log``
(one line each, so the tests can count recomputed steps and find the process to signal),
and at the end the bytes of its parameters to ``--out``. Run it under ``gpuguard run``,
or alone with ``GPUGUARD_CHECKPOINT_DIR`` set.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from gpuguard.training import RESTART_COUNT_ENV, Checkpointer, Heartbeat, Preemption

SEED = 20240611
BATCH = 32
LEARNING_RATE = 0.05
MOMENTUM = 0.9


def initial_state() -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(SEED)
    params = {
        "w1": rng.standard_normal((8, 16)) * 0.3,
        "b1": np.zeros(16),
        "w2": rng.standard_normal((16, 1)) * 0.3,
        "b2": np.zeros(1),
    }
    return {"params": params, "velocity": {k: np.zeros_like(v) for k, v in params.items()}}


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([SEED, step])
    x = rng.standard_normal((BATCH, 8))
    return x, np.sin(x.sum(axis=1, keepdims=True))


def train_step(state: dict[str, dict[str, np.ndarray]], step: int) -> float:
    p, velocity = state["params"], state["velocity"]
    x, y = batch(step)
    hidden = np.tanh(x @ p["w1"] + p["b1"])
    error = hidden @ p["w2"] + p["b2"] - y
    d_out = error / BATCH
    d_hidden = (d_out @ p["w2"].T) * (1 - hidden**2)
    grads = {
        "w2": hidden.T @ d_out,
        "b2": d_out.sum(axis=0),
        "w1": x.T @ d_hidden,
        "b1": d_hidden.sum(axis=0),
    }
    for name, grad in grads.items():
        velocity[name] *= MOMENTUM
        velocity[name] += grad
        p[name] -= LEARNING_RATE * velocity[name]
    return float((error**2).mean() / 2)


def parameter_bytes(state: dict[str, dict[str, np.ndarray]]) -> bytes:
    return b"".join(state["params"][name].tobytes() for name in sorted(state["params"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--interval", type=int, required=True, help="steps between checkpoints")
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--async", dest="asynchronous", action="store_true")
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--hang-at", type=int, help="on the first run, hang at this step")
    parser.add_argument("--fail-at", type=int, help="raise an exception at this step")
    args = parser.parse_args()

    checkpointer = Checkpointer(keep=2, asynchronous=args.asynchronous)
    restored = checkpointer.restore()
    state = restored.state if restored else initial_state()
    start = restored.step + 1 if restored else 1
    restart = int(os.environ.get(RESTART_COUNT_ENV, "0"))
    heartbeat = Heartbeat(min_interval_s=0)
    with args.log.open("a", buffering=1) as log, Preemption() as preemption:
        log.write(f"start {os.getpid()} {restart} {start - 1}\n")
        for step in range(start, args.steps + 1):
            if step == args.hang_at and restart == 0:
                time.sleep(3600)  # stands for a collective that never returns
            if step == args.fail_at:
                raise RuntimeError(f"loss became NaN at step {step}")
            train_step(state, step)
            time.sleep(args.step_seconds)
            log.write(f"{step}\n")
            heartbeat.beat(step)
            if preemption.should_stop():
                checkpointer.save(step, state, blocking=True)
                preemption.exit()
            if step % args.interval == 0:
                checkpointer.save(step, state)
    checkpointer.close()
    args.out.write_bytes(parameter_bytes(state))


if __name__ == "__main__":
    main()
