"""The ``gpuguard simulate`` flags, apart from the simulator so ``--help`` stays cheap."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", type=Path, metavar="FILE", help="scenario YAML")
    parser.add_argument(
        "--policy-file", type=Path, metavar="FILE", help="remediation policy for the gpuguard run"
    )
    parser.add_argument("--seed", type=int, metavar="N", help="random seed (same seed, same run)")
    parser.add_argument("--nodes", type=int, metavar="N", help="fleet size (GPU-node slots)")
    parser.add_argument("--days", type=float, metavar="N", help="simulated days")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--html", type=Path, metavar="PATH", help="write the HTML report here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
