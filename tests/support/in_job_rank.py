"""One rank of a small synchronous data-parallel NumPy job, with the in-job monitor on.

Each step computes a linear model's gradient on a batch (NumPy), then "runs on the GPU"
for ``--step-s`` seconds with realistic jitter (a sleep: device time leaves the CPU free,
as a kernel does; 16 ranks on two cores could not share a CPU-bound step fairly), then
averages the gradients over all ranks through a loopback all-gather (the job's own
collective, on ``--allreduce-port``) and applies them, so the replicas stay bit-identical.

Faults, one rank each: ``--slow-rank`` is ``--slow-factor`` times slower from
``--slow-from`` until ``--slow-until``; ``--corrupt-rank`` flips one bit of one parameter
after step ``--corrupt-at``, for good; ``--blip-rank`` flips one only while it fingerprints
step ``--blip-at`` (a transient that heals at once); ``--miscompute-rank`` computes every
gradient wrong (one bit of one element) from step ``--miscompute-from``, its probe's too:
the all-reduce averages that into every replica alike. Every rank runs the compute probe
(the gradient of one fixed batch, the same on all ranks) when it is due. With ``--checkpoint-file``, every rank
reports a checkpoint saved at the first step that file exists.

Run with RANK, WORLD_SIZE, GPUGUARD_EXCHANGE_PORT, NODE_NAME, GPUGUARD_GPU_PCI_BUS_ID,
GPUGUARD_JOB and GPUGUARD_IN_JOB_DIR set. Writes ``--report`` at the end: the steps at
which this rank was named and released, and every rank any window named.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from functools import partial
from pathlib import Path

import numpy as np

from gpuguard.training import JobMonitor, LoopbackExchange

FEATURES = 32
BATCH = 16
LEARNING_RATE = 0.01


def flip_bit(params: np.ndarray, index: int, bit: int = 0) -> None:
    bits = params.view(np.int64)
    bits[index] ^= 1 << bit


# The lasting corruption flips mantissa bit 20 (a relative change of about 2e-10): a flip of
# the lowest bit is rounded away by a later update now and then (in 17 of the test's 640
# rank and step choices), the replicas are identical again, and no one is left to name.
LASTING_FLIP_BIT = 20


def gradient(x: np.ndarray, y: np.ndarray, params: np.ndarray, wrong: bool) -> np.ndarray:
    result = x.T @ (x @ params - y) / BATCH
    if wrong:  # the GPU's arithmetic, not the data: the probe's gradient is wrong too
        flip_bit(result, FEATURES // 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--allreduce-port", type=int, required=True)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--step-s", type=float, default=0.02)
    parser.add_argument("--jitter", type=float, default=0.03, help="per-step lognormal sigma")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-factor", type=float, default=1.15)
    parser.add_argument("--slow-from", type=int, default=0)
    parser.add_argument("--slow-until", type=int, default=1 << 30)
    parser.add_argument("--corrupt-rank", type=int, default=-1)
    parser.add_argument("--corrupt-at", type=int, default=-1)
    parser.add_argument("--blip-rank", type=int, default=-1)
    parser.add_argument("--blip-at", type=int, default=-1)
    parser.add_argument("--miscompute-rank", type=int, default=-1)
    parser.add_argument("--miscompute-from", type=int, default=1 << 30)
    parser.add_argument("--replica-interval", type=int, default=50)
    parser.add_argument("--compute-interval", type=int, default=200)
    parser.add_argument(
        "--checkpoint-file", type=Path, help="once it exists, the job 'saves a checkpoint'"
    )
    args = parser.parse_args()

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    allreduce = LoopbackExchange(rank, world_size, args.allreduce_port, timeout_s=30)
    monitor = JobMonitor(
        replica_interval=args.replica_interval, compute_interval=args.compute_interval
    )
    noise = np.random.default_rng([args.seed, rank])
    speed = 1.0 + noise.uniform(-0.02, 0.02)  # GPUs of one model differ by a few per cent
    params = np.random.default_rng(args.seed).standard_normal(FEATURES)
    true_weights = np.linspace(-1.0, 1.0, FEATURES)
    data = np.random.default_rng([args.seed, rank])
    inputs = [data.standard_normal((BATCH, FEATURES)) for _ in range(8)]
    # Made once: the step's CPU work stays tiny, so 16 ranks on two cores do not queue for
    # a CPU, which would make the ranks scheduled last look slower.
    batches = [(x, x @ true_weights) for x in inputs]
    probe_x = np.random.default_rng([args.seed, 1 << 20]).standard_normal((BATCH, FEATURES))
    probe_y = probe_x @ true_weights  # the same batch on every rank
    named_at = released_at = checkpointed_at = None
    kinds: list[str] = []
    named_ranks: set[int] = set()
    odd_ranks: set[int] = set()

    for step in range(args.steps):
        with monitor.step(step):
            x, y = batches[step % len(batches)]
            wrong = rank == args.miscompute_rank and step >= args.miscompute_from
            local = gradient(x, y, params, wrong)
            device_s = args.step_s * speed * noise.lognormal(0.0, args.jitter)
            if noise.random() < 0.01:
                device_s *= 2  # a rare hiccup: a page fault, a late input batch
            if rank == args.slow_rank and args.slow_from <= step < args.slow_until:
                device_s *= args.slow_factor
            time.sleep(device_s)
            with monitor.communicating():
                gathered = allreduce.all_gather(local.tolist())
            params -= LEARNING_RATE * np.mean(np.array(gathered), axis=0)
        if rank == args.corrupt_rank and step == args.corrupt_at:
            flip_bit(params, FEATURES // 3, LASTING_FLIP_BIT)
        blip = rank == args.blip_rank and step == args.blip_at
        if blip:
            flip_bit(params, 1)
        rounds = monitor.check_replicas(step, {"w": params})  # fingerprints now
        if blip:
            flip_bit(params, 1)
        probe = partial(gradient, probe_x, probe_y, params, wrong)
        rounds += monitor.check_compute(step, probe)
        for result in rounds:
            odd_ranks.update(result.vote.odd)
            named_ranks.update(result.named)
        named_ranks.update(monitor.named)
        if args.checkpoint_file and checkpointed_at is None and args.checkpoint_file.exists():
            checkpointed_at = step
            monitor.checkpoint_saved(step)
        held = monitor.verdict
        if held is not None and named_at is None:
            named_at = step
        if held is not None and str(held.kind) not in kinds:
            kinds.append(str(held.kind))
        if held is None and named_at is not None and released_at is None:
            released_at = step

    monitor.close()
    allreduce.close()
    report = {
        "rank": rank,
        "named_at": named_at,
        "released_at": released_at,
        "kinds": kinds,
        "named_ranks": sorted(named_ranks),
        "odd_ranks": sorted(odd_ranks),
        "disabled": monitor.disabled,
        "fingerprint_params": params.tobytes().hex()[:32],
    }
    args.report.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
