"""Checkpoint cost on a GPU, side by side with PyTorch Distributed Checkpoint (DCP).

The same 1 GiB of CUDA tensors, saved in the same run to the same disk by:

- gpuguard ``Checkpointer`` (``torch.save``, SHA-256 while writing, fsync, rename),
  synchronous and asynchronous;
- ``torch.distributed.checkpoint.save`` and ``async_save`` (one process; a one-rank gloo
  group so that both calls have the group they expect).

For each: the time the training loop is blocked per save (the call, after the tensors
were changed and the device synchronised), the steady state being the median of saves
2..N (the first allocates staging memory), and for the asynchronous ones the time until
the background write finished. The figure compared with the goal is each tool's
asynchronous blocked time as a share of its own synchronous one.

Needs PyTorch with CUDA. Run from the repository root::

    PYTHONPATH=src python3 bench/checkpoint_vs_dcp.py [--dir DIR] [--saves N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from gpuguard.training import Checkpointer

TENSORS = 8
ELEMENTS = 32 * 2**20  # float32: 128 MiB each, 1 GiB in all


def make_state() -> dict[str, torch.Tensor]:
    generator = torch.Generator(device="cuda").manual_seed(0)
    return {
        f"layer{i}.weight": torch.rand(ELEMENTS, device="cuda", generator=generator)
        for i in range(TENSORS)
    }


def train_a_little(state: dict[str, torch.Tensor]) -> None:
    for tensor in state.values():
        tensor.mul_(0.999).add_(1e-3)
    torch.cuda.synchronize()


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    begin = time.perf_counter()
    result = call()
    return time.perf_counter() - begin, result


def steady(values: list[float]) -> float:
    return statistics.median(values[1:]) if len(values) > 1 else values[0]


def gpuguard_runs(state: dict[str, torch.Tensor], root: Path, saves: int, asynchronous: bool):
    blocked, finished = [], []
    with Checkpointer(root, keep=2, asynchronous=asynchronous) as checkpointer:
        for step in range(saves):
            train_a_little(state)
            took, _ = timed(lambda step=step: checkpointer.save(step, state))
            waited, _ = timed(checkpointer.wait)
            blocked.append(took)
            finished.append(took + waited)
    return blocked, finished


def dcp_runs(state: dict[str, torch.Tensor], root: Path, saves: int, asynchronous: bool):
    blocked, finished = [], []
    for step in range(saves):
        train_a_little(state)
        target = root / f"step-{step}"
        if asynchronous:
            took, future = timed(lambda target=target: dcp.async_save(state, checkpoint_id=target))
            waited, _ = timed(future.result)
        else:
            took, _ = timed(lambda target=target: dcp.save(state, checkpoint_id=target))
            waited = 0.0
        blocked.append(took)
        finished.append(took + waited)
        if step >= 2:  # keep the disk use bounded, like keep=2
            shutil.rmtree(root / f"step-{step - 2}", ignore_errors=True)
    return blocked, finished


def one_rank_group() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: /tmp)")
    parser.add_argument("--saves", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("checkpoint_vs_dcp: needs a CUDA GPU")
    one_rank_group()
    state = make_state()
    size = sum(t.numel() * t.element_size() for t in state.values())
    print(
        f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {os.cpu_count()} cores;"
        f" state: {TENSORS} CUDA float32 tensors, {size / 2**30:.2f} GiB; {args.saves} saves each"
    )
    results: dict[str, tuple[list[float], list[float]]] = {}
    work = Path(tempfile.mkdtemp(prefix="ckpt-vs-dcp-", dir=args.dir))
    try:
        for name, run, asynchronous in (
            ("gpuguard sync", gpuguard_runs, False),
            ("gpuguard async", gpuguard_runs, True),
            ("DCP save", dcp_runs, False),
            ("DCP async_save", dcp_runs, True),
        ):
            root = work / name.replace(" ", "-")
            root.mkdir()
            try:
                results[name] = run(state, root, args.saves, asynchronous)
            except Exception as exc:  # a peer that fails here is reported, not fatal
                print(f"{name}: FAILED: {type(exc).__name__}: {exc}")
            shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        dist.destroy_process_group()
    print(f"{'':16} {'blocked per save (s), each':40} {'steady':>8} {'until written':>14}")
    for name, (blocked, finished) in results.items():
        each = ", ".join(f"{b:.3f}" for b in blocked)
        print(f"{name:16} {each:40} {steady(blocked):8.3f} {steady(finished):14.3f}")
    for tool in ("gpuguard", "DCP"):
        sync = results.get(f"{tool} sync" if tool == "gpuguard" else "DCP save")
        asyn = results.get(f"{tool} async" if tool == "gpuguard" else "DCP async_save")
        if sync and asyn:
            share = steady(asyn[0]) / steady(sync[0])
            print(f"{tool}: asynchronous blocks for {100 * share:.1f} % of its synchronous save")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
