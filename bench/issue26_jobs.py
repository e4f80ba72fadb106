"""Issue 26: do jobs pay for the infrastructure? Job success of 512+ GPU jobs and by
GPU-hour, gpuguard (attribution, crash memory, warm spares) beside reactive with the
Jobs' podFailurePolicy on DisruptionTarget, then the sensitivity to the attribution's
coverage and error rate and crash memory's window (docs/simulator.md, "Jobs that do not
pay for the infrastructure").

    .venv/bin/python bench/issue26_jobs.py              # everything (minutes)
    .venv/bin/python bench/issue26_jobs.py --seeds 3    # fewer seeds
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from gpuguard.sim.run import REACTIVE_PFP, Simulation, simulate
from gpuguard.sim.scenario import Scenario, build_scenario, load_scenario
from gpuguard.sim.sweep import Interval
from gpuguard.sim.trace_files import load_trace

COMPARED = (REACTIVE_PFP, "gpuguard")
META_UNATTRIBUTED = 6.5  # per 1,000 node-days, Kokolis et al. (scenario key below)


def _scenario(days: float, **sections: dict[str, Any]) -> Scenario:
    data = load_scenario().model_dump(by_alias=True)
    data["days"] = days
    for name, values in sections.items():
        if isinstance(data[name], dict):
            data[name].update(values)
        else:
            data[name] = values
    return build_scenario(data, "bench")


def _cell(interval: Interval | None) -> str:
    if interval is None:
        return "-"
    return f"{100 * interval.mean:.2f} [{100 * interval.low:.2f}, {100 * interval.high:.2f}] %"


def _rows(title: str, simulation: Simulation, names: tuple[str, ...]) -> None:
    print(f"\n{title} (seeds {simulation.seeds[0]}-{simulation.seeds[-1]})")
    for name in names:
        over = simulation.over_seeds(name)
        runs = simulation.every_seed(name)
        failed = sum(r.jobs["failed"] for r in runs)
        suspicions = statistics.fmean(r.crash_suspicions_per_node_day for r in runs)
        false = statistics.fmean(r.false_suspicions_per_node_day for r in runs)
        spares = statistics.fmean(r.spares_taken for r in runs)
        judged: dict[str, int] = {}
        for r in runs:
            for key, count in r.attribution.items():
                judged[key] = judged.get(key, 0) + count
        print(
            f"  {name:<13} 512+ {_cell(over['job_success_512+_gpus'])}"
            f" | by GPU-hour {_cell(over['job_success_by_gpu_hours'])}"
            f" | per job {_cell(over['job_success_rate'])}"
            f" | ETTR {_cell(over['ettr'])}"
            f" | failed jobs {failed}"
            f" | suspicions/node-day {suspicions:.2e} (false {false:.2e})"
            f" | spares taken/seed {spares:.0f}"
            f" | attribution {dict(sorted(judged.items()))}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--sensitivity-seeds", type=int, default=5)
    parser.add_argument("--days", type=float, default=365.0)
    args = parser.parse_args()
    started = time.process_time()
    meta = {"unattributed_per_1000_node_days": META_UNATTRIBUTED}

    base = _scenario(args.days)
    _rows("default, 256 nodes", simulate(base, policies=COMPARED, seeds=args.seeds), COMPARED)
    at_meta = _scenario(args.days, failures=meta)
    _rows(
        f"unattributed {META_UNATTRIBUTED}",
        simulate(at_meta, policies=COMPARED, seeds=args.seeds),
        COMPARED,
    )
    trace = load_trace("infinitehbd")
    replay = simulate(load_scenario(), policies=COMPARED, seeds=args.seeds, trace=trace)
    _rows("StepFun trace (400 nodes, 349 days)", replay, COMPARED)

    # What each part and each input moves, gpuguard only, at Meta's unattributed rate.
    seeds = args.sensitivity_seeds
    variants: dict[str, dict[str, dict[str, Any]]] = {
        "no warm spares": {"fleet": {"spares_per_pool": 0}},
        "crash memory off": {"gpuguard_policy": {"crashes": {"enabled": False}}},
        "crash memory window 7 d": {"gpuguard_policy": {"crashes": {"window_s": 7 * 86400}}},
        "signature share 0": {"attribution": {"signature_share": 0.0}},
        "signature share 0.6": {"attribution": {"signature_share": 0.6}},
        **{
            f"coverage {c}, error rate {e}": {"attribution": {"coverage": c, "error_rate": e}}
            for c, e in ((0.8, 0.02), (0.9, 0.02), (0.99, 0.02), (0.95, 0.0), (0.95, 0.1))
        },
    }
    for label, sections in variants.items():
        scenario = _scenario(args.days, failures=meta, **sections)
        _rows(label, simulate(scenario, policies=("gpuguard",), seeds=seeds), ("gpuguard",))
    print(f"\nCPU {time.process_time() - started:.0f} s")


if __name__ == "__main__":
    main()
