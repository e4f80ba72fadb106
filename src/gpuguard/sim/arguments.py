"""The ``gpuguard simulate`` flags, apart from the simulator so ``--help`` stays cheap."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_SEEDS = 5


def _seeds(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", type=Path, metavar="FILE", help="scenario YAML")
    parser.add_argument(
        "--policy-file", type=Path, metavar="FILE", help="remediation policy for the gpuguard run"
    )
    parser.add_argument("--seed", type=int, metavar="N", help="first random seed (same, same run)")
    parser.add_argument(
        "--seeds",
        type=_seeds,
        default=DEFAULT_SEEDS,
        metavar="N",
        help=f"seeds from --seed; figures are a mean and 95 %% interval (default {DEFAULT_SEEDS})",
    )
    parser.add_argument(
        "--trace",
        metavar="FILE",
        help="also replay a fault trace (CSV, StepFun JSON, or 'infinitehbd', bundled)",
    )
    parser.add_argument(
        "--trace-seeds",
        type=_seeds,
        default=1,
        metavar="N",
        help="seeds for the trace replay (they draw its workload and fixes; default 1)",
    )
    parser.add_argument("--nodes", type=int, metavar="N", help="fleet size (GPU-node slots)")
    parser.add_argument(
        "--days", type=float, metavar="N", help="measured days (the scenario's days)"
    )
    parser.add_argument(
        "--warmup-days",
        type=float,
        metavar="N",
        help="days run first and left out of the figures (the scenario's warmup_days)",
    )
    parser.add_argument(
        "--no-in-job",
        action="store_true",
        help="turn the in-job detection path off (scenario in_job.enabled: false)",
    )
    parser.add_argument(
        "--compare-in-job",
        action="store_true",
        help="also run gpuguard without the in-job path, side by side",
    )
    parser.add_argument(
        "--sensitivity",
        action="store_true",
        help="also run one assumption changed per row (retry budget, checkpoints, restart"
        " overhead, in-job false verdicts and adoption, fabric blast radius, fault rate, fleet"
        " age) over the same seeds, on every core",
    )
    _gpu_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--html", type=Path, metavar="PATH", help="write the HTML report here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _gpu_arguments(parser: argparse.ArgumentParser) -> None:
    """Per-GPU quarantine and the preflight gate (docs/simulator.md)."""
    parser.add_argument(
        "--per-gpu-quarantine",
        action="store_true",
        help="gpuguard takes a GPU-local fault's GPU out alone (gpu_quarantine.enabled)",
    )
    parser.add_argument(
        "--preflight", action="store_true", help="gpuguard checks each node at each job start"
    )
    parser.add_argument(
        "--preflight-cost-s",
        type=float,
        metavar="S",
        help="seconds the preflight check holds each start (preflight.cost_s, default 60)",
    )
    parser.add_argument(
        "--preflight-false-failure",
        type=float,
        metavar="P",
        help="chance it fails a healthy node (preflight.false_failure, default 0.002)",
    )
    parser.add_argument(
        "--sub-node-share",
        type=float,
        metavar="P",
        help="share of 1-node jobs asking for 1-7 GPUs (jobs.sub_node_share, default 0)",
    )
    parser.add_argument(
        "--compare-gpu",
        action="store_true",
        help="also run gpuguard with per-GPU quarantine, and with the preflight gate, side by side",
    )
