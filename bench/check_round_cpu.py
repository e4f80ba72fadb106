"""CPU time of one round of every check on a bundle, in-process (imports done first), as
the agent's check loops spend it every ``check_interval_s``: the part of the agent's idle
CPU its checks account for.

Run: ``.venv/bin/python bench/check_round_cpu.py [--bundle examples/healthy-h100]
[--rounds 10]``. Results go in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import resource
from pathlib import Path

from gpuguard.checks.registry import FALLBACKS, default_checks
from gpuguard.config import Config
from gpuguard.runner import run_all
from gpuguard.sources import BundleSources

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=EXAMPLES / "healthy-h100")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    config, sources = Config(expected_gpus=8), BundleSources(args.bundle)
    run_all(default_checks(), sources, config, FALLBACKS)  # imports and first reads
    start = cpu_s()
    for _ in range(args.rounds):
        run_all(default_checks(), sources, config, FALLBACKS)
    per_round_ms = 1000 * (cpu_s() - start) / args.rounds
    print(f"{args.bundle.name}: {per_round_ms:.1f} ms of CPU per round (mean of {args.rounds})")
    print(f"at a 30 s check interval: {100 * per_round_ms / 30_000:.3f} % of one core")


if __name__ == "__main__":
    main()
