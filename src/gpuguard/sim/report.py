"""The comparison as a terminal table and as one JSON object: the headline figures over
the seeds, replacements against where faults live, the first seed's detail, and the
targets check (``targets``)."""

from __future__ import annotations

import json
from collections.abc import Callable

from gpuguard.sim import gpu_report, in_job_report
from gpuguard.sim.formatting import grid, interval_text, metric_cell, metric_label, pct
from gpuguard.sim.results import SIZE_CLASSES, PolicyResult
from gpuguard.sim.run import Simulation
from gpuguard.sim.scenario import Scenario
from gpuguard.sim.sweep import METRICS, Interval
from gpuguard.sim.targets import TARGET_AVAILABILITY, TARGET_JOB_SUCCESS, targets, verdicts

# One row of the first seed's detail: its label, and its cell from a policy's result.
Row = tuple[str, Callable[[PolicyResult], str]]


def _rows() -> list[Row]:
    return [
        *_outcome_rows(),
        *gpu_report.rows(),
        *_repair_rows(),
        *in_job_report.rows(),
        *_cost_rows(),
        *_action_rows(),
    ]


def _outcome_rows() -> list[Row]:
    """Availability, job success, and the jobs' productive time."""
    return [
        ("GPU-node availability (physical)", lambda r: pct(r.gpu_node_availability)),
        ("GPU-node availability (slots)", lambda r: pct(r.slot_availability)),
        ("job success rate", lambda r: pct(r.job_success_rate)),
        (
            "  succeeded / failed / running",
            lambda r: "{succeeded} / {failed} / {unfinished}".format(**r.jobs),
        ),
        ("job success by GPU-hours of work", lambda r: pct(r.job_success_by_gpu_hours)),
        *(
            (f"  jobs of {label} GPUs: rate (failed / ended)", _size_cell(label))
            for _, label in SIZE_CLASSES
        ),
        ("ETTR (Meta: productive runtime / wall)", lambda r: f"{r.ettr:.4f}"),
        ("effective training time (slow time lost)", lambda r: f"{r.effective:.4f}"),
        ("  the same, a failed job's work lost", lambda r: f"{r.effective_failed_lost:.4f}"),
        (
            "ML goodput (Google): scheduling / runtime / program",
            lambda r: " / ".join(
                f"{v:.4f}"
                for v in (r.ml_goodput.scheduling, r.ml_goodput.runtime, r.ml_goodput.program)
            ),
        ),
        ("fleet goodput (useful / all GPU-hours)", lambda r: f"{r.goodput:.4f}"),
    ]


def _repair_rows() -> list[Row]:
    """How fast faults were found and fixed, and the hidden ones found."""
    return [
        ("MTTR, fault to back in service (h)", lambda r: f"{r.mttr_hours:.2f}"),
        (
            "time to detect p50 / p90 (min)",
            lambda r: _minutes(r.time_to_detect_h.p50, r.time_to_detect_h.p90),
        ),
        (
            "time to quarantine p50 / p90 (min)",
            lambda r: _minutes(r.time_to_quarantine_h.p50, r.time_to_quarantine_h.p90),
        ),
        (
            "time to repair p50 / p90 (h)",
            lambda r: f"{r.time_to_repair_h.p50:.2f} / {r.time_to_repair_h.p90:.2f}",
        ),
        ("false drains per node-day", lambda r: f"{r.false_drains_per_node_day:.5f}"),
        ("SDC found by checks / by jobs / all", lambda r: _hidden(r, "sdc")),
        ("fail-slow found by checks / all", lambda r: _hidden(r, "fail_slow")),
        (
            "  removed (repaired or replaced): SDC / fail-slow",
            lambda r: f"{r.hidden_faults['sdc'].removed} / {r.hidden_faults['fail_slow'].removed}",
        ),
    ]


def _cost_rows() -> list[Row]:
    """Deep runs, GPU-hours lost, and how often jobs were interrupted."""
    return [
        (
            "deep-suite runs: scheduled / verify (failed)",
            lambda r: "{} / {} ({})".format(
                *(r.deep_runs.get(k, 0) for k in ("schedule", "verify", "verify_failed"))
            ),
        ),
        (
            "GPU-hours lost (failed jobs, rollbacks, restarts, stalls)",
            lambda r: f"{gpu_hours_lost(r):,.0f}",
        ),
        (
            "  of which failed jobs' work",
            lambda r: f"{r.gpu_hours['failed_jobs_work']:,.0f}",
        ),
        ("  of which jobs waiting for deep runs", lambda r: f"{r.gpu_hours['deep_run_wait']:,.0f}"),
        ("GPU-hours out of service", lambda r: f"{r.gpu_hours['out_of_service']:,.0f}"),
        ("job interruptions", lambda r: str(r.interruptions)),
        (
            "  per 1,000 node-days of the jobs",
            lambda r: f"{r.interruptions_per_1000_node_days:.2f}",
        ),
        ("job MTTF (h) by nodes", _mttf_cell),
    ]


def _action_rows() -> list[Row]:
    """What the policy did to nodes and jobs, and its replacements against machine faults."""
    return [
        ("disruptive actions", lambda r: str(sum(r.actions.values()))),
        (
            "  kill job / drain",
            lambda r: f"{r.actions.get('kill_job', 0)} / {r.actions.get('drain', 0)}",
        ),
        (
            "  reset / reboot / replace",
            lambda r: " / ".join(str(r.actions.get(k, 0)) for k in ("reset", "reboot", "replace")),
        ),
        (
            "  by people: reboot / replace",
            lambda r: f"{r.actions.get('manual_reboot', 0)} / {r.actions.get('manual_replace', 0)}",
        ),
        ("breaker trips", lambda r: str(r.breaker_trips)),
        ("automatic replacements / machine faults (need new hardware)", _locus_cell),
        ("  replacements per machine fault; most per position in 7 d", _locus_ratio),
    ]


def _locus_cell(result: PolicyResult) -> str:
    locus = result.locus
    if locus is None:
        return "-"
    return f"{locus.replacements} / {locus.machine_faults} ({locus.machine_faults_replace})"


def _locus_ratio(result: PolicyResult) -> str:
    locus = result.locus
    if locus is None or locus.ratio is None:
        return "-"
    return f"{locus.ratio:.2f}; {locus.max_per_position_7d}"


# Replacements against where the faults live, over the seeds (issue 25): the figures the
# cap on automatic replacements is judged by, and false drains beside them.
LOCUS_METRICS: dict[str, Callable[[PolicyResult], float | None]] = {
    "automatic_replacements": lambda r: r.locus.replacements if r.locus else None,
    "machine_faults": lambda r: r.locus.machine_faults if r.locus else None,
    "machine_faults_needing_replace": lambda r: r.locus.machine_faults_replace if r.locus else None,
    "replacements_per_machine_fault": lambda r: r.locus.ratio if r.locus else None,
    "max_replacements_per_position_7d": lambda r: r.locus.max_per_position_7d if r.locus else None,
    "false_drains_per_node_day": lambda r: r.false_drains_per_node_day,
}


def locus_over_seeds(simulation: Simulation, name: str) -> dict[str, Interval | None]:
    """Each of ``LOCUS_METRICS`` for one policy: mean and 95 % interval over the seeds."""
    results = simulation.every_seed(name)
    out: dict[str, Interval | None] = {}
    for metric, value in LOCUS_METRICS.items():
        values = [v for v in map(value, results) if v is not None]
        out[metric] = Interval.of([float(v) for v in values], share=False) if values else None
    return out


def _locus_lines(simulation: Simulation) -> list[str]:
    names = list(simulation.results)
    over = {name: locus_over_seeds(simulation, name) for name in names}
    rows: list[tuple[str, list[str]]] = [("", names)]
    for metric in LOCUS_METRICS:
        digits = {"false_drains_per_node_day": 5, "replacements_per_machine_fault": 3}.get(
            metric, 1
        )
        cells = [interval_text(over[n][metric], 1.0, digits) for n in names]
        rows.append((metric.replace("_", " "), cells))
    title = "Replacements and where faults live, over the seeds: mean [95 % interval]"
    return [title, *grid(rows)]


def _size_cell(label: str) -> Callable[[PolicyResult], str]:
    def cell(result: PolicyResult) -> str:
        outcome = result.job_success_by_size[label]
        rate = outcome.rate
        ended = outcome.succeeded + outcome.failed
        return "-" if rate is None else f"{pct(rate)} ({outcome.failed} / {ended})"

    return cell


def _hidden(result: PolicyResult, cls: str) -> str:
    faults = result.hidden_faults[cls]
    by_jobs = f" / {faults.found_by_jobs}" if cls == "sdc" else ""  # only SDC shows in results
    return f"{faults.found_by_checks}{by_jobs} / {faults.faults}"


def _mttf_cell(result: PolicyResult) -> str:
    """Hours on the nodes per interruption, by job size (nodes: hours)."""
    return ", ".join(f"{n}: {h:,.0f}" for n, h in result.job_mttf_h.items()) or "-"


def _minutes(p50_h: float, p90_h: float) -> str:
    return f"{60 * p50_h:.1f} / {60 * p90_h:.1f}"


def gpu_hours_lost(result: PolicyResult) -> float:
    hours = result.gpu_hours
    lost = ("failed_jobs_work", "lost_work", "restarting", "deep_run_wait", "stalled_or_slow")
    return sum(hours[k] for k in lost)


def spread(simulation: Simulation) -> list[str]:
    """Each headline figure over the seeds: mean [95 % interval]; a trace replay adds the
    trace's own operations, as recorded."""
    names = list(simulation.results)
    over = {name: simulation.over_seeds(name) for name in names}
    trace = simulation.trace
    head = [*names, *(["as recorded"] if trace is not None else [])]
    rows: list[tuple[str, list[str]]] = [("", head)]
    for metric in METRICS:
        cells = [metric_cell(over[name][metric], metric) for name in names]
        if trace is not None:
            recorded = metric in ("slot_availability", "gpu_node_availability")
            cells.append(pct(trace.recorded_availability()) if recorded else "-")
        rows.append((metric_label(metric), cells))
    seeds = simulation.seeds
    title = f"Over {len(seeds)} seed(s) ({seeds[0]}-{seeds[-1]}): mean [95 % interval]"
    return [title, *grid(rows)]


def span_text(scenario: Scenario) -> str:
    """The days the figures cover, and the warm-up run before them and left out."""
    if scenario.warmup_days == 0:
        return f"{scenario.days:g} days"
    return (
        f"{scenario.days:g} days measured after a {scenario.warmup_days:g}-day warm-up (left out)"
    )


def table(simulation: Simulation) -> str:
    scenario = simulation.scenario
    names = list(simulation.results)
    source = f"trace {simulation.trace.name}" if simulation.trace else f"scenario {scenario.name}"
    header = [
        f"gpuguard simulate: {source}, {scenario.fleet.nodes} nodes x 8 GPUs,"
        f" {span_text(scenario)}",
        "",
        *spread(simulation),
        "",
        *_locus_lines(simulation),
        "",
        f"Seed {scenario.seed} in detail:",
    ]
    rows = [("", names)] + [
        (label, [value(simulation.results[n]) for n in names]) for label, value in _rows()
    ]
    lines = header + grid(rows) + ["", *targets(simulation)]
    in_job = in_job_report.lines(simulation)
    if in_job:
        lines += ["", *in_job]
    return "\n".join(lines)


def to_json(simulation: Simulation) -> str:
    return json.dumps(report_data(simulation), indent=2)


def report_data(simulation: Simulation) -> dict[str, object]:
    """``policies``: the first seed's results; ``over_seeds``: every figure's mean and
    95 % interval; ``seeds``: every seed's results."""
    scenario = simulation.scenario
    names = list(simulation.results)
    trace = simulation.trace
    return {
        "scenario": scenario.model_dump(mode="json", by_alias=True),
        "seed": scenario.seed,
        "seeds": simulation.seeds,
        "policy": simulation.policy.model_dump(mode="json"),
        "policies": {name: r.to_dict() for name, r in simulation.results.items()},
        "over_seeds": {
            name: {
                metric: (interval.to_dict() if interval is not None else None)
                for metric, interval in simulation.over_seeds(name).items()
            }
            for name in names
        },
        "locus_over_seeds": {
            name: {
                metric: (interval.to_dict() if interval is not None else None)
                for metric, interval in locus_over_seeds(simulation, name).items()
            }
            for name in names
        },
        "runs": [
            {"seed": seed, "policies": {n: r.to_dict() for n, r in run.items()}}
            for seed, run in zip(
                simulation.seeds, [simulation.results, *simulation.runs], strict=True
            )
        ],
        "trace": None
        if trace is None
        else {
            "name": trace.name,
            "nodes": trace.nodes,
            "days": trace.days,
            "faults": len(trace.records),
            "as_recorded": {"availability": trace.recorded_availability()},
        },
        "in_job": in_job_report.goals(simulation) if "gpuguard" in simulation.results else None,
        "targets": {
            "gpu_node_availability": TARGET_AVAILABILITY,
            "job_success_rate": TARGET_JOB_SUCCESS,
            "verdicts": verdicts(simulation),
            "findings": targets(simulation),
        },
    }
