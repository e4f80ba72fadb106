"""``gpuguard simulate``: run the scenario under every policy, print the comparison."""

from __future__ import annotations

import argparse
import json
import sys

from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.errors import ConfigError
from gpuguard.sim.html import render
from gpuguard.sim.report import report_data, table
from gpuguard.sim.run import (
    PER_GPU,
    POLICIES,
    PREFLIGHT,
    WITHOUT_IN_JOB,
    remediation_policy,
    simulate,
)
from gpuguard.sim.scenario import Scenario, build_scenario, load_scenario
from gpuguard.sim.sensitivity import sensitivity
from gpuguard.sim.sensitivity import table as sensitivity_table
from gpuguard.sim.sensitivity import to_dict as sensitivity_dict
from gpuguard.sim.trace_files import load_trace


class _Progress:
    """A one-line bar on stderr, redrawn at most every tenth of a second."""

    def __init__(self) -> None:
        self._drawn = 0.0

    def __call__(self, policy: str, fraction: float) -> None:
        now = SYSTEM_CLOCK.monotonic()
        if fraction < 1.0 and now - self._drawn < 0.1:
            return
        self._drawn = now
        filled = int(30 * fraction)
        bar = "#" * filled + "." * (30 - filled)
        end = "\n" if fraction >= 1.0 else ""
        print(f"\r{policy:<9} [{bar}] {100 * fraction:3.0f}%", end=end, file=sys.stderr, flush=True)


class _Count:
    """Runs done of the sensitivity rows, on one line of stderr."""

    def __call__(self, done: int, total: int) -> None:
        end = "\n" if done == total else ""
        print(f"\rsensitivity {done}/{total} runs", end=end, file=sys.stderr, flush=True)


# The version of `gpuguard simulate --json`'s document (docs/simulator.md).
SIMULATE_SCHEMA = "gpuguard.io/simulate/v1"


def _options(scenario: Scenario, args: argparse.Namespace) -> Scenario:
    """The scenario with the command line's switches and figures, validated."""
    if args.no_in_job:
        scenario = scenario.with_in_job(False)
    data = scenario.model_dump(by_alias=True)
    given = {
        ("gpu_quarantine", "enabled"): args.per_gpu_quarantine or None,
        ("preflight", "enabled"): args.preflight or None,
        ("preflight", "cost_s"): args.preflight_cost_s,
        ("preflight", "false_failure"): args.preflight_false_failure,
        ("jobs", "sub_node_share"): args.sub_node_share,
    }
    for (section, key), value in given.items():
        if value is not None:
            data[section][key] = value
    return build_scenario(data, origin="command line")


def run_simulate(args: argparse.Namespace) -> int:
    base = load_scenario(args.scenario)
    scenario = base.with_overrides(
        seed=args.seed, days=args.days, warmup_days=args.warmup_days, nodes=args.nodes
    )
    if scenario.jobs.mix != base.jobs.mix:
        print(
            f"gpuguard: --nodes {args.nodes}: the job mix is scaled to the fleet"
            f" ({base.mix_summary()} -> {scenario.mix_summary()})",
            file=sys.stderr,
        )
    scenario = _options(scenario, args)
    policy = remediation_policy(scenario, args.policy_file)
    policies = (*POLICIES, WITHOUT_IN_JOB) if args.compare_in_job else POLICIES
    policies = (*policies, PER_GPU, PREFLIGHT) if args.compare_gpu else policies
    trace = load_trace(args.trace) if args.trace is not None else None
    show = not args.no_progress and sys.stderr.isatty()
    progress = _Progress() if show else None
    simulation = simulate(scenario, policy, policies=policies, progress=progress, seeds=args.seeds)
    replay = None
    if trace is not None:
        replay = simulate(
            scenario,
            policy,
            policies=policies,
            progress=progress,
            seeds=args.trace_seeds,
            trace=trace,
        )
    rows = None
    if args.sensitivity:
        count = _Count() if show else None
        rows = sensitivity(scenario, policy, seeds=args.seeds, policies=policies, progress=count)
    seeds = simulation.seeds
    if args.json:
        data = {"schema": SIMULATE_SCHEMA, **report_data(simulation)}
        data["trace_replay"] = report_data(replay) if replay is not None else None
        data["sensitivity"] = sensitivity_dict(rows, seeds) if rows is not None else None
        print(json.dumps(data, indent=2))
    else:
        print(table(simulation) + (f"\n\n{table(replay)}" if replay is not None else ""))
        if rows is not None:
            print(f"\n{sensitivity_table(rows, seeds)}")
    if args.html is not None:
        try:
            args.html.parent.mkdir(parents=True, exist_ok=True)
            shown = sensitivity_table(rows, seeds) if rows is not None else None
            args.html.write_text(render(simulation, replay, shown))
        except OSError as exc:
            raise ConfigError(f"--html {args.html}: cannot write: {exc.strerror}") from None
        print(f"HTML report: {args.html.resolve()}", file=sys.stderr if args.json else sys.stdout)
    return 0
