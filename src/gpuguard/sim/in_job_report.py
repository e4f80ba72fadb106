"""The in-job path's figures (issue 17): who found the persistent fail-slow and SDC GPUs,
how soon, how many verdicts were false, and what the path gained against the gpuguard run
without it, pooled over the seeds and checked against the goals."""

from __future__ import annotations

from collections.abc import Callable

from gpuguard.sim.results import Distribution, FoundBy, PolicyResult
from gpuguard.sim.run import WITHOUT_IN_JOB, Simulation

GOAL_FOUND = 0.90  # of persistent fail-slow GPUs, and of SDC
GOAL_DETECT_H = 0.5  # median time to detect
GOAL_FALSE_PER_NODE_DAY = 0.001
CLASSES = (("fail_slow", "persistent fail-slow"), ("sdc", "SDC"))


def _found(cls: str) -> Callable[[PolicyResult], str]:
    def cell(result: PolicyResult) -> str:
        f = result.hidden_faults[cls].persistent
        return f"{f.in_job} / {f.deep_suite} / {f.passive} / {f.missed} of {f.faults}"

    return cell


def _detect(cls: str) -> Callable[[PolicyResult], str]:
    def cell(result: PolicyResult) -> str:
        d = result.hidden_faults[cls].persistent.time_to_detect_h
        return f"{60 * d.p50:.1f} / {60 * d.p90:.1f} ({d.count})" if d.count else "-"

    return cell


def rows() -> list[tuple[str, Callable[[PolicyResult], str]]]:
    """The per-seed detail rows."""
    out: list[tuple[str, Callable[[PolicyResult], str]]] = []
    for cls, label in CLASSES:
        out.append((f"{label}: in job / deep / passive / missed", _found(cls)))
        out.append(("  time to detect p50 / p90 (min) (onsets)", _detect(cls)))
    out.append(
        ("in-job false verdicts per node-day", lambda r: f"{r.false_verdicts_per_node_day:.5f}")
    )
    return out


def pooled(results: list[PolicyResult], cls: str) -> FoundBy:
    """One class's counts summed over the seeds, the times to detect taken together."""
    parts = [r.hidden_faults[cls].persistent for r in results]
    values = sorted(v for p in parts for v in p.time_to_detect_h.values)
    return FoundBy(
        sum(p.in_job for p in parts),
        sum(p.deep_suite for p in parts),
        sum(p.passive for p in parts),
        sum(p.missed for p in parts),
        sum(p.removed_unnamed for p in parts),
        Distribution.of(values),
    )


def goals(simulation: Simulation) -> dict[str, object]:
    """The goals' figures for the gpuguard run over every seed, and each verdict."""
    results = simulation.every_seed("gpuguard")
    data: dict[str, object] = {}
    for cls, _ in CLASSES:
        found = pooled(results, cls)
        share, median = found.found_share, found.time_to_detect_h
        data[cls] = {
            **found.to_dict(),
            "found_share_goal_met": share is not None and share >= GOAL_FOUND,
            # None: no fault began during the run, so no time from onset to judge
            "median_detect_goal_met": median.p50 < GOAL_DETECT_H if median.count else None,
        }
    node_days = simulation.scenario.fleet.nodes * simulation.scenario.days * len(results)
    false_rate = sum(r.false_verdicts_per_node_day for r in results) / len(results)
    data["false_verdicts_per_node_day"] = false_rate
    data["false_verdicts_goal_met"] = false_rate < GOAL_FALSE_PER_NODE_DAY
    data["node_days"] = node_days
    if WITHOUT_IN_JOB in simulation.results:
        without = simulation.every_seed(WITHOUT_IN_JOB)
        data["with_vs_without"] = {
            metric: {
                "with": sum(getattr(r, metric) for r in results) / len(results),
                "without": sum(getattr(r, metric) for r in without) / len(without),
            }
            for metric in ("effective", "effective_failed_lost", "goodput")
        }
    return data


def lines(simulation: Simulation) -> list[str]:
    """The summary under the table: the goals, and with against without the path."""
    if "gpuguard" not in simulation.results:
        return []
    data = goals(simulation)
    seeds = len(simulation.seeds)
    config = simulation.scenario.in_job
    state = "on" if config.enabled else "OFF (--no-in-job)"
    out = [f"In-job detection (gpuguard run, {seeds} seed(s) pooled; the path is {state}):"]
    for cls, label in CLASSES:
        figures = data[cls]
        assert isinstance(figures, dict)
        share = figures["found_share"]
        shown = "-" if share is None else f"{100 * share:.1f} %"
        detect = figures["time_to_detect_hours"]
        assert isinstance(detect, dict)
        timing = (
            f"p50 {60 * detect['p50']:.1f} min, p90 {60 * detect['p90']:.1f} min"
            if detect["count"]
            else "none to time"
        )
        out.append(
            f"- {label}: {figures['faults']} GPUs, found {shown} (in job"
            f" {figures['found_in_job']}, deep suite {figures['found_by_deep_suite']}, passive"
            f" {figures['found_by_passive_telemetry']}; missed {figures['missed']}, of which"
            f" {figures['missed_but_removed_otherwise']} taken away unnamed, by a repair for"
            f" another fault or by people): goal >= {100 * GOAL_FOUND:.0f} %"
            f" {_met(figures['found_share_goal_met'])}; time to detect from onset (of the"
            f" {detect['count']} named that began in the run) {timing}: goal p50 <"
            f" {60 * GOAL_DETECT_H:.0f} min"
            f" {_met(figures['median_detect_goal_met'])}"
        )
    out.append(
        f"- in-job false verdicts: {data['false_verdicts_per_node_day']:.5f} per node-day"
        f" (the scenario's in_job.false_verdicts_per_node_day"
        f" {config.false_verdicts_per_node_day:g}, an input): goal <"
        f" {GOAL_FALSE_PER_NODE_DAY:g} {_met(data['false_verdicts_goal_met'])}"
    )
    compared = data.get("with_vs_without")
    if isinstance(compared, dict):
        parts = [
            f"{label} {v['with']:.4f} vs {v['without']:.4f}"
            for label, v in (
                ("effective training time", compared["effective"]),
                ("the same, a failed job's work lost", compared["effective_failed_lost"]),
                ("goodput", compared["goodput"]),
            )
        ]
        out.append(f"- with vs without the in-job path ({WITHOUT_IN_JOB}): " + "; ".join(parts))
    else:
        out.append("- --compare-in-job adds the gpuguard run without the path, side by side")
    return out


def _met(met: object) -> str:
    return "not settled" if met is None else "met" if met else "MISSED"
