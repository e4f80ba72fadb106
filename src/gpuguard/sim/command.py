"""``gpuguard simulate``: run the scenario under every policy, print the comparison."""

from __future__ import annotations

import argparse
import sys
import time

from gpuguard.errors import ConfigError
from gpuguard.sim.html import render
from gpuguard.sim.report import table, to_json
from gpuguard.sim.run import remediation_policy, simulate
from gpuguard.sim.scenario import load_scenario


class _Progress:
    """A one-line bar on stderr, redrawn at most every tenth of a second."""

    def __init__(self) -> None:
        self._drawn = 0.0

    def __call__(self, policy: str, fraction: float) -> None:
        now = time.monotonic()
        if fraction < 1.0 and now - self._drawn < 0.1:
            return
        self._drawn = now
        filled = int(30 * fraction)
        bar = "#" * filled + "." * (30 - filled)
        end = "\n" if fraction >= 1.0 else ""
        print(f"\r{policy:<9} [{bar}] {100 * fraction:3.0f}%", end=end, file=sys.stderr, flush=True)


def run_simulate(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario).with_overrides(
        seed=args.seed, days=args.days, nodes=args.nodes
    )
    policy = remediation_policy(scenario, args.policy_file)
    show = not args.no_progress and sys.stderr.isatty()
    simulation = simulate(scenario, policy, progress=_Progress() if show else None)
    print(to_json(simulation) if args.json else table(simulation))
    if args.html is not None:
        try:
            args.html.parent.mkdir(parents=True, exist_ok=True)
            args.html.write_text(render(simulation))
        except OSError as exc:
            raise ConfigError(f"--html {args.html}: cannot write: {exc.strerror}") from None
        print(f"HTML report: {args.html.resolve()}", file=sys.stderr if args.json else sys.stdout)
    return 0
