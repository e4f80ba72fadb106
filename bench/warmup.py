"""How long the default scenario takes to settle (docs/simulator.md, "Steady state"): the
same figures measured over the first month, the second, and the rest of a 395-day run,
each window after a warm-up of the days before it, seeds 1-5.

    .venv/bin/python bench/warmup.py        # about 1 min of CPU
"""

from __future__ import annotations

import time

from gpuguard.sim.run import POLICIES, simulate
from gpuguard.sim.scenario import load_scenario
from gpuguard.sim.sweep import Interval

WINDOWS = ((0.0, 30.0), (30.0, 30.0), (60.0, 335.0))  # (warm-up days, measured days)
FIGURES = (
    ("slot availability %", "slot_availability", 100.0, 3),
    ("effective training time", "effective", 1.0, 3),
    ("ETTR", "ettr", 1.0, 3),
    ("job interruptions per 1,000 node-days", "interruptions_per_1000_node_days", 1.0, 1),
)


def main() -> None:
    started = time.process_time()
    names = " / ".join(POLICIES)
    print("| days | " + " | ".join(f"{label} ({names})" for label, *_ in FIGURES) + " |")
    print("|---|" + "---:|" * len(FIGURES))
    for warmup, days in WINDOWS:
        scenario = load_scenario().with_overrides(warmup_days=warmup, days=days)
        runs = simulate(scenario, seeds=5)
        cells = [f"{warmup:g}-{warmup + days:g}"]
        for _, key, scale, digits in FIGURES:
            means = [
                scale * Interval.of([getattr(r, key) for r in runs.every_seed(policy)]).mean
                for policy in POLICIES
            ]
            cells.append(" / ".join(f"{m:.{digits}f}" for m in means))
        print("| " + " | ".join(cells) + " |", flush=True)
    print(f"\n{time.process_time() - started:.0f} s of CPU")


if __name__ == "__main__":
    main()
