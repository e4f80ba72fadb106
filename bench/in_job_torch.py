"""The in-job monitor in PyTorch jobs: `torch.distributed` ranks, a DDP model, and each fault
the monitor is for, one job per fault.

Every rank is a process in one ``torch.distributed`` job (gloo on 127.0.0.1, CPU tensors
by default; ``--device cuda`` puts the model on the GPU, gloo still carrying the job's
collectives). The model is a small MLP under ``DistributedDataParallel``; each step draws
the rank's own batch, runs the forward pass and ``--step-s`` of "device time" (a sleep),
then the backward pass, whose gradient all-reduce DDP overlaps with it (so the step is
marked as communicating from the backward on, as docs/in_job.md says for DDP), then the
optimiser step. The `JobMonitor` exchanges through ``torch.distributed`` (its own gloo
group), fingerprints the model's tensors, and runs the compute probe: the gradients of one
fixed batch under DDP's ``no_sync()``.

Jobs, each a fresh ``torch.distributed`` job:

- ``clean``: no fault; nobody may be named;
- ``slow``: one rank's device time 15 % longer from a random step: FAIL_SLOW within 30 steps;
- ``flip``: one rank flips one bit of one parameter: REPLICA_MISMATCH after the re-check;
- ``miscompute``: one rank's gradients of one weight get one bit flipped in the backward
  pass (a tensor hook, before DDP's all-reduce, and in the probe alike): the replicas stay
  identical, so no REPLICA_MISMATCH, and the probe names it COMPUTE_MISMATCH.

Run from the repository root with torch installed::

    PYTHONPATH=src python bench/in_job_torch.py [--ranks 4] [--device cpu|cuda]

Prints each job's outcome and PASS or FAIL; exits 0 when every job passes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPLICA_INTERVAL = 20
COMPUTE_INTERVAL = 25
RECHECK = 10
FEATURES = 64


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from gpuguard.training import BackgroundExchange, JobMonitor, fingerprint
    from gpuguard.training.exchange import open_exchange

    rank, world = args.rank, args.world
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world
    )
    torch.use_deterministic_algorithms(True)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.Tanh(), nn.Linear(FEATURES, 1))
    model = model.to(device)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    exchange = open_exchange(rank, world)  # what JobMonitor opens itself: torch's, here
    monitor = JobMonitor(
        rank=rank,
        world_size=world,
        job="bench/torch",
        node=f"node-{rank}",
        gpu=f"00000000:{0x18 + rank:02X}:00.0",
        verdict_dir=args.verdict_dir,
        replica_interval=REPLICA_INTERVAL,
        replica_recheck_after=RECHECK,
        compute_interval=COMPUTE_INTERVAL,
        exchange=BackgroundExchange(exchange),
    )
    wrong = {"on": False}

    def miscompute(gradient: torch.Tensor) -> torch.Tensor:
        if not wrong["on"]:
            return gradient
        flipped = gradient.clone()
        flipped.view(-1).view(torch.int32)[5] ^= 1  # the arithmetic, not the data
        return flipped

    if rank == args.bad_rank and args.fault == "miscompute":
        model[0].weight.register_hook(miscompute)

    probe_batch = torch.Generator().manual_seed(7)
    probe_x = torch.randn(32, FEATURES, generator=probe_batch).to(device)
    probe_y = probe_x.sum(1, keepdim=True)

    def probe() -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        with ddp.no_sync():
            loss_fn(ddp(probe_x), probe_y).backward()
        gradients = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad(set_to_none=True)
        return gradients

    jitter = random.Random(rank)
    named_at = None
    odd: set[int] = set()
    for step in range(args.steps):
        batch = torch.Generator().manual_seed(1_000_003 * rank + step)
        x = torch.randn(32, FEATURES, generator=batch).to(device)
        y = x.sum(1, keepdim=True)
        wrong["on"] = args.fault == "miscompute" and step >= args.fault_at
        with monitor.step(step):
            loss = loss_fn(ddp(x), y)
            device_s = args.step_s * jitter.lognormvariate(0.0, 0.02)
            if args.fault == "slow" and rank == args.bad_rank and step >= args.fault_at:
                device_s *= 1.15
            time.sleep(device_s)
            if device.type == "cuda":
                torch.cuda.synchronize()
            with monitor.communicating():  # DDP's all-reduce runs inside the backward
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if args.fault == "flip" and rank == args.bad_rank and step == args.fault_at:
            with torch.no_grad():
                model[2].weight.view(-1).view(torch.int32)[3] ^= 1
        for result in monitor.check_replicas(step, model) + monitor.check_compute(step, probe):
            odd.update(result.vote.odd)
        if monitor.verdict is not None and named_at is None:
            named_at = step
    parameters = list(fingerprint(model))  # the exact one: every bit
    held = monitor.verdict
    monitor.close()
    dist.destroy_process_group()
    report = {
        "rank": rank,
        "exchange": type(exchange).__name__,
        "disabled": monitor.disabled,
        "named_at": named_at,
        "kind": str(held.kind) if held else None,
        "evidence": held.evidence if held else None,
        "named": sorted(monitor.named),
        "odd": sorted(odd),
        "parameters": parameters,
    }
    args.out.write_text(json.dumps(report))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_job(args: argparse.Namespace, fault: str, bad: int, at: int, steps: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as work:
        port = str(free_port())
        extra = [
            *("--fault", fault, "--bad-rank", str(bad), "--fault-at", str(at)),
            *("--steps", str(steps), "--step-s", str(args.step_s), "--device", args.device),
            *("--verdict-dir", str(Path(work) / "verdicts"), "--port", port),
        ]
        processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    *("--rank", str(rank), "--world", str(args.ranks)),
                    *("--out", str(Path(work) / f"rank{rank}.json")),
                    *extra,
                ],
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            for rank in range(args.ranks)
        ]
        for process in processes:
            if process.wait(timeout=600) != 0:
                raise SystemExit(f"a rank of the {fault} job failed")
        return [json.loads((Path(work) / f"rank{r}.json").read_text()) for r in range(args.ranks)]


def judge(fault: str, bad: int, at: int, reports: list[dict]) -> tuple[bool, str]:
    exchange = {r["exchange"] for r in reports}
    if any(r["disabled"] for r in reports):
        return False, f"the monitor turned off: {reports[0]['disabled']}"
    identical = len({tuple(r["parameters"]) for r in reports}) == 1
    verdicts = {r["rank"]: r["kind"] for r in reports if r["kind"]}
    if fault == "clean":
        ok = verdicts == {} and all(not r["odd"] for r in reports) and identical
        return ok, f"verdicts {verdicts}, replicas identical {identical}, exchange {exchange}"
    expected = {
        "slow": ("fail_slow", 30),
        "flip": ("replica_mismatch", REPLICA_INTERVAL + RECHECK),
        "miscompute": ("compute_mismatch", COMPUTE_INTERVAL + RECHECK),
    }[fault]
    named_at = reports[bad]["named_at"]
    delay = None if named_at is None else named_at - at
    ok = verdicts == {bad: expected[0]} and delay is not None and 0 < delay <= expected[1]
    if fault == "miscompute":
        ok = ok and identical  # wrong together: only the probe could tell
    if fault == "flip":
        ok = ok and not identical
    return ok, (
        f"rank {bad} from step {at}: verdicts {verdicts}, named {delay} steps later (bound "
        f"{expected[1]}), replicas identical {identical}; {reports[bad]['evidence']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world", type=int)
    parser.add_argument("--port")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--verdict-dir")
    parser.add_argument("--fault", default="clean")
    parser.add_argument("--bad-rank", type=int, default=-1)
    parser.add_argument("--fault-at", type=int, default=1 << 30)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args)
        return
    import torch

    print(f"# torch {torch.__version__}, {args.ranks} ranks, device {args.device}, gloo")
    passed = True
    for fault, steps in (("clean", 400), ("slow", 160), ("flip", 110), ("miscompute", 110)):
        bad, at = random.randrange(args.ranks), random.randrange(20, 50)
        started = time.monotonic()
        ok, detail = judge(fault, bad, at, run_job(args, fault, bad, at, steps))
        passed = passed and ok
        took = time.monotonic() - started
        print(f"{'PASS' if ok else 'FAIL'} {fault} ({steps} steps, {took:.0f} s): {detail}")
    print("PASS" if passed else "FAIL")
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
