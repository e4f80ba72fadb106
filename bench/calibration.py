"""The calibration table of docs/simulator.md ("Calibration"): the calibration scenarios
against the published figures their rates come from, seed 1, with the deep suite's
schedule as it is, off, and without its idle wait (the three columns of that table).

    .venv/bin/python bench/calibration.py        # about 1 min of CPU
"""

from __future__ import annotations

import time
from typing import Any

from gpuguard.sim.results import PolicyResult
from gpuguard.sim.run import simulate
from gpuguard.sim.scenario import build_scenario, bundled_scenario

VARIANTS: dict[str, dict[str, Any]] = {
    "schedule as it is": {},
    "no schedule": {"interval_h": None},
    "no idle wait": {"min_idle_s": 0},
}


def _run(name: str, deep: dict[str, Any], **changes: Any) -> PolicyResult:
    data = bundled_scenario(name).model_dump(by_alias=True)
    data["deep_checks"].update(deep)
    for key, value in changes.items():
        if key == "mix":
            data["jobs"]["mix"] = value
        elif key == "nodes":
            data["fleet"]["nodes"] = value
        elif key == "unattributed":
            data["failures"]["unattributed_per_1000_node_days"] = value
        else:
            data[key] = value
    scenario = build_scenario(data, f"calibration {name}")
    return simulate(scenario, policies=("gpuguard",)).results["gpuguard"]


def main() -> None:
    started = time.process_time()
    rows: dict[str, list[str]] = {
        "Llama 3: interruptions (419)": [],
        "Llama 3: ETTR (> 0.90)": [],
        "Llama 3: effective training time": [],
        "Llama 3: deep-suite runs": [],
        "RSC-1: job MTTF at 8 GPUs, days (47.7)": [],
        "RSC-1: job MTTF at 1,024 GPUs, h (7.9)": [],
        "16,384 GPUs: hardware job MTTF, h (1.8, projected)": [],
    }
    for deep in VARIANTS.values():
        llama = _run("llama3-16k", deep)
        rows["Llama 3: interruptions (419)"].append(str(llama.interruptions))
        rows["Llama 3: ETTR (> 0.90)"].append(f"{llama.ettr:.3f}")
        rows["Llama 3: effective training time"].append(f"{llama.effective:.3f}")
        rows["Llama 3: deep-suite runs"].append(f"{sum(llama.deep_runs.values()):,}")
        rsc = _run("meta-rsc1", deep)
        rows["RSC-1: job MTTF at 8 GPUs, days (47.7)"].append(f"{rsc.job_mttf_h[1] / 24:.1f}")
        rows["RSC-1: job MTTF at 1,024 GPUs, h (7.9)"].append(f"{rsc.job_mttf_h[128]:.2f}")
        # As tests/unit/test_sim_calibration.py: one 2,048-node job, hardware faults alone.
        largest = _run(
            "meta-rsc1",
            deep,
            days=12,
            warmup_days=0,
            nodes=2200,
            mix=[{"nodes": 2048, "share": 1.0, "hours": [100000, 100000]}],
            unattributed=0,
        )
        rows["16,384 GPUs: hardware job MTTF, h (1.8, projected)"].append(
            f"{largest.attributed_job_mttf_h[2048]:.2f}"
        )
    print("| figure (published) | " + " | ".join(VARIANTS) + " |")
    print("|---|" + "---:|" * len(VARIANTS))
    for label, cells in rows.items():
        print(f"| {label} | " + " | ".join(cells) + " |")
    print(f"\n{time.process_time() - started:.0f} s of CPU")


if __name__ == "__main__":
    main()
