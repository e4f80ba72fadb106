"""CPU time of one round of every check on a bundle, in-process (imports done first), as
the agent's check loops spend it every ``check_interval_s``: the part of the agent's idle
CPU its checks account for. Each check runs as the agent runs it (``runner.RepeatingCheck``,
one instance kept across rounds), one after another, so each one's share can be told.

Run: ``.venv/bin/python bench/check_round_cpu.py [--bundle examples/healthy-h100]
[--rounds 10]``. Results go in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import resource
from pathlib import Path

from gpuguard.checks.base import CheckContext
from gpuguard.checks.registry import default_checks
from gpuguard.config import Config
from gpuguard.runner import RepeatingCheck
from gpuguard.sources import BundleSources

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)  # every thread's
    return used.ru_utime + used.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=EXAMPLES / "healthy-h100")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    config, sources = Config(expected_gpus=8), BundleSources(args.bundle)
    runners = [
        RepeatingCheck(check, CheckContext(sources, config, config.timeout_for(check.name)))
        for check in default_checks()
    ]
    for runner in runners:  # imports and first reads
        runner.run_once()
    spent = dict.fromkeys((r.check.name for r in runners), 0.0)
    for _ in range(args.rounds):
        for runner in runners:
            start = cpu_s()
            runner.run_once()
            spent[runner.check.name] += cpu_s() - start
    per_round_ms = 1000 * sum(spent.values()) / args.rounds
    print(f"{args.bundle.name}: {per_round_ms:.1f} ms of CPU per round (mean of {args.rounds})")
    print(f"at a 30 s check interval: {100 * per_round_ms / 30_000:.3f} % of one core")
    for name, seconds in sorted(spent.items(), key=lambda item: -item[1]):
        print(f"  {name:<16}{1000 * seconds / args.rounds:6.2f} ms")


if __name__ == "__main__":
    main()
