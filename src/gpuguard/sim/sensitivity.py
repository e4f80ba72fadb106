"""One assumption changed at a time: what each moves (``gpuguard simulate --sensitivity``).

Every row runs the scenario with one input changed, on the same seeds as the base row, so
a row's difference from the base is that input's doing. The (row, seed) runs are
independent and deterministic, so they are spread over the machine's cores and gathered
in order (docs/simulator.md, "Sensitivity").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from gpuguard.remediation.policy import Policy
from gpuguard.sim.formatting import interval_text
from gpuguard.sim.results import PolicyResult
from gpuguard.sim.run import PER_GPU, POLICIES, PREFLIGHT, simulate
from gpuguard.sim.scenario import Scenario, build_scenario
from gpuguard.sim.scenario_gpu import DEFAULT_CATCH
from gpuguard.sim.sweep import Interval


@dataclass(frozen=True)
class Change:
    label: str
    sections: dict[str, dict[str, object]]  # scenario section -> keys it sets


BASE = Change("base (the scenario as given)", {})
CHANGES: tuple[Change, ...] = (
    BASE,
    Change("retry budget 2", {"jobs": {"retry_budget": 2}}),
    Change("retry budget 10", {"jobs": {"retry_budget": 10}}),
    Change("checkpoints every 30 min", {"jobs": {"checkpoint_interval_min": 30}}),
    Change("checkpoints every 120 min", {"jobs": {"checkpoint_interval_min": 120}}),
    Change("restart overhead 5 min", {"jobs": {"restart_overhead_min": 5}}),
    Change("restart overhead 30 min", {"jobs": {"restart_overhead_min": 30}}),
    Change("in-job false verdicts 0", {"in_job": {"false_verdicts_per_node_day": 0.0}}),
    Change(
        "in-job false verdicts 0.0015 (bound)",
        {"in_job": {"false_verdicts_per_node_day": 0.0015}},
    ),
    Change("in-job adoption 0.25", {"in_job": {"adoption": 0.25}}),
    Change("in-job adoption 1.0 (every job)", {"in_job": {"adoption": 1.0}}),
    Change("fabric faults node-local (1 per rack)", {"fleet": {"nodes_per_rack": 1}}),
    Change("fabric faults take 32 nodes", {"fleet": {"nodes_per_rack": 32}}),
    Change("hardware fault rate x0.5", {"failures": {"rate_multiplier": 0.5}}),
    Change("hardware fault rate x1.715 (RSC-1)", {"failures": {"rate_multiplier": 1.715}}),
    Change("a new fleet (age 0 days)", {"fleet": {"age_days": 0}}),
    Change("slow nodes noticed by people in 24 h", {"detection": {"slow_noticed_h": 24}}),
    Change("slow nodes never noticed by people", {"detection": {"slow_noticed_h": None}}),
)

# The inputs of the preflight gate and of per-GPU quarantine's workload, as ranges: rows
# run only when the gate or per-GPU quarantine is in the run (``changes``).
GPU_CHANGES: tuple[Change, ...] = (
    Change("preflight check 10 s", {"preflight": {"cost_s": 10.0}}),
    Change("preflight check 300 s", {"preflight": {"cost_s": 300.0}}),
    Change("preflight false failures 0", {"preflight": {"false_failure": 0.0}}),
    Change("preflight false failures 0.01", {"preflight": {"false_failure": 0.01}}),
    Change(
        "preflight catches half as often",
        {"preflight": {"catch": {k: v / 2 for k, v in DEFAULT_CATCH.items()}}},
    ),
    Change(
        "per-GPU quarantine up to replace",
        {"gpu_quarantine": {"up_to": "replace"}},
    ),
    Change("health polls every 10 min", {"detection": {"check_interval_s": 600.0}}),
    Change("sub-node jobs none", {"jobs": {"sub_node_share": 0.0}}),
    Change("sub-node jobs: half the 1-node jobs", {"jobs": {"sub_node_share": 0.5}}),
)


def changes(scenario: Scenario, policies: Sequence[str]) -> tuple[Change, ...]:
    """The rows for this run: ``GPU_CHANGES`` too when either feature is in it."""
    gpu = scenario.preflight.enabled or scenario.gpu_quarantine.enabled
    if gpu or PREFLIGHT in policies or PER_GPU in policies:
        return CHANGES + GPU_CHANGES
    return CHANGES


# What each row reports, per policy: (key, label, scale, decimals).
FIGURES: tuple[tuple[str, str, float, int], ...] = (
    ("job_success_by_gpu_hours", "success/GPU-h %", 100.0, 1),
    ("job_success_512", "512+ %", 100.0, 1),
    ("ettr", "ETTR", 1.0, 3),
    ("effective", "effective", 1.0, 3),
    ("slot_availability", "slots %", 100.0, 3),  # the target, 99.95 %, needs the third
    ("gpu_slot_availability", "GPU slots %", 100.0, 3),
)


def _figures(result: PolicyResult) -> dict[str, float | None]:
    largest = result.job_success_by_size["512+"].rate
    return {
        "job_success_by_gpu_hours": result.job_success_by_gpu_hours,
        "job_success_512": largest,
        "ettr": result.ettr,
        "effective": result.effective,
        "slot_availability": result.slot_availability,
        "gpu_slot_availability": result.gpu_slot_availability,
    }


def changed(scenario: Scenario, change: Change) -> Scenario:
    data = scenario.model_dump(by_alias=True)
    for section, keys in change.sections.items():
        data[section].update(keys)
    return build_scenario(data, origin=f"sensitivity row {change.label!r}")


def _one(
    scenario: Scenario, policy: Policy, policies: Sequence[str]
) -> dict[str, dict[str, float | None]]:
    run = simulate(scenario, policy, policies=policies)
    return {name: _figures(result) for name, result in run.results.items()}


@dataclass(frozen=True)
class Row:
    change: Change
    figures: dict[str, dict[str, Interval | None]]  # policy -> figure -> over the seeds


def sensitivity(
    scenario: Scenario,
    policy: Policy,
    *,
    seeds: int,
    policies: Sequence[str] = POLICIES,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Row]:
    """Every row of ``changes`` over ``seeds`` seeds from the scenario's."""
    rows = changes(scenario, policies)
    tasks = [
        (row, changed(scenario, change).with_overrides(seed=scenario.seed + offset))
        for row, change in enumerate(rows)
        for offset in range(seeds)
    ]
    gathered: list[list[dict[str, dict[str, float | None]]]] = [[] for _ in rows]
    workers = workers or os.cpu_count() or 1
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
        futures = [(row, pool.submit(_one, seeded, policy, policies)) for row, seeded in tasks]
        for done, (row, future) in enumerate(futures, start=1):
            gathered[row].append(future.result())
            if progress is not None:
                progress(done, len(futures))
    return [
        Row(change, {name: _over(runs, name) for name in policies})
        for change, runs in zip(rows, gathered, strict=True)
    ]


def _over(runs: list[dict[str, dict[str, float | None]]], name: str) -> dict[str, Interval | None]:
    out: dict[str, Interval | None] = {}
    for key, *_ in FIGURES:
        values = [v for run in runs if (v := run[name][key]) is not None]
        out[key] = Interval.of(values) if values else None
    return out


def table(rows: list[Row], seeds: Sequence[int]) -> str:
    """The rows as text: one line per change and policy."""
    policies = list(rows[0].figures) if rows else []
    header = ["change", "policy", *(label for _, label, *_ in FIGURES)]
    lines = [header]
    for row in rows:
        for i, name in enumerate(policies):
            cells = [
                interval_text(row.figures[name][key], scale, digits)
                for key, _, scale, digits in FIGURES
            ]
            lines.append([row.change.label if i == 0 else "", name, *cells])
    widths = [max(len(line[c]) for line in lines) for c in range(len(header))]
    text = [
        "  ".join(
            cell.ljust(w) if c < 2 else cell.rjust(w)
            for c, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    ]
    first, last = seeds[0], seeds[-1]
    title = (
        f"Sensitivity: one assumption changed per row (seeds {first}-{last}, mean [95 % interval])"
    )
    return "\n".join([title, *text])


def to_dict(rows: list[Row], seeds: Sequence[int]) -> dict[str, object]:
    return {
        "seeds": list(seeds),
        "rows": [
            {
                "change": row.change.label,
                "scenario": row.change.sections,
                "policies": {
                    name: {k: (v.to_dict() if v is not None else None) for k, v in figures.items()}
                    for name, figures in row.figures.items()
                },
            }
            for row in rows
        ],
    }
