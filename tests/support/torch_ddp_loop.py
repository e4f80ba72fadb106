"""A real torch.distributed training run for the rank-loss test: DDP over gloo on CPU.

Started by ``torchrun`` under ``gpuguard run``. Rank 0 keeps the checkpoint (every
``--interval`` steps, through gpuguard.training's Checkpointer) and the log, in the format
of tests/support/train_loop.py (``start PID RESTART RESUMED_AFTER``, then one line per
step), so that tests/support/train_interruptions.read_runs reads it; rank 1 writes its pid
to ``--victim-pid``, for the test to kill. Every rank resumes from the newest checkpoint.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gpuguard.training import RESTART_COUNT_ENV, Checkpointer, Heartbeat

SEED = 20261203


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED * 1000 + step * 16 + rank)
    x = torch.randn(32, 8, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--interval", type=int, required=True)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--progress-log", type=Path, required=True)
    parser.add_argument("--victim-pid", type=Path, required=True)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    checkpointer = Checkpointer(keep=2)
    restored = checkpointer.restore()
    start = 1
    if restored is not None:
        model.load_state_dict(restored.state["model"])
        optimizer.load_state_dict(restored.state["optimizer"])
        start = restored.step + 1
    ddp = DistributedDataParallel(model)
    if rank == 1:
        args.victim_pid.write_text(str(os.getpid()))
    log = args.progress_log.open("a", buffering=1) if rank == 0 else None
    heartbeat = Heartbeat(min_interval_s=0)
    restart = os.environ.get(RESTART_COUNT_ENV, "0")
    if log is not None:
        log.write(f"start {os.getpid()} {restart} {start - 1}\n")
    for step in range(start, args.steps + 1):
        x, y = batch(step, rank)
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()  # the all-reduce of every gradient
        optimizer.step()
        time.sleep(args.step_seconds)
        if log is not None:
            log.write(f"{step}\n")
            heartbeat.beat(step)
            if step % args.interval == 0:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                checkpointer.save(step, state, blocking=True)
        dist.barrier()  # no rank runs ahead of rank 0's checkpoint
    checkpointer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
