"""What each part and input of the in-job path moves (docs/simulator.md, "In-job
detection"): the gpuguard run at 1,000 nodes x 90 measured days, one change per row,
seeds 1-5, the (row, seed) runs spread over the cores.

    .venv/bin/python bench/in_job_levers.py      # about 10 min of CPU
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from gpuguard.sim.in_job_report import pooled
from gpuguard.sim.results import PolicyResult
from gpuguard.sim.run import simulate
from gpuguard.sim.scenario import build_scenario, load_scenario

SEEDS = 5
ROWS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("defaults (adoption 0.5, false verdicts 0.0003)", {}),
    ("every job on the telemetry (adoption 1.0)", {"adoption": 1.0}),
    ("no compute probe (probe_steps 0)", {"probe_steps": 0}),
    ("no change rule (change_ratio null)", {"change_ratio": None}),
    ("probe rounds show SDC at 0.2", {"sdc_probe_round_share": 0.2}),
    ("probe rounds show SDC at 1.0", {"sdc_probe_round_share": 1.0}),
    ("no SDC reaches parameters (sdc_parameter_share 0)", {"sdc_parameter_share": 0.0}),
    ("steps of 1 s (step_s 1)", {"step_s": 1.0}),
    ("false verdicts 0.001 per node-day", {"false_verdicts_per_node_day": 0.001}),
)


def _one(changes: dict[str, Any], seed: int) -> PolicyResult:
    data = load_scenario().model_dump(by_alias=True)
    data.update(days=90, seed=seed)
    data["fleet"]["nodes"] = 1000
    data["in_job"].update(changes)
    scenario = build_scenario(data, "in-job levers")
    return simulate(scenario, policies=("gpuguard",)).results["gpuguard"]


def _cells(results: list[PolicyResult]) -> list[str]:
    cells = []
    for cls in ("fail_slow", "sdc"):
        found = pooled(results, cls)
        share = found.found_share
        cells.append("-" if share is None else f"{100 * share:.1f} %")
        median = found.time_to_detect_h
        cells.append(f"{60 * median.p50:.1f}" if median.count else "-")
    effective = sum(r.effective for r in results) / len(results)
    drains = sum(r.false_drains_per_node_day for r in results) / len(results)
    replaced = sum(r.actions.get("replace", 0) for r in results) / len(results)
    return [*cells, f"{effective:.4f}", f"{drains:.5f}", f"{replaced:.0f}"]


def main() -> None:
    started = time.time()
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = [
            [pool.submit(_one, changes, seed) for seed in range(1, SEEDS + 1)]
            for _, changes in ROWS
        ]
        header = (
            "| change | fail-slow found | p50 min | SDC found | p50 min | effective"
            " | false drains / node-day | replacements / seed |"
        )
        print(header)
        print("|---|" + "---:|" * 7)
        for (label, _), row in zip(ROWS, futures, strict=True):
            results = [future.result() for future in row]
            print(f"| {label} | " + " | ".join(_cells(results)) + " |", flush=True)
    print(f"\n{time.time() - started:.0f} s on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
