"""In-job telemetry: its cost as a share of step time, and how soon it names a slow GPU.

Goals (issue 17): the telemetry costs under 0.5 % of step time; a 15 %-slow GPU is
detected in under 5 minutes of a job.

Method, real processes on loopback, in one run:

- overhead: an 8-rank synchronous NumPy job (each step: a 128x128 matrix product, then
  "device time" of ``--step-s`` seconds with 3 % jitter, a sleep as a GPU kernel leaves
  the CPU free, then the job's own all-gather of a 32-float gradient over loopback). The
  ranks run blocks of 48 steps alternately without and with the monitor (order off, on,
  on, off, ... so that a drift cancels), ``--pairs`` pairs. With the monitor, each step is
  timed, every 6 steps the ranks exchange their records (on the monitor's worker thread,
  as by default) and judge the tables that are back, and once a block
  (every 48 steps, about the default 50) they fingerprint 1 Mi float32 parameters and
  vote, and run the compute probe: one more step's compute (the product and the device
  time) whose 1 Mi float32 "gradients" they fingerprint and vote on (the default interval
  is 200 steps: that share scales by 48/200). Reported: the monitor's own time (every call
  into it, timed, but the probe's) over the step time, the probe's share (its compute and
  its round, timed), and the block-time ratio with over without (the side-by-side figure, noisier);
- detection: a 16-rank job of the same steps in which one rank is 15 % slower from a
  random step; the steps and seconds from that step to its verdict, ``--trials`` times.

Run: ``.venv/bin/python bench/in_job_overhead.py [--step-s 0.05] [--pairs 6] [--trials 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the host thread of a GPU job: one core

import numpy as np

from gpuguard.training import BackgroundExchange, JobMonitor, LoopbackExchange
from gpuguard.training.monitor import DEFAULT_COMPUTE_INTERVAL

BLOCK = 48
OVERHEAD_RANKS = 8
DETECTION_RANKS = 16


class Timed:
    """The monitor's calls, each timed: the monitor's own cost, whatever the step does."""

    def __init__(self, monitor: JobMonitor) -> None:
        self.monitor = monitor
        self.spent = 0.0
        self.by_call: dict[str, float] = {}

    def call(self, name: str, *args: object) -> None:
        started = time.perf_counter()
        getattr(self.monitor, name)(*args)
        took = time.perf_counter() - started
        if name != "check_compute":  # the probe's own step is reported on its own
            self.spent += took
        self.by_call[name] = self.by_call.get(name, 0.0) + took


def rank_main(args: argparse.Namespace) -> None:
    rank, world = args.rank, args.world
    allreduce = LoopbackExchange(rank, world, args.allreduce_port, timeout_s=60)
    monitor = JobMonitor(
        rank=rank,
        world_size=world,
        job="bench",
        node=f"node-{rank}",
        gpu="",
        verdict_dir=args.verdict_dir,
        replica_interval=BLOCK,
        compute_interval=BLOCK,
        exchange=BackgroundExchange(LoopbackExchange(rank, world, args.monitor_port)),
    )
    timed = Timed(monitor)
    noise = np.random.default_rng(rank)
    matrix = noise.standard_normal((128, 128))
    params = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    gradient = [0.0] * 32

    def probe() -> np.ndarray:
        """One step's compute on the probe batch: as costly as a step's own."""
        matrix @ matrix
        time.sleep(args.step_s)
        return params  # stands for gradients of the parameters' size

    blocks: list[dict[str, object]] = []
    step, named_at, named_wall, onset_wall = 0, None, None, None
    order = [False, True, True, False] * args.pairs
    for monitored in order[: 2 * args.pairs] if args.mode == "overhead" else [True] * args.blocks:
        timed.spent = 0.0
        started = time.perf_counter()
        for _ in range(BLOCK):
            if step == args.slow_from and rank == args.slow_rank:
                onset_wall = time.perf_counter()
            if monitored:
                timed.call("begin_step", step)
            matrix @ matrix  # the host's share of the step
            device_s = args.step_s * noise.lognormal(0.0, 0.03)
            if rank == args.slow_rank and step >= args.slow_from:
                device_s *= 1.15
            time.sleep(device_s)
            if monitored:
                timed.call("mark_communication")
            allreduce.all_gather(gradient)
            if monitored:
                timed.call("end_step")
                timed.call("check_replicas", step, {"w": params})
                timed.call("check_compute", step, probe)
            if monitor.verdict is not None and named_at is None:
                named_at, named_wall = step, time.perf_counter()
            step += 1
        blocks.append(
            {"monitored": monitored, "s": time.perf_counter() - started, "spent": timed.spent}
        )
    monitor.close()
    allreduce.close()
    result = {
        "blocks": blocks,
        "named_at": named_at,
        "named": sorted(monitor.named),
        "by_call": timed.by_call,
    }
    if named_wall is not None and onset_wall is not None:
        result["detect_s"] = named_wall - onset_wall
    args.out.write_text(json.dumps(result))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_job(world: int, extra: list[str], workdir: Path) -> list[dict[str, object]]:
    ports = [str(free_port()), str(free_port())]
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--rank",
                str(rank),
                "--world",
                str(world),
                "--allreduce-port",
                ports[0],
                "--monitor-port",
                ports[1],
                "--out",
                str(workdir / f"rank{rank}.json"),
                *extra,
            ]
        )
        for rank in range(world)
    ]
    for process in processes:
        if process.wait(timeout=900) != 0:
            raise SystemExit(f"a rank failed: {process.args}")
    return [json.loads((workdir / f"rank{r}.json").read_text()) for r in range(world)]


def overhead(step_s: float, pairs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as work:
        extra = ["--mode", "overhead", "--step-s", str(step_s), "--pairs", str(pairs)]
        reports = run_job(OVERHEAD_RANKS, extra, Path(work))
    shares, ratios = [], []
    for report in reports:
        blocks = report["blocks"]
        assert isinstance(blocks, list)
        on = [b for b in blocks if b["monitored"]]
        off = [b for b in blocks if not b["monitored"]]
        shares.append(sum(b["spent"] for b in on) / sum(b["s"] for b in on))
        ratios.extend(a["s"] / b["s"] for a, b in zip(on, off, strict=True))
    monitored_s = sum(b["s"] for r in reports for b in r["blocks"] if b["monitored"])
    calls = {name for r in reports for name in r["by_call"]}
    return {
        **{
            f"{name}_share": sum(r["by_call"].get(name, 0.0) for r in reports) / monitored_s
            for name in sorted(calls)
        },
        "self_share_median": statistics.median(shares),
        "self_share_max": max(shares),
        "block_ratio_median": statistics.median(ratios),
        "block_ratio_min": min(ratios),
        "block_ratio_max": max(ratios),
        "step_s_measured": statistics.median(
            b["s"] / BLOCK for r in reports for b in r["blocks"] if not b["monitored"]
        ),
    }


def detection(step_s: float, trials: int) -> list[dict[str, float]]:
    results = []
    for _ in range(trials):
        slow_rank, onset = random.randrange(DETECTION_RANKS), random.randrange(48, 120)
        with tempfile.TemporaryDirectory() as work:
            extra = [
                *("--mode", "detection", "--step-s", str(step_s), "--blocks", "4"),
                *("--slow-rank", str(slow_rank), "--slow-from", str(onset)),
                *("--verdict-dir", str(Path(work) / "verdicts")),
            ]
            reports = run_job(DETECTION_RANKS, extra, Path(work))
        slow = reports[slow_rank]
        named_at = slow["named_at"]
        assert isinstance(named_at, int), f"the slow rank {slow_rank} was not named"
        wrong = {rank for report in reports for rank in report["named"]} - {slow_rank}  # type: ignore[attr-defined]
        results.append(
            {
                "onset": onset,
                "steps": named_at - onset + 1,
                "seconds": float(slow["detect_s"]),  # type: ignore[arg-type]
                "others_named": len(wrong),
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world", type=int)
    parser.add_argument("--allreduce-port", type=int)
    parser.add_argument("--monitor-port", type=int)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--mode", choices=["overhead", "detection"])
    parser.add_argument("--blocks", type=int, default=0)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-from", type=int, default=1 << 30)
    parser.add_argument("--verdict-dir")
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args)
        return
    print(f"# {platform.node()} {os.cpu_count()} cpus, python {platform.python_version()}")
    cost = overhead(args.step_s, args.pairs)
    print(json.dumps({"overhead": cost}, indent=1))
    print(
        f"overhead: monitor's own time {100 * cost['self_share_median']:.3f} % of step time "
        f"(max over ranks {100 * cost['self_share_max']:.3f} %), blocks with/without "
        f"x{cost['block_ratio_median']:.4f} (range {cost['block_ratio_min']:.4f}-"
        f"{cost['block_ratio_max']:.4f}) at {cost['step_s_measured']:.4f} s/step"
    )
    probe = cost.get("check_compute_share", 0.0)
    print(
        f"compute probe (one step's compute and its round): every {BLOCK} steps"
        f" {100 * probe:.3f} % of step time, so every {DEFAULT_COMPUTE_INTERVAL} steps"
        f" {100 * probe * BLOCK / DEFAULT_COMPUTE_INTERVAL:.3f} %"
    )
    found = detection(args.step_s, args.trials)
    print(json.dumps({"detection": found}, indent=1))
    if not found:
        return
    steps = [f["steps"] for f in found]
    seconds = [f["seconds"] for f in found]
    print(
        f"detection of a 15 %-slow rank of {DETECTION_RANKS}: {min(steps)}-{max(steps)} steps "
        f"(median {statistics.median(steps)}), {min(seconds):.2f}-{max(seconds):.2f} s; "
        f"other ranks named: {sum(f['others_named'] for f in found)}"
    )


if __name__ == "__main__":
    main()
