"""Wall time of a full ``gpuguard check --bundle`` on each example bundle.

Runs the real command as a subprocess (interpreter start-up and imports included, as an
operator would see it) RUNS times per bundle and reports the median, next to the time of a
bare ``python -c pass`` start-up measured in the same run, so the ratio stays meaningful on
a noisy machine. Also prints the per-check durations from one ``--json`` run.

Run: ``.venv/bin/python bench/check_bundle.py``. Results go in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
BUNDLES = ("healthy-h100", "xid79-fallen-off-bus", "ib-link-half-rate")
EXPECT = ["--expected-gpus", "1", "--expected-nics", "3", "--expected-link-gbps", "400"]
RUNS = 10


def median_seconds(argv: list[str]) -> float:
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=False)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    python = median_seconds([sys.executable, "-c", "pass"])
    print(f"python start-up alone: {python * 1000:.0f} ms (median of {RUNS})")
    print(f"{'bundle':<24}{'check ms':>10}{'vs start-up':>13}   per-check ms (in-process)")
    for name in BUNDLES:
        argv = [sys.executable, "-m", "gpuguard.cli", "check", "--bundle", str(EXAMPLES / name)]
        wall = median_seconds([*argv, *EXPECT])
        report = json.loads(
            subprocess.run([*argv, *EXPECT, "--json"], capture_output=True, text=True).stdout
        )
        checks = ", ".join(f"{c['check']} {c['duration_s'] * 1000:.0f}" for c in report["checks"])
        print(f"{name:<24}{wall * 1000:>10.0f}{wall / python:>12.1f}x   {checks}")


if __name__ == "__main__":
    main()
